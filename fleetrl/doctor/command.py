"""`fleetrl doctor [config]` and the preflight `fleetrl train` runs before starting.

Exit codes: 0 every check passed (warnings and skips allowed); 3 at least one check failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from fleetrl import exit_codes
from fleetrl.doctor.context import Context
from fleetrl.doctor.options import GIB, DoctorOptions
from fleetrl.doctor.output import as_json, check_line, summary_line, write_json
from fleetrl.doctor.registry import CHECK_NAMES, CHECKS, run_checks
from fleetrl.doctor.result import Status


def add_doctor_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of `fleetrl doctor` (the parser `command_doctor` expects)."""
    defaults = DoctorOptions()
    parser.description = "Preflight checks; each prints PASS/FAIL/WARN/SKIP and, on failure, a fix."
    parser.epilog = "checks: " + "; ".join(
        f"{spec.name}{'' if spec.fast else ' (full only)'}: {spec.about}" for spec in CHECKS
    )
    parser.add_argument("config", nargs="?", help="YAML config file (default: built-in defaults)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. cluster.num_nodes=2")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--fast", action="store_true", help="only the cheap checks (the ones `fleetrl train` runs first)"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=CHECK_NAMES,
        metavar="CHECK",
        help=f"run only this check (repeatable): {', '.join(CHECK_NAMES)}",
    )
    parser.add_argument(
        "--node", type=int, default=defaults.node, help="this machine's node index in the cluster (default 0, the head)"
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="another endpoint that must be reachable from here (repeatable)",
    )
    seconds_and_thresholds = (
        ("--max-used-percent", defaults.max_used_percent, "fail a directory whose filesystem is this full"),
        ("--min-free-gib", defaults.min_free_bytes / GIB, "fail a directory with less free space, in GiB"),
        ("--connect-timeout", defaults.connect_timeout, "seconds per TCP connect"),
        ("--handshake-timeout", defaults.handshake_timeout, "seconds for the Gloo/NCCL handshake, start-up included"),
        ("--env-timeout", defaults.env_timeout, "seconds to build, reset and step the env"),
    )
    for flag, default, text in seconds_and_thresholds:
        parser.add_argument(flag, type=float, default=default, help=f"{text} (default %(default)g)")
    parser.add_argument(
        "--handshake-processes",
        type=int,
        default=None,
        metavar="N",
        help="ranks to spawn for the handshake (default: the actor's ranks on this node, at least 2)",
    )
    return parser


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
    return DoctorOptions(
        max_used_percent=args.max_used_percent,
        min_free_bytes=int(args.min_free_gib * GIB),
        node=args.node,
        connect_timeout=args.connect_timeout,
        peers=tuple(args.peer),
        handshake_timeout=args.handshake_timeout,
        handshake_processes=args.handshake_processes,
        env_timeout=args.env_timeout,
    )


def command_doctor(args: argparse.Namespace) -> int:
    """`fleetrl doctor`: load the config (a bad one is a UserError, exit 2), run the checks."""
    from fleetrl.plan.load import load_config

    config = load_config(args.config, args.overrides)
    return run_doctor(config, json_output=args.json, fast=args.fast, options=options_from_args(args), only=args.only)


def run_doctor(
    config: Any,
    *,
    json_output: bool,
    fast: bool,
    options: DoctorOptions | None = None,
    only: Iterable[str] | None = None,
    quiet: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Run the checks (the fast subset when `fast`), print them, return OK or CHECK_FAILED (a FAIL).

    Text output prints each line as its check finishes; `quiet` prints only FAIL and WARN lines
    and, when something failed, the summary.
    """
    stream = stream or sys.stdout
    context = Context(config, options or DoctorOptions())
    start = time.monotonic()

    def show(check):
        if not json_output and (not quiet or check.status in (Status.FAIL, Status.WARN)):
            print(check_line(check), file=stream, flush=True)

    checks = run_checks(context, fast=fast, only=only, on_result=show)
    seconds = time.monotonic() - start
    code = exit_codes.CHECK_FAILED if any(check.failed for check in checks) else exit_codes.OK
    if json_output:
        write_json(stream, as_json(checks, fast, seconds, code))
    elif not quiet or code:
        print(summary_line(checks, fast, seconds), file=stream, flush=True)
    return code


def preflight(config: Any, options: DoctorOptions | None = None) -> int:
    """What `fleetrl train` runs before starting: the fast checks, quietly, on stderr.

    Returns 0 to go ahead, or 3 after saying why the run will not start.
    """
    code = run_doctor(config, json_output=False, fast=True, options=options, quiet=True, stream=sys.stderr)
    if code:
        print(
            "fleetrl train: not starting, a preflight check failed (see above; "
            "`fleetrl doctor <config>` runs every check). Pass --skip-doctor to start anyway.",
            file=sys.stderr,
            flush=True,
        )
    return code

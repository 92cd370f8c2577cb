"""The `fleetrl` command: train | sft | record | sweep | eval | report | doctor | diagnose | top | stack.

Exit codes: fleetrl/exit_codes.py (what each means: its `MEANINGS`). `train` runs under a
supervisor (supervise/supervisor.py), which returns them for the whole run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import sys
from pathlib import Path

from fleetrl import exit_codes, signals
from fleetrl.doctor import add_doctor_arguments, command_doctor, preflight
from fleetrl.errors import UserError
from fleetrl.stdout_guard import stdout_to_stderr
from fleetrl.watch.respond import IncidentStop


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetrl", description="Distributed RL that never freezes silently.")
    parser.add_argument("--version", action="version", version=f"fleetrl {installed_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    for name, help_text in (
        ("train", "train from a YAML config (RL)"),
        ("sft", "the supervised stage from a YAML config (e.g. behaviour cloning on demonstrations)"),
    ):
        train = commands.add_parser(name, help=help_text)
        train.add_argument("config", help="YAML config file")
        train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.lr=3e-4")
        train.add_argument(
            "--dry-run", action="store_true", help="check the config, print the resolved placement, start nothing"
        )
        train.add_argument("--skip-doctor", action="store_true", help="start even if a preflight check fails")

    record = commands.add_parser(
        "record", help="record a scripted expert's demonstrations of a config's env as a LeRobotDataset (v3.0)"
    )
    record.add_argument("config", help="YAML config file (its env section)")
    record.add_argument("overrides", nargs="*", help="dotted overrides, e.g. env.kwargs.tasks=[reach]")
    record.add_argument("--episodes", type=int, required=True, help="successful episodes to keep")
    record.add_argument("--out", required=True, help="a new folder: the LeRobotDataset v3.0 (meta/, data/)")
    record.add_argument("--seed", type=int, default=0, help="the first reset seed (then seed + 1, ...)")
    record.add_argument(
        "--per-task", action="store_true", help="keep --episodes episodes of each of the env's tasks (task_names)"
    )
    record.add_argument(
        "--task-episodes",
        default=None,
        metavar="TASK=N,...",
        help="with --per-task: these tasks' counts instead of --episodes, e.g. door-open-v3=3,window-open-v3=3",
    )

    sweep = commands.add_parser(
        "sweep",
        help="train every combination of key=v1,v2 overrides, on Ray Tune",
        description="Each combination is a full `fleetrl train` run in runs/sweep-<name>-<time>/. "
        "Top-level commas separate a key's values: runner.seed=1,2,3 model.hidden_sizes=[64,64],[128,128].",
    )
    sweep.add_argument("config", help="YAML config file")
    sweep.add_argument("overrides", nargs="*", help="key=value (every trial) or key=v1,v2,... (swept)")
    sweep.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="at most this many trials at once (default: as resources allow)",
    )
    sweep.add_argument("--address", default=None, help="a running Ray cluster (default: a new local Ray instance)")
    sweep.add_argument("--status-interval", type=float, default=30.0, help="seconds between status lines")
    sweep.add_argument("--skip-doctor", action="store_true", help="start each trial even if a preflight check fails")

    init_model = commands.add_parser(
        "init-model", help="write a randomly initialised Hugging Face VLA folder (nothing downloaded)"
    )
    init_model.add_argument("out", help="the folder to write (model, processor, tokenizer)")
    init_model.add_argument(
        "--family",
        default="paligemma",
        help="a family with a builder: paligemma, smolvlm (the table: docs/guides/vla.md, Families)",
    )
    init_model.add_argument("--size", default="tiny", help="tiny (tests, CPU), or the family's real size: 3b | 2b")
    init_model.add_argument(
        "--config",
        default=None,
        help="instead of --family/--size: any config.json, random weights in its exact shapes "
        "(the processor and tokenizer files beside it are copied)",
    )
    init_model.add_argument("--action-bins", type=int, default=256, help="action tokens at the end of the vocabulary")
    init_model.add_argument("--seed", type=int, default=0, help="seed of the random weights")

    export = commands.add_parser("export", help="a run's Hugging Face VLA (LoRA merged) as a standard folder")
    export.add_argument("run_dir", help="the run directory")
    export.add_argument("out", help="the folder to write")

    evaluate = commands.add_parser(
        "eval", help="mean return (and success per task) of a run's saved policy, written to <run>/eval/"
    )
    evaluate.add_argument("run_dir", help="the run's directory (its newest intact checkpoint is played)")
    evaluate.add_argument(
        "overrides",
        nargs="*",
        help="env keys changed for the evaluation, e.g. env.kwargs.instructions=held_out, and "
        "model.token_readout=expected",
    )
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes to play (Atari: whole games)")
    evaluate.add_argument(
        "--stochastic",
        action="store_true",
        help="sample actions instead of the deterministic action (model.token_readout)",
    )
    evaluate.add_argument("--seed", type=int, default=10_000, help="the eval envs' seed (env i gets seed + i)")
    evaluate.add_argument("--video", action="store_true", help="write <run>/video/episode.gif")
    evaluate.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object, alone on stdout (what the env prints goes to stderr)",
    )

    report = commands.add_parser("report", help="write PNG plots into the run directory")
    report.add_argument("run_dir", help="the run's directory")

    diagnose = commands.add_parser("diagnose", help="print the incident report of a run")
    diagnose.add_argument("run_dir", help="the run's directory")
    top = commands.add_parser("top", help="a live table of a running job's workers")
    top.add_argument("run_dir", nargs="?", help="the run's directory (default: the newest under ./runs)")
    top.add_argument("--once", action="store_true", help="print one table and exit (also when not a terminal)")
    stack = commands.add_parser("stack", help="every worker's Python stack now, without stopping the run")
    stack.add_argument("run_dir", nargs="?", help="the run's directory (default: the newest under ./runs)")
    add_doctor_arguments(
        commands.add_parser("doctor", help="preflight checks: disk, network, Gloo/NCCL, placement, env")
    )
    return parser


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip recorded it)."""
    try:
        return importlib.metadata.version("fleetrl")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run from a source tree; pip install . records a version)"


def command_train(args) -> int:
    from fleetrl.plan.layout import dry_run_text
    from fleetrl.plan.load import load_unchecked
    from fleetrl.plan.resolve import resolve
    from fleetrl.run_dir import resume_dir

    plan = resolve(load_unchecked(args.config, args.overrides), args.command)
    config = plan.config
    if config.runner.init_from is not None and resume_dir(config) is None:
        from fleetrl.checkpoint import initial_weights

        # a bad path: exit 2 now, naming it. A resume never reads it (its checkpoint holds the
        # weights and the KL's reference), so a start folder moved or deleted since does not stop one
        initial_weights(config.runner.init_from)
    if args.dry_run:
        print(dry_run_text(plan.layout))
        return exit_codes.OK
    if not args.skip_doctor and (code := preflight(config)):
        return code
    from fleetrl.supervise.janitor import start_janitor
    from fleetrl.supervise.supervisor import supervise

    janitor = start_janitor()  # from here on, nothing of the run outlives this process, even a SIGKILL of it
    return supervise(plan, janitor)


def command_record(args) -> int:
    from fleetrl.algos.registry import SECTIONS
    from fleetrl.config.loader import build_config, read_config
    from fleetrl.envs.recorder import parse_task_episodes, record

    if args.episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {args.episodes}")
    task_episodes = parse_task_episodes(args.task_episodes) if args.task_episodes is not None else None
    # Only the env section is used, type-checked as it is built: the algorithm's rules (a
    # supervised stage's demonstrations folder, which this command is about to write) are not checked.
    config = build_config(read_config(args.config, args.overrides), SECTIONS)
    recording = record(
        config.env,
        args.episodes,
        Path(args.out),
        args.seed,
        args.per_task,
        task_episodes,
        lambda line: print(line, file=sys.stderr),
    )
    print(f"{recording.summary(args.episodes)} in {args.out}")
    return exit_codes.OK


def command_sweep(args) -> int:
    from fleetrl.sweep.grid import plan_sweep

    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UserError(f"--max-concurrent must be a positive integer, got {args.max_concurrent}")
    plan = plan_sweep(args.config, args.overrides)  # every combination checked before anything starts
    from fleetrl.sweep.driver import run_sweep

    flags = ("--skip-doctor",) if args.skip_doctor else ()
    return run_sweep(plan, args.max_concurrent, args.address, flags, args.status_interval)


def command_eval(args) -> int:
    from fleetrl.evaluate import evaluate, task_table

    run_dir = Path(args.run_dir)
    with stdout_to_stderr() if args.json else contextlib.nullcontext():  # stdout: the JSON alone
        result = evaluate(
            run_dir,
            args.episodes,
            not args.stochastic,
            args.seed,
            run_dir / "video" if args.video else None,
            args.overrides,
        )
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['episodes']} {result['unit']}s: return {result['mean']:.2f} ± {result['std']:.2f} "
            f"(min {result['min']:.2f}, max {result['max']:.2f})"
        )
        if "success_rate" in result:
            print(f"success {result['success_rate']:.3f}")
        if table := task_table(result):
            print(table)
    print(f"fleetrl: wrote {result['written']}", file=sys.stderr)
    return exit_codes.OK


def command_init_model(args) -> int:
    from fleetrl.models.hf.init_model import init_from_config, init_model

    if args.config is not None:
        print(f"wrote {init_from_config(Path(args.config), Path(args.out), args.seed)}")
    else:
        print(f"wrote {init_model(args.family, args.size, Path(args.out), args.action_bins, args.seed)}")
    return exit_codes.OK


def command_export(args) -> int:
    from fleetrl.export import export_run

    print(f"wrote {export_run(Path(args.run_dir), Path(args.out))}")
    return exit_codes.OK


def command_report(args) -> int:
    from fleetrl.plots import write_plots

    for path in write_plots(Path(args.run_dir)):
        print(f"wrote {path}")
    return exit_codes.OK


def command_diagnose(args) -> int:
    from fleetrl.watch.reporting.hang_report import REPORT_TEXT

    path = Path(args.run_dir) / REPORT_TEXT
    if not path.is_file():
        raise UserError(
            f"{args.run_dir} has no {REPORT_TEXT}: the run had no incident (or is not a fleetrl run directory)"
        )
    print(path.read_text())
    return exit_codes.OK


def command_top(args) -> int:
    from fleetrl.tools.top import top

    return top(args.run_dir, args.once)


def command_stack(args) -> int:
    from fleetrl.tools.stack import stack

    return stack(args.run_dir)


COMMANDS = {
    "train": command_train,
    "sft": command_train,  # the same run; the plan checks the algorithm against the command
    "record": command_record,
    "sweep": command_sweep,
    "eval": command_eval,
    "init-model": command_init_model,
    "export": command_export,
    "report": command_report,
    "doctor": command_doctor,
    "diagnose": command_diagnose,
    "top": command_top,
    "stack": command_stack,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse stops collecting positional overrides at the first option: take the rest too.
    stray = [item for item in extra if item.startswith("-") or "=" not in item]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return COMMANDS[args.command](args)
    except UserError as error:
        print(f"fleetrl: {error}", file=sys.stderr)
        return exit_codes.USER_ERROR
    except IncidentStop:  # the report is written and printed; every worker is gone
        return exit_codes.INCIDENT
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (signals.py)
        code = signals.exit_code(interrupt)
        print(f"fleetrl: stopped by {exit_codes.stop_signal(code).name}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())

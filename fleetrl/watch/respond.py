"""What happens once an incident is known: stacks, report, teardown, exit — in that order.

The last complete checkpoint is already on disk (checkpoints are atomic), so nothing is saved
here: a stuck or dead worker could not be asked for its state anyway. The report records when the
incident was detected (`reported_at`) and, once the teardown is over, when every process of the
run but this one had ended (`ended_at`): the promise is every process gone within
`TEARDOWN_PROMISE_S` of detection (docs/concepts/incidents.md).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from fleetrl import exit_codes
from fleetrl.checkpoint import list_checkpoints
from fleetrl.probe.stack_requests import StackAsker
from fleetrl.probe.stacks import capture_stacks, py_spy_dump
from fleetrl.teardown import kill_own_children
from fleetrl.watch.incident import Incident
from fleetrl.watch.reporting.hang_report import (
    REPORT_JSON,
    REPORT_TEXT,
    build_hang_report,
    record_end,
    write_hang_report,
)

log = logging.getLogger("fleetrl")
# Every process of the run ends within this many seconds of an incident's detection: the stacks,
# the report and the teardown included (a loaded host's margin aside; docs/concepts/incidents.md).
TEARDOWN_PROMISE_S = 10.0
SUBPROCESS_STACK_TIMEOUT_S = 2.0  # py-spy's read of one subprocess a stalled call waits on (~0.3 s; within the promise)
STACKED_SUBPROCESSES = 2  # of those, the first this many have their stacks read (within the response's bound)


def subprocess_stack(pid: int, command: str) -> str:
    """The Python stack of a worker's subprocess, read from outside by py-spy where it runs on this
    machine (its command line is the one its worker published) and is a Python process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            here = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(not on this machine, or gone)"
    if not here.startswith(command):
        return "(not on this machine, or gone)"
    stack = py_spy_dump(pid, SUBPROCESS_STACK_TIMEOUT_S, "--nonblocking")
    if stack:
        return stack
    # py-spy also fails on some Python processes (one whose command line is not UTF-8): say which
    return (
        "(no Python stack: py-spy could not read it)" if runs_python(pid) else "(no Python stack: not a Python process)"
    )


def runs_python(pid: int) -> bool:
    """Whether process `pid` runs a Python interpreter: its executable is one, or it maps libpython."""
    try:
        if os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python"):
            return True
        with open(f"/proc/{pid}/maps", "rb") as maps:
            return b"libpython" in maps.read()
    except OSError:
        return False


class IncidentStop(Exception):
    """Raised in the main thread once an incident is reported and every worker is gone; the CLI
    turns it into `exit_codes.INCIDENT`."""

    def __init__(self, report: dict):
        super().__init__(f"{report['cause']}: {report['summary']}")
        self.report = report


class Responder:
    """Reports the first incident of a run and ends it; later callers wait for that one.

    Whichever thread gets here first (the watchdog's, or the main thread with a worker's error)
    writes hang_report.{json,txt}, prints the text and ends every worker process tree. Then the
    main thread raises IncidentStop; the watchdog's thread (`exit_process`: the main thread may
    be stuck for good) ends this process with `exit_codes.INCIDENT`. A second caller waits on `done`: it
    raises the same IncidentStop once the first has finished, or the process ends under it.

    Report hooks (`add_report_hook`: the trackers attaching the report to their runs) run once the
    report is written and before the teardown, each in a daemon thread given its own bound: the
    exit waits for them no longer than that, whatever they do."""

    def __init__(self, run_dir: Path):
        self.run_dir: Path = Path(run_dir)
        self.claimed: threading.Lock = threading.Lock()
        self.done: threading.Event = threading.Event()
        self.report: dict = {}
        self.report_hooks: list[tuple[Callable[[list[Path]], None], float]] = []
        self.ask_stacks: StackAsker | None = None  # through the heartbeat store, once it is open

    def add_report_hook(self, hook: Callable[[list[Path]], None], timeout_s: float) -> None:
        """Call `hook([hang_report.txt, hang_report.json])` on an incident, for at most `timeout_s`."""
        self.report_hooks.append((hook, timeout_s))

    def run_report_hooks(self, folder: Path) -> None:
        paths = [folder / REPORT_TEXT, folder / REPORT_JSON]
        for hook, timeout_s in self.report_hooks:
            thread = threading.Thread(target=hook, args=(paths,), name="fleetrl-report-hook", daemon=True)
            thread.start()
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("a report hook (%s) did not finish within %g s: exiting without it", hook, timeout_s)

    def respond(
        self, incident: Incident, workers: list[dict], kill_remote=lambda: None, exit_process: bool = False
    ) -> NoReturn:
        if not self.claimed.acquire(blocking=False):
            self.done.wait()
            raise IncidentStop(self.report)
        self.report = {"cause": incident.cause, "summary": incident.summary}
        detected_at = time.time()  # taking the stacks is part of the response, not of the detection
        folder = None
        try:
            stacks = capture_stacks(
                [{**incident.records.get((w["component"], w["rank"]), {}), **w} for w in workers],
                self.run_dir / "stacks",
                self.ask_stacks,
            )
            for process in incident.waits_on[:STACKED_SUBPROCESSES]:  # what a stalled call waits on
                process["stack"] = subprocess_stack(process["pid"], process["command"])
            checkpoints = list_checkpoints(self.run_dir)
            newest = checkpoints[-1] if checkpoints else None
            self.report = build_hang_report(incident, workers, stacks, detected_at, newest)
            text, folder = write_hang_report(self.run_dir, self.report)
            print(text, file=sys.stderr)
            log.error("%s: %s (report: %s)", incident.cause, self.report["summary"], folder / REPORT_TEXT)
            self.run_report_hooks(folder)
        finally:
            kill_remote()
            kill_own_children()
            if folder is not None:  # the teardown's end beside the detection, for the reader and the tests
                record_end(folder, time.time())
            if exit_process:
                sys.stdout.flush()
                sys.stderr.flush()
                logging.shutdown()
                os._exit(exit_codes.INCIDENT)
            self.done.set()
        raise IncidentStop(self.report)

"""What happens once an incident is known: stacks, report, teardown, exit — in that order.

The last complete checkpoint is already on disk (checkpoints are atomic), so nothing is saved
here: a stuck or dead worker could not be asked for its state anyway.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

from fleetrl.watch.hang_report import build_hang_report, write_hang_report
from fleetrl.watch.stacks import capture_stacks
from fleetrl.watch.teardown import kill_own_children
from fleetrl.watch.watchdog import Incident

log = logging.getLogger("fleetrl")
EXIT_INCIDENT = 4
_responding = threading.Lock()


class IncidentStop(Exception):
    """Raised in the main thread once an incident is reported and every worker is gone; the CLI
    turns it into exit code 4."""

    def __init__(self, report: dict):
        super().__init__(f"{report['cause']}: {report['summary']}")
        self.report = report


def respond(
    incident: Incident, run_dir: Path, workers: list[dict], kill_remote=lambda: None, exit_process: bool = False
) -> None:
    """Write hang_report.{json,txt}, print the text, end every worker process tree; then raise
    IncidentStop, or with `exit_process` (the watchdog thread, whose main thread may be stuck
    for good) end this process with exit code 4. Only the first incident is reported: a second
    caller waits here until the first one is done."""
    if not _responding.acquire(blocking=False):
        time.sleep(3600)
    report = {"cause": incident.cause, "summary": incident.summary}
    try:
        stacks = capture_stacks(
            [{**w, "pid": incident.records.get((w["component"], w["rank"]), {}).get("pid")} for w in workers],
            Path(run_dir) / "stacks",
        )
        report = build_hang_report(incident, workers, stacks, time.time())
        text = write_hang_report(run_dir, report)
        print(text, file=sys.stderr)
        log.error("%s: %s (report: %s)", incident.cause, report["summary"], Path(run_dir) / "hang_report.txt")
    finally:
        kill_remote()
        kill_own_children()
        if exit_process:
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(EXIT_INCIDENT)
    raise IncidentStop(report)

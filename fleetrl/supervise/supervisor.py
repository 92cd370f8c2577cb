"""`fleetrl train`'s own process: the supervisor. It does no training work, so nothing a simulator,
a model or a file system does can freeze it.

It opens the run (run_dir.open_run), starts the controller (fleetrl/controller/) as its child in a
process group of its own (a terminal's Ctrl-C reaches only the supervisor), hosts the heartbeat
store and watches the controller from its first instant, then the workers the controller
publishes (watch/supervision.py). It is a child subreaper: Ray's daemons orphaned by a killed controller become
its children, so its teardown (`attempt.kill_run_tree`) is complete whatever state the controller is
in. Every incident — seen by its watchdog, sent by the controller, or the controller's own death —
is reported here and ends the whole tree; with `runner.max_restarts` the
controller is then started again from the newest intact checkpoint (supervise/restarts.py).

Exit codes (fleetrl/exit_codes.py): the controller's OK or USER_ERROR; INCIDENT after an incident
that does not restart; `stopped_by` the signal after Ctrl-C / SIGTERM (the first asks the
controller to checkpoint and stop within `watchdog.stop_grace_s`, a second kills everything at
once).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from fleetrl import exit_codes
from fleetrl.checkpoint import newest_intact
from fleetrl.probe.child_activity import become_subreaper
from fleetrl.probe.seal import new_run_secret
from fleetrl.supervise.attempt import Attempt, closing_message, kill_run_tree
from fleetrl.supervise.restarts import Restart, RestartPolicy
from fleetrl.watch.supervision import Incident, keep_report, record_restarts

if TYPE_CHECKING:
    from fleetrl.plan.run_plan import RunPlan
    from fleetrl.supervise.janitor import Janitor

log = logging.getLogger("fleetrl")


class Supervisor:
    def __init__(self, plan: RunPlan, run_dir: Path, component: str, janitor: Janitor):
        self.plan, self.config = plan, plan.config
        self.run_dir, self.component = Path(run_dir), component
        self.janitor = janitor  # kept alive by each attempt (supervise/janitor.py)
        self.policy = RestartPolicy.of(plan.config.runner)
        self.signals: list[int] = []
        self.secret = new_run_secret()  # the controller inherits it (FLEETRL_RUN_SECRET): probe/seal.py

    def run(self) -> int:
        """Supervise the controller until the run ends; the exit code."""
        if not become_subreaper():
            log.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: orphans of a killed controller may outlive the run")
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)
        restart = None
        while True:
            code, incident = Attempt(self, restart).run()
            refusal = self.policy.refusal(incident.cause, time.time()) if incident else "no incident"
            if incident is None or refusal is not None:
                if incident is not None and self.policy.max_restarts:
                    log.error("not restarting: %s", refusal)
                if incident is not None and self.policy.done:  # every attempt in the last report
                    record_restarts(self.run_dir, [asdict(r) for r in self.policy.done], refusal)
                self.record_restarts_in_summary()
                return code
            restart = self.keep_report_and_restart(incident)

    def on_signal(self, signum: int, frame) -> None:
        self.signals.append(signum)
        if len(self.signals) > 1:
            print(f"fleetrl: second {signal.Signals(signum).name}: stopping now", file=sys.stderr, flush=True)
            kill_run_tree(self.config)  # (an isolated simulation's namespaces too: none left for the next start)
            code = exit_codes.stopped_by(self.signals[0])
            print(closing_message(self.run_dir, code), file=sys.stderr, flush=True)
            os._exit(code)

    def keep_report_and_restart(self, incident: Incident) -> dict:
        number = len(self.policy.done) + 1
        kept = keep_report(self.run_dir, number)
        self.policy.done.append(Restart(number, incident.cause, incident.started, str(kept[0] if kept else "")))
        resume = newest_intact(self.run_dir)
        log.warning(
            "restart %d (runner.max_restarts=%d) after %s: %s (report kept as %s)",
            number,
            self.policy.max_restarts,
            incident.cause,
            f"continuing from {resume.name}" if resume else "no checkpoint yet, starting over",
            ", ".join(path.name for path in kept) or "none",
        )
        return {"number": number, "cause": incident.cause, "incident_at": incident.started}

    def record_restarts_in_summary(self) -> None:
        """summary.json (written by the last controller, if it finished) gets the restarts: how
        many, their causes, and what each cost (from the metrics of the iteration after it)."""
        from fleetrl.run_dir import SUMMARY_FILE
        from fleetrl.tracking.jsonl import read_metrics

        path = self.run_dir / SUMMARY_FILE
        if not self.policy.done or not path.is_file():
            return
        summary = json.loads(path.read_text())
        summary["restarts"] = len(self.policy.done)
        summary["restart_causes"] = [restart.cause for restart in self.policy.done]
        summary["restart_s"] = [r["restart_s"] for r in read_metrics(self.run_dir) if "restart_s" in r]
        path.write_text(json.dumps(summary, indent=2))


def supervise(plan: RunPlan, janitor: Janitor) -> int:
    """Run `plan` under a supervisor: open the run (run_dir.open_run: a new run directory, its
    config saved; or the one runner.resume names), then supervise its controller; the exit code."""
    from fleetrl.run_dir import open_run

    run_dir, _ = open_run(plan.config)
    code = Supervisor(plan, run_dir, "inline" if plan.layout.backend == "inline" else "controller", janitor).run()
    # Every process of the run is gone: what is left is this interpreter's exit, whose final
    # garbage collections walk every object the imports made (torch's) — 1.5-4 s measured on a
    # loaded host after an incident, added to its teardown. Frozen, they are skipped.
    gc.freeze()
    if code == exit_codes.OK:
        print(f"run directory: {run_dir}")
    return code

"""What a trial's files say once it has ended: its record in `sweep.json`.

A trial finished iff its `fleetrl train` exited 0. The returns and the steps and seconds to
`runner.target_return` come from the run's own `summary.json` and `metrics.jsonl` (the same files
`fleetrl report` reads); the cause of a failure from its hang report when it has one (an
incident, exit 4), else from the last line its command printed (a config error, a doctor check,
a traceback).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from fleetrl import exit_codes
from fleetrl.run_dir import SUMMARY_FILE
from fleetrl.sweep.trial import TrialSpec
from fleetrl.tracking.jsonl import read_metrics
from fleetrl.watch.reporting.hang_report import REPORT_JSON, REPORT_TEXT

RETURN_KEY = "episode_return_last100"


def trial_record(spec: TrialSpec, status: str) -> dict:
    """A trial not (yet) ended: 'waiting', 'running', 'stopped' (by the sweep's Ctrl-C), 'not started'."""
    return {"trial": spec.name, "overrides": spec.swept, "setting": spec.setting, "status": status}


def ended_record(spec: TrialSpec, result: dict) -> dict:
    """An ended trial, from its last report to Tune (trial.run_trial): 'finished' or 'failed'."""
    record = trial_record(spec, "")
    run_dir = Path(result["run_dir"]) if result.get("run_dir") else None
    summary = json.loads((run_dir / SUMMARY_FILE).read_text()) if run_dir and (run_dir / SUMMARY_FILE).is_file() else {}
    returns = [r[RETURN_KEY] for r in read_metrics(run_dir)] if run_dir else []
    returns = [value for value in returns if value is not None]
    code = result["exit_code"]
    record.update(
        status="finished" if code == exit_codes.OK else "failed",
        exit_code=code,
        cause=None,
        hang_report=None,
        run_dir=result.get("run_dir"),
        log=result["log"],
        seconds=result["seconds"],
        steps=summary.get("global_step"),
        final_return=summary.get(RETURN_KEY),
        best_return=max(returns) if returns else None,
        target_step=summary.get("target_reached_step"),
        target_s=summary.get("target_reached_s"),
    )
    if code != exit_codes.OK:
        record["cause"], record["hang_report"] = failure_cause(code, run_dir, Path(result["log"]))
    return record


def failed_in_ray(spec: TrialSpec, error: str) -> dict:
    """A trial whose Tune worker itself failed (it never reported an exit code)."""
    return {**trial_record(spec, "failed"), "exit_code": None, "cause": f"its Ray worker failed: {error}"}


def failure_cause(code: int, run_dir: Path | None, log: Path) -> tuple[str, str | None]:
    """(one line saying why, the hang report's path or None)."""
    if run_dir and (run_dir / REPORT_JSON).is_file():
        report = json.loads((run_dir / REPORT_JSON).read_text())
        return f"{report['cause']}: {report['summary']}", str(run_dir / REPORT_TEXT)
    if code < 0:
        return f"killed by {signal.Signals(-code).name}", None
    lines = (
        [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    )
    return (lines[-1] if lines else f"exit code {code}, nothing printed"), None


def learning_curve(record: dict) -> list[tuple[int, float]]:
    """(env steps, last-100 return) of a trial's run, where the return is known."""
    if not record.get("run_dir"):
        return []
    return [
        (r["global_step"], r[RETURN_KEY])
        for r in read_metrics(Path(record["run_dir"]))
        if r.get(RETURN_KEY) is not None
    ]

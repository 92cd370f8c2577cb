"""The interface every tracker implements, and the conversions they share.

A tracker receives: the resolved config as the run's parameters (`start`), one record of numbers
per iteration with its env step (`log_metrics`), files to attach (`log_file`: the hang report,
videos), the final summary (`log_summary`) and `close`. It may raise or block in any of them:
`trackers.Trackers` bounds each call and drops a tracker that fails, so an implementation does
not guard itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from fleetrl.config.redact import redacted
from fleetrl.config.schema import Config


class Tracker:
    """A sink for one run's metrics. Subclasses override what they record; the rest is a no-op."""

    def start(self, config: Config, run_dir: Path) -> None:
        """Open (or, for a resumed run directory, reopen) the run; record `config` as its parameters."""

    def log_metrics(self, record: dict, step: int) -> None:
        """One iteration's record (numbers, and None where a value is undefined) at env step `step`."""

    def log_file(self, path: Path, name: str) -> None:
        """Attach the file at `path` to the run under `name`."""

    def log_summary(self, summary: dict) -> None:
        """The run's summary (summary.json), once, at the end."""

    def close(self, failed: bool = False) -> None:
        """Flush and end the run; `failed`: it ended in an incident."""


def numbers(record: dict) -> dict[str, float]:
    """The finite numeric values of a record (bools and None left out): what a metric store takes."""
    return {
        key: float(value)
        for key, value in record.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }


def flat_params(config: Config) -> dict[str, str]:
    """The resolved config as `section.key` → text, the form run parameters take; no secret
    (config/redact.py)."""
    return {
        f"{section}.{key}": str(value)
        for section, values in tracked_config(config).items()
        for key, value in values.items()
    }


def tracked_config(config: Config) -> dict:
    """The resolved config as a tracker records it: as a dict, its secrets redacted."""
    return redacted(dataclasses.asdict(config))


RUN_IDS_FILE = "trackers.json"


def recall_run_id(run_dir: Path, tracker: str) -> str | None:
    """The id a tracker gave this run directory's run before (a resumed run continues it)."""
    path = Path(run_dir) / RUN_IDS_FILE
    return json.loads(path.read_text()).get(tracker) if path.is_file() else None


def remember_run_id(run_dir: Path, tracker: str, run_id: str) -> None:
    path = Path(run_dir) / RUN_IDS_FILE
    ids = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**ids, tracker: run_id}, indent=2))

"""`metrics.jsonl`: one JSON record per iteration, appended line by line (a resumed run appends to
the same file). It is the run directory's own record of its metrics — `fleetrl report` and the
tests read it back with `read_metrics` — and the `jsonl` tracker (`runner.loggers`) writes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fleetrl.config.schema import Config
from fleetrl.tracking.base import Tracker

METRICS_FILE = "metrics.jsonl"


class JsonlTracker(Tracker):
    def start(self, config: Config, run_dir: Path) -> None:
        self.file = open(Path(run_dir) / METRICS_FILE, "a", buffering=1)

    def log_metrics(self, record: dict, step: int) -> None:
        clean = {key: (None if isinstance(v, float) and not math.isfinite(v) else v) for key, v in record.items()}
        self.file.write(json.dumps(clean) + "\n")

    def close(self, failed: bool = False) -> None:
        self.file.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

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
        self.path = Path(run_dir) / METRICS_FILE
        self.file = open(self.path, "ab", buffering=0)  # unbuffered: a failed write fails here, not at close

    def log_metrics(self, record: dict, step: int) -> None:
        """Append one whole line; a write that fails (a full disk) leaves no torn line behind and
        raises OSError naming the file."""
        clean = {key: (None if isinstance(v, float) and not math.isfinite(v) else v) for key, v in record.items()}
        line, start = (json.dumps(clean) + "\n").encode(), self.file.tell()
        try:
            written = 0
            while written < len(line):
                written += self.file.write(line[written:])
        except OSError as error:
            self.file.truncate(start)
            raise OSError(error.errno, error.strerror, str(self.path)) from error

    def close(self, failed: bool = False) -> None:
        self.file.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

"""`metrics.jsonl`: one JSON record per iteration, appended line by line (a resumed run appends to
the same file). It is the run directory's own record of its metrics — `fleetrl report` and the
tests read it back with `read_metrics` — and the `jsonl` tracker (`runner.loggers`) writes it.

Invariant: one record per iteration, in order. A resume trains again the iterations logged after
its checkpoint (a run that died between two checkpoints): their first records are moved to
`metrics-replaced.jsonl` (`set_aside_after`), so that none is lost and none is repeated."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fleetrl.config.schema import Config
from fleetrl.tracking.base import Tracker

METRICS_FILE = "metrics.jsonl"
REPLACED_FILE = "metrics-replaced.jsonl"


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


def set_aside_after(run_dir: Path, iteration: int) -> list[int]:
    """Move the records of iterations after `iteration` from metrics.jsonl to the end of
    metrics-replaced.jsonl; the iterations moved. metrics.jsonl is replaced whole (a temporary
    file renamed), so a crash here leaves it as it was or as it should be."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    later = [line for line in lines if json.loads(line).get("iteration", 0) > iteration]
    if not later:
        return []
    with open(path.with_name(REPLACED_FILE), "a") as replaced:
        replaced.write("".join(line + "\n" for line in later))
    written = path.with_name(f".{METRICS_FILE}.tmp")
    written.write_text("".join(line + "\n" for line in lines if line not in later))
    written.replace(path)
    return [json.loads(line)["iteration"] for line in later]

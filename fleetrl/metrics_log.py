"""Where per-iteration metrics go: `metrics.jsonl` (one JSON record per line) and TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool):
        self.file = open(Path(run_dir) / METRICS_FILE, "a", buffering=1)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # slow import; only when wanted

            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, record: dict) -> None:
        clean = {key: (None if isinstance(v, float) and not math.isfinite(v) else v) for key, v in record.items()}
        self.file.write(json.dumps(clean) + "\n")
        if self.writer is not None:
            step = record["global_step"]
            for key, value in clean.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "global_step":
                    self.writer.add_scalar(key.replace("_", "/", 1) if key.startswith("time_") else key, value, step)

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

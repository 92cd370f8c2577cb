"""TensorBoard event files in `<run>/tensorboard/` (`tensorboard --logdir runs`): every number of
an iteration's record as a scalar at its env step; the `time_*` keys grouped under `time/`."""

from __future__ import annotations

from pathlib import Path

from fleetrl.config.schema import Config
from fleetrl.tracking.base import Tracker, numbers


class TensorBoardTracker(Tracker):
    def start(self, config: Config, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # slow import; only when chosen

        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log_metrics(self, record: dict, step: int) -> None:
        for key, value in numbers(record).items():
            if key != "global_step":
                self.writer.add_scalar(key.replace("_", "/", 1) if key.startswith("time_") else key, value, step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()

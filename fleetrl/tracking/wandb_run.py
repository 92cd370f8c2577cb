"""Weights & Biases (`pip install 'fleetrl[wandb]'`): one W&B run per run directory, configured the
way W&B users already do it — `WANDB_PROJECT` (default 'fleetrl'), `WANDB_ENTITY`, `WANDB_API_KEY`,
`WANDB_MODE=offline` (the run is written under `<run>/wandb/` for a later `wandb sync`), `WANDB_DIR`
(where W&B writes its files instead of the run directory).

A resumed run directory continues the same W&B run: its id is kept in `<run>/trackers.json`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fleetrl import exit_codes
from fleetrl.config.schema import Config
from fleetrl.tracking.base import Tracker, numbers, recall_run_id, remember_run_id, tracked_config


class WandbTracker(Tracker):
    def start(self, config: Config, run_dir: Path) -> None:
        import wandb  # optional; imported only when runner.loggers names it

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "fleetrl"),
            name=run_dir.name,
            id=recall_run_id(run_dir, "wandb"),  # None: a new run, W&B picks the id
            resume="allow",
            dir=os.environ.get("WANDB_DIR") or str(run_dir),  # W&B's convention: the variable decides
            config=tracked_config(config),
            # the console stays fleetrl's own; init gives up within the bound (else its exit hook waits for it)
            settings=wandb.Settings(console="off", init_timeout=config.runner.tracker_timeout_s),
        )
        remember_run_id(run_dir, "wandb", self.run.id)

    def log_metrics(self, record: dict, step: int) -> None:
        self.run.log(numbers(record), step=step)

    def log_file(self, path: Path, name: str) -> None:
        """Copied into the W&B run's own folder under `name`, uploaded now (or by `wandb sync`)."""
        target = Path(self.run.dir) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        self.run.save(str(target), base_path=self.run.dir, policy="now")

    def log_summary(self, summary: dict) -> None:
        self.run.summary.update(summary)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=exit_codes.ERROR if failed else exit_codes.OK)  # W&B marks a nonzero run failed

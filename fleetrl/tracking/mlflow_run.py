"""MLflow (`pip install 'fleetrl[mlflow]'`): one MLflow run per run directory, in the tracking
store MLflow itself is pointed at — `MLFLOW_TRACKING_URI` (a server, a database, or a local
`file:` store, which MLflow 3 accepts only with `MLFLOW_ALLOW_FILE_STORE=true`) and
`MLFLOW_EXPERIMENT_NAME` (default 'fleetrl'). The resolved config becomes the run's parameters,
each iteration's numbers its metrics at the env step, summary.json and the hang report artifacts.

A resumed run directory continues the same MLflow run: its id is kept in `<run>/trackers.json`
(parameters are recorded once, when the run is created: MLflow refuses to change them).
"""

from __future__ import annotations

import os
import time
from pathlib import Path, PurePosixPath

from fleetrl.config.schema import Config
from fleetrl.tracking.base import Tracker, flat_params, numbers, recall_run_id, remember_run_id

PARAMS_PER_REQUEST = 100  # MLflow's limit for one log_batch


class MlflowTracker(Tracker):
    def start(self, config: Config, run_dir: Path) -> None:
        from mlflow.entities import Param  # optional; imported only when runner.loggers names it
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        self.run_id = recall_run_id(run_dir, "mlflow")
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "fleetrl")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        run = self.client.create_run(experiment_id, run_name=run_dir.name, tags={"fleetrl.run_dir": str(run_dir)})
        self.run_id = run.info.run_id
        params = [Param(key, value) for key, value in flat_params(config).items()]
        for first in range(0, len(params), PARAMS_PER_REQUEST):
            self.client.log_batch(self.run_id, params=params[first : first + PARAMS_PER_REQUEST])
        remember_run_id(run_dir, "mlflow", self.run_id)

    def log_metrics(self, record: dict, step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in numbers(record).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_file(self, path: Path, name: str) -> None:
        folder = str(PurePosixPath(name).parent)
        self.client.log_artifact(self.run_id, str(path), None if folder == "." else folder)

    def log_summary(self, summary: dict) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")

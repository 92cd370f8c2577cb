"""The console view of a run: a live progress line on a terminal, plain periodic lines elsewhere."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fleetrl.algos.registry import ConsoleMetric

log = logging.getLogger("fleetrl")
file_only_log = logging.getLogger("fleetrl.iterations")  # see run_dir.setup_logging


def summary_line(record: dict, metrics: Sequence[ConsoleMetric] = ()) -> str:
    """The iteration's line: progress, speed, the recent return, then the algorithm's own
    `metrics` (its spec's `console_metrics`), each while the record has a value for it."""
    ret = record.get("episode_return_last100")
    ret_text = "n/a" if ret is None else f"{ret:.1f}"
    line = (
        f"it {record['iteration']} | steps {record['global_step']:,} | "
        f"{record['steps_per_s']:,.0f} steps/s | return(100) {ret_text}"
    )
    for metric in metrics:
        value = record.get(metric.key)
        if value is not None:
            line += f" | {metric.label} {value:{metric.format}}"
    return line


class ConsoleProgress:
    def __init__(
        self,
        total_steps: int,
        start_step: int,
        log_interval: int,
        live: bool | None = None,
        metrics: Sequence[ConsoleMetric] = (),
    ):
        self.log_interval = log_interval
        self.metrics = metrics
        self.live = sys.stderr.isatty() if live is None else live
        self.bar = None
        if self.live:
            self.bar = Progress(
                TextColumn("[bold]training"),
                BarColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
            )
            self.task = self.bar.add_task("", total=total_steps, completed=start_step)
            self.bar.start()

    def update(self, record: dict) -> None:
        line = summary_line(record, self.metrics)
        if self.bar is not None:
            self.bar.update(self.task, completed=record["global_step"], description=line)
            file_only_log.info(line)
        elif record["iteration"] % self.log_interval == 0:
            log.info(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()

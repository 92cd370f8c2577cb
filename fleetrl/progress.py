"""The console view of a run: a live progress line on a terminal, plain periodic lines elsewhere."""

from __future__ import annotations

import logging
import sys

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

log = logging.getLogger("fleetrl")
file_only_log = logging.getLogger("fleetrl.iterations")  # see run_dir.setup_logging


def summary_line(record: dict) -> str:
    ret = record.get("episode_return_last100")
    ret_text = "n/a" if ret is None else f"{ret:.1f}"
    line = (
        f"it {record['iteration']} | steps {record['global_step']:,} | "
        f"{record['steps_per_s']:,.0f} steps/s | return(100) {ret_text}"
    )
    if "approx_kl" in record:  # PPO family
        line += f" | kl {record['approx_kl']:.4f} | clip {record['clip_fraction']:.3f}"
    if record.get("q_loss") is not None:  # SAC
        line += f" | q loss {record['q_loss']:.3f} | alpha {record['alpha']:.3f}"
    return line


class ConsoleProgress:
    def __init__(self, total_steps: int, start_step: int, log_interval: int, live: bool | None = None):
        self.log_interval = log_interval
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
        line = summary_line(record)
        if self.bar is not None:
            self.bar.update(self.task, completed=record["global_step"], description=line)
            file_only_log.info(line)
        elif record["iteration"] % self.log_interval == 0:
            log.info(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()

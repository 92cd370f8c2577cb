"""The console view of a run: a live progress line on a terminal; elsewhere (a log file, CI) a
plain line every few seconds and the last one.

A progress line is written for every `runner.log_interval`-th iteration, all of them to train.log.
On a terminal the live line shows each as it comes. Off one, the console shows one of them when
`CONSOLE_EVERY_S` have passed since it showed the last, and at the end the last one if it was
held back: a short run's 782 iterations are a few lines, not 782, and train.log still has every
line with its time (benchmarks read the iterations' times from it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fleetrl.algos.registry import ConsoleMetric

log = logging.getLogger("fleetrl")
file_only_log = logging.getLogger("fleetrl.iterations")  # see run_dir.setup_logging
console_only_log = logging.getLogger("fleetrl.console")
CONSOLE_EVERY_S = 5.0  # off a terminal, the least time between two progress lines on the console


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
    """A run's progress lines (`update` once an iteration, `close` once at the end; `live`: the
    terminal's live line, by default when stderr is a terminal). `clock` and `every_s` set the
    console's pace off a terminal (tests pass their own clock)."""

    def __init__(
        self,
        total_steps: int,
        start_step: int,
        log_interval: int,
        live: bool | None = None,
        metrics: Sequence[ConsoleMetric] = (),
        every_s: float = CONSOLE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log_interval = log_interval
        self.metrics = metrics
        self.every_s = every_s
        self.clock = clock
        self.shown_at: float | None = None  # when the console last showed a line (off a terminal)
        self.held: str | None = None  # the newest line in train.log that the console has not shown
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
            return
        if record["iteration"] % self.log_interval:
            return
        now = self.clock()
        if self.shown_at is None or now - self.shown_at >= self.every_s:
            log.info(line)  # the console and train.log
            self.shown_at, self.held = now, None
        else:
            file_only_log.info(line)
            self.held = line

    def close(self) -> None:
        """The end of the run (or of its training, on an error): stop the live line, or show the
        last line the console held back. Once; a second call does nothing."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        elif self.held is not None:
            console_only_log.info(self.held)
            self.held = None

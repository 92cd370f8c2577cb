"""The console off a terminal shows a progress line every few seconds and the last one, while
train.log keeps every `runner.log_interval`-th line; on a terminal the live line is unchanged.
A clock the test moves stands in for time: 50 iterations in 12 "seconds" are 4 console lines."""

from __future__ import annotations

from fleetrl.progress import ConsoleProgress
from fleetrl.run_dir import LOG_FILE, setup_logging


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(iteration: int) -> dict:
    return {"iteration": iteration, "global_step": 128 * iteration, "steps_per_s": 5000.0}


def lines_of(text: str) -> list[int]:
    """The iterations of the progress lines in `text`, in order."""
    return [int(line.split("it ", 1)[1].split(" |", 1)[0]) for line in text.splitlines() if " | steps " in line]


def run(tmp_path, capsys, log_interval: int, iterations: int, seconds_each: float) -> tuple[list[int], list[int]]:
    """(iterations the console showed, iterations train.log holds) of a run off a terminal."""
    run_dir = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    run_dir.mkdir()
    setup_logging(run_dir)
    clock = Clock()
    progress = ConsoleProgress(128 * iterations, 0, log_interval, live=False, clock=clock)
    for iteration in range(1, iterations + 1):
        clock.now += seconds_each
        progress.update(record(iteration))
    progress.close()
    progress.close()  # the error path closes before the final one: the last line is shown once
    return lines_of(capsys.readouterr().err), lines_of((run_dir / LOG_FILE).read_text())


def test_off_a_terminal_the_console_shows_a_line_every_five_seconds_and_the_last(
    tmp_path, capsys, quiet_fleetrl_logging
):
    console, train_log = run(tmp_path, capsys, log_interval=1, iterations=50, seconds_each=0.24)
    assert train_log == list(range(1, 51))  # every iteration, each at its own time
    # the first line, then one once 5 s have passed since the last shown (0.24 s an iteration:
    # every 21st), and the last, held back until the end
    assert console == [1, 22, 43, 50]


def test_log_interval_chooses_the_lines_and_the_clock_thins_them_on_the_console(
    tmp_path, capsys, quiet_fleetrl_logging
):
    console, train_log = run(tmp_path, capsys, log_interval=5, iterations=40, seconds_each=1.0)
    assert train_log == [5, 10, 15, 20, 25, 30, 35, 40]
    assert console == [5, 10, 15, 20, 25, 30, 35, 40]  # 5 s apart already: each is shown
    console, train_log = run(tmp_path, capsys, log_interval=5, iterations=42, seconds_each=0.5)
    assert train_log == [5, 10, 15, 20, 25, 30, 35, 40]
    assert console == [5, 15, 25, 35, 40]  # 2.5 s apart: every other one, and the last (40, not 42)


def test_a_line_shown_when_it_came_is_not_shown_again_at_the_end(tmp_path, capsys, quiet_fleetrl_logging):
    console, _ = run(tmp_path, capsys, log_interval=1, iterations=3, seconds_each=10.0)
    assert console == [1, 2, 3]

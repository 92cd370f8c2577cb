"""`fleetrl top`'s rows (tools/top.py) from the records the watchdog's own `observe` leaves: a
record without its phase's elapsed time (an older or another writer's: the store requires only a
few fields) shows its phase with no age, where the table raised TypeError and `top` died."""

from __future__ import annotations

import os

from fleetrl.config.schema import WatchdogConfig
from fleetrl.tools.top import COLUMNS, Sampler, rows
from fleetrl.watch.judging.verdict import Checks


class StoredRun:
    """What `rows` reads of a live run: its workers and the records its heartbeat store holds."""

    def __init__(self, record: dict):
        self.workers = [{"component": "env", "rank": 0, "node": 0}]
        self.record = record

    def records(self) -> dict:
        return {("env", 0): dict(self.record)}


def test_a_record_without_its_phase_s_elapsed_time_shows_the_phase_without_an_age():
    required = {"component": "env", "rank": 0, "pid": os.getpid(), "phase": "env.step", "phase_started": None}
    judge = Checks(WatchdogConfig(), [("env", 0)])
    (row,) = rows(StoredRun({**required, "beat": 1, "time": 100.0}), Sampler(), judge)
    shown = dict(zip(COLUMNS, row))
    assert (shown["phase"], shown["in phase"]) == ("env.step", "-"), shown
    (row,) = rows(StoredRun({**required, "beat": 2, "time": 100.5, "phase_elapsed_s": 12.0}), Sampler(), judge)
    assert float(dict(zip(COLUMNS, row))["in phase"].removesuffix(" s")) >= 12.0, row

"""Worker timestamps on the watchdog's own clock: ages measured where heartbeats are received.

A worker stamps its heartbeat with its machine's clock; two machines' clocks differ (by 30 s is
not rare without NTP), so `watchdog now - worker time` would call a healthy worker on a clock
behind ours frozen, and miss a frozen one on a clock ahead. Instead, each time a worker's beat
time changes (a new beat has arrived, at most a poll and a beat interval ago), the offset between
the clocks is taken, and every timestamp of that record is moved onto the watchdog's clock by it.
A record that stops changing keeps the offset of its last beat, so its age grows on the
watchdog's clock alone, whatever the worker's clock says.
"""

from __future__ import annotations

TIMESTAMPS = ("time", "phase_started")  # the record's own; its collectives' below
COLLECTIVE_TIMESTAMPS = ("started", "finished")


class ReceivedClock:
    def __init__(self):
        self.beat: dict = {}  # key → the worker's `time` last seen
        self.offset: dict = {}  # key → watchdog clock minus worker clock, taken when that beat arrived

    def received(self, records: dict, now: float) -> dict:
        """`records` (key → heartbeat record) with their timestamps on this clock, `now` being it."""
        moved = {}
        for key, record in records.items():
            if self.beat.get(key) != record["time"]:
                self.beat[key], self.offset[key] = record["time"], now - record["time"]
            moved[key] = shifted(record, self.offset[key])
        return moved


def shifted(record: dict, offset: float) -> dict:
    moved = {**record, **{name: record[name] + offset for name in TIMESTAMPS if record.get(name) is not None}}
    for name in ("collective", "last_collective"):
        if isinstance(record.get(name), dict):
            moved[name] = {
                **record[name],
                **{t: record[name][t] + offset for t in COLLECTIVE_TIMESTAMPS if record[name].get(t) is not None},
            }
    return moved

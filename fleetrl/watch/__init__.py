"""Watching a run from outside its workers: nothing of the training stack, heartbeats alone.

At the top, the watch session. `watcher.py` is the one watcher — heartbeat store, watchdog
(`watchdog.py`), incident response (`respond.py`: stacks, report, teardown, exit) and the bound on
that response — which the two watching processes wrap: the supervisor around its controller
process (`supervision.py`, all the supervisor imports of this package) and a `Trainer` watching
itself (`session.py`, the object the backends are watched through; `supervised.py` is its
stand-in in a supervised controller, talking to the supervisor over `link.py`). `attach.py` is
how `fleetrl top` / `stack` find a running job; `incident.py` and `naming.py` are the words all of
it shares.

- `judging/`: from heartbeat records (and errors) to a verdict: the incident they show, or None.
- `reporting/`: from an incident to `hang_report.txt` / `.json`.
"""

"""Watching a run from outside its workers: nothing of the training stack, heartbeats alone.

At the top, the watch session — what the backends and the supervisor use: `session.py` (a
`Trainer` watching itself) and `supervised.py` (the controller's side under `fleetrl train`),
`watchdog.py` (the polling thread), `respond.py` (stacks, report, teardown, exit),
`link.py` (what a supervised controller and its supervisor tell each other) and `attach.py` (how
`fleetrl top` / `stack` find a running job); `incident.py` and `naming.py` are the words all of it
shares.

- `judging/`: from heartbeat records (and errors) to a verdict: the incident they show, or None.
- `reporting/`: from an incident to `hang_report.txt` / `.json`.
"""

"""`fleetrl stack`: every worker's Python stack now, without stopping the run.

Each worker is asked through the run's heartbeat store and answers from its own heartbeat thread,
on whatever machine it runs (probe/stack_requests.py); one that cannot answer is dumped from here
where it lives on this machine (probe/stacks.py), and named as not answering otherwise.
"""

from __future__ import annotations

from fleetrl import exit_codes
from fleetrl.probe.stack_requests import stack_asker
from fleetrl.probe.stacks import capture_stacks
from fleetrl.watch.attach import attach


def stack(run_dir: str | None) -> int:
    run = attach(run_dir)
    records = run.records()
    workers = [{**records.get((w["component"], w["rank"]), {}), **w} for w in run.workers]
    stacks = capture_stacks(workers, run.run_dir / "stacks", stack_asker(run.store, run.watchdog.heartbeat_interval_s))
    for worker in workers:
        key = (worker["component"], worker["rank"])
        where = f"pid {worker.get('pid', '?')} on {worker.get('host', '?')}, node {worker['node']}"
        print(f"=== {key[0]} rank {key[1]} ({where}) ===\n{stacks.get(key, '(no stack)')}\n")
    return exit_codes.OK

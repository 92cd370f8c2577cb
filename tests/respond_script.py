"""The incident response in a process of its own (tests/test_respond.py): `python -m
tests.respond_script RUN_DIR CASE` makes a `Responder` for RUN_DIR, starts two `sleep` children
(what the response must end), responds to one incident as CASE says, and prints one JSON line of
what it saw (its children's pids first, on a line of their own). Its own process, because the response ends every child of the process it runs in."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from fleetrl.watch.incident import Incident
from fleetrl.watch.respond import IncidentStop, Responder

WORKERS = [{"component": "env", "rank": 0, "node": 0}, {"component": "actor", "rank": 1, "node": 0}]


def incident() -> Incident:
    records = {("env", 0): {"pid": 1, "phase": "env.step", "phase_age_s": 3.0, "heartbeat_age_s": 0.2}}
    return Incident("phase_timeout", "env rank 0 is stuck", time.time() - 7.0, ("env", 0), "its detail", records)


def main(run_dir: Path, case: str) -> None:
    children = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    print(json.dumps({"children": [child.pid for child in children]}), flush=True)  # before anything can end us
    responder = Responder(run_dir)
    seen: dict = {"children": [child.pid for child in children], "hooks": [], "remote_killed": False}
    responder.add_report_hook(lambda paths: seen["hooks"].append([str(p) for p in paths]), 5.0)
    if case == "hanging_hook":
        responder.add_report_hook(lambda paths: time.sleep(600), 0.5)
        responder.add_report_hook(lambda paths: seen["hooks"].append("after the hanging one"), 5.0)

    def kill_remote() -> None:
        seen["remote_killed"] = True

    second: dict = {}
    if case == "two_callers":  # the first holds the response (a slow hook) while the second arrives
        responder.add_report_hook(lambda paths: time.sleep(1.0), 5.0)

        def later() -> None:
            time.sleep(0.3)
            try:
                responder.respond(Incident("worker_died", "another", time.time(), ("actor", 1)), WORKERS)
            except IncidentStop as stop:
                second.update(cause=stop.report["cause"], at=time.time())

        threading.Thread(target=later).start()
    try:
        responder.respond(incident(), WORKERS, kill_remote, exit_process=case == "exit_process")
    except IncidentStop as stop:
        seen["raised"] = stop.report["cause"]
        seen["done_at"] = time.time()
    time.sleep(1.0 if case == "two_callers" else 0)
    seen["second"] = second
    seen["children_alive"] = [child.poll() is None for child in children]
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])

"""Run a probe in fresh Python processes under a hard deadline, and leave nothing behind.

A probe that can hang (a rendezvous, a simulator) never runs in the doctor's own process: it runs
as `python -m <module> <json payload>` in its own session, reports its progress as `PHASE ...`
lines and its answer as one `RESULT {json}` line on stdout, and is killed — its whole process tree —
when the deadline passes. What it was doing when killed is its last PHASE line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import psutil

PHASE = "PHASE "
RESULT = "RESULT "


# ---- the probe's side -----------------------------------------------------------------------


def report_phase(text: str) -> None:
    print(PHASE + text, flush=True)


def report_result(result: dict) -> None:
    print(RESULT + json.dumps(result), flush=True)


def read_payload() -> dict:
    return json.loads(sys.argv[1])


# ---- the doctor's side ----------------------------------------------------------------------


@dataclass
class Outcome:
    returncode: int | None  # None: still running at the deadline, and killed
    seconds: float
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def result(self) -> dict | None:
        lines = [line for line in self.stdout.splitlines() if line.startswith(RESULT)]
        return json.loads(lines[-1][len(RESULT) :]) if lines else None

    @property
    def last_phase(self) -> str:
        phases = [line[len(PHASE) :] for line in self.stdout.splitlines() if line.startswith(PHASE)]
        return phases[-1] if phases else "starting Python"

    def error_text(self, limit: int = 1000) -> str:
        """The probe's own error, else the last line of stderr that is not a C++ frame."""
        result = self.result
        if result and result.get("error"):
            return str(result["error"])[:limit]
        lines = [
            line.strip()
            for line in self.stderr.splitlines()
            if line.strip() and not line.lstrip().startswith(("frame #", "<omitting", "Exception raised"))
        ]
        return (lines[-1] if lines else f"exit code {self.returncode}")[:limit]


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, plus its sys.path, so `module:attr` entry points resolve."""
    env = {**os.environ, **(extra or {})}
    paths = [os.path.abspath(p) for p in sys.path if p] + [os.getcwd(), *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, paths)))  # no empty entry: the probe's cwd
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_probes(
    module: str, payloads: list[dict[str, Any]], deadline_s: float, env: dict[str, str] | None = None
) -> list[Outcome]:
    """Start `python -m module <payload>` for each payload at once; wait for all of them until
    `deadline_s` has passed; kill every process tree still running. One Outcome per payload."""
    environment = child_environment(env)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleetrl-doctor-") as folder:
        started = []
        try:
            for index, payload in enumerate(payloads):
                out = open(os.path.join(folder, f"{index}.out"), "w+")
                err = open(os.path.join(folder, f"{index}.err"), "w+")
                process = subprocess.Popen(
                    [sys.executable, "-m", module, json.dumps(payload)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=environment,
                    start_new_session=True,
                )
                started.append((process, out, err))
            finished: dict[int, float] = {}
            while len(finished) < len(started) and time.monotonic() - start < deadline_s:
                for index, (process, _, _) in enumerate(started):
                    if index not in finished and process.poll() is not None:
                        finished[index] = time.monotonic() - start
                time.sleep(0.02)
        finally:
            for process, _, _ in started:
                kill_tree(process)
        outcomes = []
        for index, (process, out, err) in enumerate(started):
            out.seek(0)
            err.seek(0)
            seconds = finished.get(index, time.monotonic() - start)
            outcomes.append(Outcome(process.returncode if index in finished else None, seconds, out.read(), err.read()))
            out.close()
            err.close()
        return outcomes


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the process, its session's process group and every descendant; reap it."""
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        os.killpg(process.pid, signal.SIGKILL)  # start_new_session: its pid is its group's id
    except (ProcessLookupError, PermissionError):
        pass
    for child in descendants:
        try:
            child.kill()
        except psutil.Error:
            pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    psutil.wait_procs(descendants, timeout=2)

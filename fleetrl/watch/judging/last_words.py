"""A dead worker's last words: how it ended, on which node, and the tail of its own stderr.

A worker that dies of a signal leaves its account in its stderr, not in the error its caller
sees: Ray's core prints `*** SIGSEGV received at time=... ***`, faulthandler (on in every Ray
worker) the Python stack of the crash, Gloo and NCCL their abort message. Ray keeps a worker's
stderr in `logs/worker-<worker id>-<job id>-<pid>.err` of its session directory, on the worker's
own node — so the tail is read there: where the worker's published stderr path is on this
machine, directly; elsewhere by a Ray task pinned to the worker's node
(cluster/ray/cluster.py `RayCluster.last_words`), which works alike on simulated, isolated and
real clusters.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetrl.probe.flight_recorder import machine_identity, stderr_file

TAIL_BYTES = 16_384  # of the stderr file: a faulthandler stack with its threads, an abort message
TAIL_LINES = 60
# A collective whose sizes or ops differ between ranks, as Gloo and NCCL report it when they abort
MISMATCH = re.compile(r"collective mismatch|doesn't match expected size|Mismatch between collectives", re.IGNORECASE)
FAULTHANDLER_SIGNALS = {  # faulthandler's "Fatal Python error: <name>" for the signals it handles
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
RAY_WORKER_LOG = re.compile(r"worker-[0-9a-f]+-[0-9a-f]+-\d+\.err")
RAY_SIGNAL = re.compile(r"\*\*\* (SIG[A-Z0-9]+) received")
FATAL = re.compile(r"Fatal Python error: ([A-Za-z -]+)")
# How a worker ended that left nothing in its stderr (judging/ray_memory.py tells a memory kill)
UNEXPLAINED_END = "ended without a signal or error in its stderr (SIGKILL, the OOM killer, or an exit)"


@dataclass(frozen=True)
class LastWords:
    ended: str  # "killed by SIGSEGV", "exited with code 3", or what is known of it
    node: str  # "node 1 (fleetrl-n1)"
    stderr_tail: str  # the last lines of its stderr, or why they could not be read
    stderr_path: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def mismatch(self) -> str | None:
        """The stderr line in which Gloo or NCCL reported a collective mismatch, if any."""
        return next((line.strip() for line in self.stderr_tail.splitlines() if MISMATCH.search(line)), None)

    def text(self) -> str:
        return f"{self.ended}, on {self.node}"


def node_name(index, host: str | None) -> str:
    return f"node {index} ({host})" if host else f"node {index}"


def read_tail(path: str | Path) -> str:
    with open(path, "rb") as file:
        file.seek(max(0, os.fstat(file.fileno()).st_size - TAIL_BYTES))
        lines = file.read().decode(errors="replace").splitlines()
    return "\n".join(lines[-TAIL_LINES:])


def how_it_ended(tail: str, exit_code: int | None = None) -> str:
    """'killed by SIGSEGV' from what its stderr says (Ray's signal line, faulthandler's fatal
    error), else from `exit_code` where its parent reaped it here (negative: a signal)."""
    found = RAY_SIGNAL.search(tail)
    if found:
        return f"killed by {found.group(1)}"
    fatal = FATAL.search(tail)
    if fatal and fatal.group(1).strip() in FAULTHANDLER_SIGNALS:
        return f"killed by {FAULTHANDLER_SIGNALS[fatal.group(1).strip()]}"
    if exit_code is not None:
        return f"killed by {signal.Signals(-exit_code).name}" if exit_code < 0 else f"exited with code {exit_code}"
    return UNEXPLAINED_END


def on_this_node(worker_pid: int, node: str, logs_dir: str | None = None) -> dict:
    """Run on the dead worker's node (a Ray task pinned there): the last words from Ray's
    `worker-*-<pid>.err` in this node's session logs (the folder this task's own stderr is in)."""
    logs = logs_dir or os.path.dirname(stderr_file() or "")
    found = sorted(glob.glob(os.path.join(logs, f"worker-*-{worker_pid}.err"))) if logs else []
    host = socket.gethostname()
    if not found:
        missing = f"(no worker-*-{worker_pid}.err in {logs or 'Ray logs'})"
        return LastWords("ended (its stderr was not found)", node_name(node, host), missing).as_dict()
    tail = read_tail(found[-1])
    return LastWords(how_it_ended(tail), node_name(node, host), tail, found[-1]).as_dict()


def from_record(record: dict) -> LastWords | None:
    """Last words read here from the stderr file `record` (a worker's heartbeat) names, where
    that file is on this machine; else None."""
    path = record.get("stderr")
    if not isinstance(path, str) or not RAY_WORKER_LOG.fullmatch(Path(path).name):
        return None  # only a Ray worker's own log is read: a record never names another file to read
    if record.get("machine") != machine_identity() or not Path(path).is_file():
        return None
    tail = read_tail(path)
    return LastWords(how_it_ended(tail), node_name(record.get("node"), record.get("host")), tail, path)

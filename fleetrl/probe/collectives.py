"""The collectives a rank has entered and completed, numbered per process group.

Each process group has its own sequence: the n-th collective a rank enters on group `g` is `g`
#n on every rank that runs the same program, so the watchdog can line the ranks up by number and
name the one that is behind (watch/judging/alignment.py). A collective is *entered* when the rank calls
it and *completed* when it has finished: a synchronous call when it returns, an asynchronous one
(DDP's gradient buckets, which Gloo runs on its own threads and NCCL on a stream) when its Future
completes (parallel/recorded.py). Without the completion a rank blocked in DDP's backward, waiting
for a bucket a peer never sent, would look like a rank that is computing.

The heartbeat carries, per group, the last entered and the last completed number, the
collectives in flight (entered, not completed; oldest first) and the last `RECENT` collectives
(the report's aligned table). Completion may run on another thread (Gloo's, a CUDA callback), and
the heartbeat thread reads the log: every change and every copy holds `lock`. The cost per
collective is a few microseconds (benchmarks/costs/collective_log.py): it is paid per gradient bucket.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque

from fleetrl.probe.torch_trace import TorchTrace

RECENT = 12  # collectives kept for the report's table (all groups)
DEFAULT_GROUP = "actor"  # the actor ranks' default process group
# The join of that group (rendezvous, then the connections: parallel/process_group.py), recorded as
# a collective of its own sequence, so that the training collectives' numbers stay the same: a rank
# waiting in the join waits for every actor rank that has not entered it (watch/judging/alignment.py).
JOIN_GROUP = "join"
# The weight-sync group (`runner.weight_sync_transport: collective`, parallel/sync_group.py): actor
# rank 0 and every rollout worker. Its join (rendezvous and connections) is a collective of its own
# sequence, like the actor ranks' join; the proof of the run's secret and the payloads' broadcasts
# are collectives of the group itself.
WEIGHT_SYNC_GROUP = "weight_sync"
WEIGHT_SYNC_JOIN = "weight_sync join"


class CollectiveLog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entered: dict[str, int] = {}  # group → last sequence number entered
        self.completed: dict[str, int] = {}  # group → last sequence number completed
        self.in_flight: dict[tuple[str, int], dict] = {}  # (group, seq) → entry, in entry order
        self.recent: deque[dict] = deque(maxlen=RECENT)
        self.last: dict | None = None  # the last completed entry
        self.count = 0  # collectives entered on all groups: a phase call's count is a difference of two
        self.torch_trace = TorchTrace()  # torch's own recorder, read by the heartbeat thread only

    def enter(self, op: str, tensors, group: str = DEFAULT_GROUP) -> dict:
        """Record that this rank enters collective `op` on `group`; returns its entry (for
        `complete`)."""
        entry = {
            "seq": 0,
            "op": op,
            "group": group,
            "shapes": [list(t.shape) for t in tensors],
            "dtypes": [str(t.dtype) for t in tensors],
            "call_site": call_site(),
            "started": time.time(),
            "finished": None,
        }
        with self.lock:
            entry["seq"] = self.entered[group] = self.entered.get(group, 0) + 1
            self.count += 1
            self.in_flight[(group, entry["seq"])] = entry
            self.recent.append(entry)
        return entry

    def complete(self, entry: dict) -> None:
        finished = time.time()
        with self.lock:
            entry["finished"] = finished
            group, seq = entry["group"], entry["seq"]
            self.in_flight.pop((group, seq), None)
            if seq > self.completed.get(group, 0):
                self.completed[group] = seq
                self.last = entry

    def record(self) -> dict:
        """The heartbeat's view: copies, consistent with each other; and torch's own flight
        recorder's, where it is on (probe/torch_trace.py)."""
        trace = self.torch_trace.summary()
        with self.lock:
            in_flight = [dict(entry) for entry in self.in_flight.values()]
            return {
                "collective": in_flight[0] if in_flight else None,  # the oldest in flight
                "last_collective": dict(self.last) if self.last else None,
                "collectives": {
                    "entered": dict(self.entered),
                    "completed": dict(self.completed),
                    "in_flight": in_flight,
                    "recent": [dict(entry) for entry in self.recent],
                },
                "torch_trace": trace,
            }


PLUMBING = ("/fleetrl/probe/", "/fleetrl/debug/", "/fleetrl/parallel/", "/torch/", contextlib.__file__)


def call_site() -> str:
    """The innermost frame outside fleetrl's probe/debug/parallel plumbing, torch and contextlib, as
    file:line (func). Walks the frames themselves: `traceback.extract_stack` reads source lines
    and cost ~19 us here, on the path of every DDP gradient bucket."""
    frame = sys._getframe(1)
    for _ in range(20):
        if frame is None:
            break
        path = frame.f_code.co_filename
        if not any(part in path for part in PLUMBING):
            return f"{os.path.basename(path)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"

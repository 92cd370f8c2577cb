"""In the doctor's handshake, one rank's failure ends the other ranks' wait.

A rank that cannot reach a peer fails at once ("Network is unreachable"), while the peer it
could not reach sits in Gloo's connectFullMesh waiting for a connection that will never come,
until its own timeout: the doctor then answered only at the end of the whole deadline. So each
rank keeps a second client of the rendezvous store: a rank that fails writes `FAILED_KEY` there,
and every rank still waiting, polling for it, stops (after `GRACE_S`, in which its own error,
if it has one, is the better story) and says which rank failed.

torch's tcp:// rendezvous store lives in rank 0's process: rank 0 stays until every rank has
counted itself done (`DONE_KEY`), so a store that goes away before a rank is done means the
process hosting it ended without finishing the handshake — the same news. A failed rank waits
(at most `LINGER_S`) until every rank knows the handshake failed (`KNOWN_KEY`: told, or failed
itself), so that the others can name it rather than only see the store go. A rank can fail the
instant its rendezvous ends (its first connect refused: "Network is unreachable"), before its
watch has connected to the store and before its peers' watches have: it then connects to tell
them (within `CONNECT_S`), and stays while they connect, so a peer whose watch had not yet reached
the store does not sit in connectFullMesh until its own timeout.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
import time

from fleetrl import exit_codes
from fleetrl.doctor.processes import report_result

FAILED_KEY = "fleetrl-doctor/failed"
DONE_KEY = "fleetrl-doctor/done"
KNOWN_KEY = "fleetrl-doctor/known"
POLL_S = 0.2
GRACE_S = 2.0  # a rank failing on its own in this time reports its own error, not its peer's
CONNECT_S = 5.0  # a failed rank's wait for its watch to reach the store it has just rendezvoused at
LINGER_S = 15.0  # a failed rank's wait for its peers' watches to read its failure (a loaded host's start-up)


class PeerWatch:
    """Watches the rendezvous store at `host:port` from a thread of rank `rank`'s probe process;
    ends the process (its result: stopped by the peer's failure) once another rank has failed."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float):
        self.address, self.rank, self.world_size, self.timeout_s = f"{host}:{port}", rank, world_size, timeout_s
        self.settled = threading.Event()  # this rank has its own outcome: nothing to stop any more
        self.passed = threading.Event()  # ... and it passed: no failure to tell, no store to reach
        self.connected = threading.Event()
        self.lock = threading.Lock()  # the store client is shared with the rank's main thread
        self.store = None
        threading.Thread(target=self.watch, args=(host, port), daemon=True, name="peer-watch").start()

    def watch(self, host: str, port: int) -> None:
        import torch.distributed as dist

        if not listening(host, port, self.timeout_s, self.passed):
            return  # the rank's own join meets the same store and reports on it
        try:  # (TCPStore's own connect holds the GIL while it retries: the rank would stall on it)
            timeout = datetime.timedelta(seconds=self.timeout_s)
            self.store = dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
        except Exception:  # noqa: BLE001 — as above
            return
        self.connected.set()
        while not self.settled.wait(POLL_S):
            try:
                with self.lock:
                    if not self.store.check([FAILED_KEY]):
                        continue
                    why = f"rank {self.store.get(FAILED_KEY).decode()} failed"
                    self.store.add(KNOWN_KEY, 1)
            except Exception:  # noqa: BLE001 — the store went away with the process hosting it
                why = f"the rendezvous store at {self.address} went away (the process hosting it ended)"
            if not self.settled.wait(GRACE_S):
                report_result({"ok": False, "rank": self.rank, "error": f"stopped waiting: {why}"})
                os._exit(exit_codes.ERROR)
            return

    def failed(self) -> None:
        """This rank failed: tell the others (if the store can be reached), and wait (at most
        `LINGER_S`) until every rank knows."""
        self.settled.set()
        if not self.connected.wait(CONNECT_S):
            return  # no store (the rendezvous itself failed): the peers' own joins report on it
        deadline = time.monotonic() + LINGER_S
        try:
            with self.lock:
                self.store.add(KNOWN_KEY, 1)
                self.store.set(FAILED_KEY, str(self.rank))
                while self.store.add(KNOWN_KEY, 0) < self.world_size and time.monotonic() < deadline:
                    time.sleep(0.02)
        except Exception:  # noqa: BLE001 — the peers then stop when the store goes, or at their deadline
            pass

    def done(self) -> None:
        """This rank passed; rank 0 (the store's host) waits, at most `GRACE_S`, for all to be
        done (a rank still returning from the all_reduce when the store goes waits out its grace)."""
        self.settled.set()
        self.passed.set()
        if not self.connected.wait(GRACE_S):
            return
        deadline = time.monotonic() + GRACE_S
        with self.lock:
            count = self.store.add(DONE_KEY, 1)
            while self.rank == 0 and count < self.world_size and time.monotonic() < deadline:
                time.sleep(0.02)
                count = self.store.add(DONE_KEY, 0)


def listening(host: str, port: int, timeout_s: float, settled: threading.Event) -> bool:
    """Whether `host:port` accepts a connection within `timeout_s` (rank 0 opens it in its
    rendezvous); stops trying once the rank has its own outcome."""
    deadline = time.monotonic() + timeout_s
    while not settled.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return True
        time.sleep(POLL_S)
    return False

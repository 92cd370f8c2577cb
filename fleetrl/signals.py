"""Ctrl-C and SIGTERM: the first asks for a clean stop (checkpoint, teardown, exit 130 / 143);
a second one while that is under way stops at once (every child process killed)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fleetrl import exit_codes
from fleetrl.teardown import kill_own_children


class Stop(KeyboardInterrupt):
    """Raised in the main thread by the first SIGINT or SIGTERM."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)


received: list[int] = []  # signals seen, in order
held: list[bool] = [False]  # inside a stop gate, after `hold_stops()`: the first stop waits for the gate's end
deferred: list[int] = []  # the stop that arrived while held


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """`exit_codes.stopped_by` the signal that stopped us (Ray's waits may re-raise our Stop as a
    plain KeyboardInterrupt, so the signal is remembered here rather than read off the exception)."""
    return exit_codes.stopped_by(received[0] if received else signal.SIGINT)


def install_stop_handlers() -> None:
    def handler(signum, frame):
        received.append(signum)
        if len(received) > 1:
            print(f"fleetrl: second {signal.Signals(signum).name}: stopping now", file=sys.stderr, flush=True)
            kill_own_children()
            os._exit(exit_codes.stopped_by(received[0]))
        if held[0]:
            deferred.append(signum)
            return
        raise Stop(signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


@contextmanager
def stop_gate() -> Iterator[None]:
    """A block in which, once `hold_stops()` has been called, the first stop signal is raised
    (as `Stop`) when the block ends rather than wherever the main thread is. The trainer holds
    stops from the moment an iteration has trained until its metrics are logged: a stop there
    used to leave a checkpoint of iteration N beside metrics that end at N − 1. A second signal
    still stops at once. An exception leaving the block goes on as it is."""
    try:
        yield
    except BaseException:
        held[0] = False
        raise
    held[0] = False
    if deferred:
        raise Stop(deferred.pop())  # once: the stop's own work must not meet it again at a later gate


def hold_stops() -> None:
    """Inside a `stop_gate`: from now on, a stop waits for the gate's end."""
    held[0] = True


@contextmanager
def stops_wait() -> Iterator[None]:
    """A block a stop must not cut in half: the calls that start one step on every rank. A first
    stop signal inside it is raised (as `Stop`) when the block ends — or, inside a `stop_gate`
    that holds stops already, at the gate's end. A stop raised between two ranks' calls left one
    rank in an update (or a collective) its peers never entered, unknown to the controller, whose
    stop then waited behind it for ever: the watchdog reported the ranks' mismatch and the
    supervisor killed the stopping run before its checkpoint. A second signal still stops at once.
    Only the main thread's blocks hold a stop: the signal is raised there, and another thread's
    block must neither delay it nor raise it in the wrong thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = held[0]
    held[0] = True
    try:
        yield
    finally:
        held[0] = outer
    if deferred and not outer:
        raise Stop(deferred.pop())

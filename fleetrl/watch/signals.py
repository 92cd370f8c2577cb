"""Ctrl-C and SIGTERM: the first asks for a clean stop (checkpoint, teardown, exit 130 / 143);
a second one while that is under way stops at once (every child process killed)."""

from __future__ import annotations

import os
import signal
import sys

from fleetrl.watch.teardown import kill_own_children


class Stop(KeyboardInterrupt):
    """Raised in the main thread by the first SIGINT or SIGTERM."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)


received: list[int] = []  # signals seen, in order


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal that stopped us (Ray's waits may re-raise our Stop as a plain
    KeyboardInterrupt, so the signal is remembered here rather than read off the exception)."""
    return 128 + received[0] if received else 128 + signal.SIGINT


def install_stop_handlers() -> None:
    def handler(signum, frame):
        received.append(signum)
        if len(received) > 1:
            print(f"fleetrl: second {signal.Signals(signum).name}: stopping now", file=sys.stderr, flush=True)
            kill_own_children()
            os._exit(128 + received[0])
        raise Stop(signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)

"""Stacks taken by the worker itself, asked for through the heartbeat store.

Signalling a pid only works on the machine that pid lives on; a worker on another node — or in
another PID namespace — would be the wrong process, and SIGUSR1's default action kills it. So
the asker bumps the worker's request counter in the store (`ask_stacks`), and the worker's
heartbeat thread, which reads that counter once per beat with one `add(key, 0)` (`StackAnswerer`),
answers with every thread's Python stack in its reply key. A worker whose main thread holds the
GIL or that is stopped cannot answer: the caller falls back to signals or py-spy, where the
process is on its own machine (probe/stacks.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass

REQUEST_PREFIX = "fleetrl/stack-request/"
REPLY_PREFIX = "fleetrl/stack-reply/"
ANSWER_BEATS = 4  # a worker answers at its next heartbeat: an asker waits this many intervals


def request_key(component: str, rank: int) -> str:
    return f"{REQUEST_PREFIX}{component}/{rank}"


def reply_key(component: str, rank: int) -> str:
    return f"{REPLY_PREFIX}{component}/{rank}"


def own_stacks() -> str:
    """Every thread of this process with its Python stack, innermost call last; the main thread
    first, and the thread asking (the heartbeat's, answering a request) named without its frames."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main, asking = threading.main_thread().ident, threading.get_ident()
    parts = []
    for ident, frame in sorted(sys._current_frames().items(), key=lambda item: item[0] != main):
        if ident == asking:
            parts.append(f'Thread {ident} "{names.get(ident, "?")}" (taking these stacks)')
            continue
        parts.append(f'Thread {ident} "{names.get(ident, "?")}" (most recent call last):')
        parts.append("".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(parts)


class StackAnswerer:
    """Worker side, called by the heartbeat thread after each beat: one store op when nobody
    asked; the stacks written to the reply key when the request counter moved."""

    def __init__(self, store, component: str, rank: int):
        self.store = store
        self.request, self.reply = request_key(component, rank), reply_key(component, rank)
        self.answered = 0

    def __call__(self) -> None:
        asked = self.store.add(self.request, 0)
        if asked > self.answered:
            answer = {"request": asked, "pid": os.getpid(), "time": time.time(), "stacks": own_stacks()}
            self.store.set(self.reply, json.dumps(answer))  # sealed (a SealedStore)
            self.answered = asked


def connect_answerer(host: str, port: int, component: str, rank: int, secret: bytes) -> StackAnswerer:
    """Worker side: an answerer on a connection of its own to the heartbeat store."""
    from fleetrl.probe.seal import Seal, SealedStore
    from fleetrl.probe.store_client import StoreClient

    return StackAnswerer(SealedStore(StoreClient(host, port), Seal(secret)), component, rank)


@dataclass(frozen=True)
class StackAsker:
    """`ask_stacks` on `store`, waiting at most `timeout_s` for the answers."""

    store: object
    timeout_s: float

    def __call__(self, workers: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        return ask_stacks(self.store, workers, self.timeout_s)


def stack_asker(store, heartbeat_interval_s: float) -> StackAsker:
    """Ask through `store`, waiting as long as a worker takes to answer (ANSWER_BEATS beats)."""
    return StackAsker(store, ANSWER_BEATS * heartbeat_interval_s)


def ask_stacks(store, workers: list[tuple[str, int]], timeout_s: float) -> dict[tuple[str, int], str]:
    """Ask each (component, rank) for its stacks, through `store` (a `SealedStore`);
    (component, rank) → stack text of those that answered within `timeout_s` (a worker answers at
    its next heartbeat)."""
    asked = {worker: store.add(request_key(*worker), 1) for worker in workers}
    answers: dict[tuple[str, int], str] = {}
    deadline = time.monotonic() + timeout_s
    while len(answers) < len(asked) and time.monotonic() < deadline:
        for worker, number in asked.items():
            value = None if worker in answers else store.peek(reply_key(*worker))
            if value is None:
                continue
            answer = json.loads(value)
            if answer["request"] >= number:
                answers[worker] = answer["stacks"]
        time.sleep(0.05)
    return answers

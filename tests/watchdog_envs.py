"""Envs for tests/test_watchdog_failure.py, reachable as entry points (`tests.watchdog_envs:...`).

`CorruptingHeartbeat` breaks the heartbeat its own worker process publishes through the real
store: the record keeps the identity and types the store checks (a malformed one is rejected
there and never reaches the judgement), but its `phase_max_s` becomes a list, which the
watchdog's deadline check cannot use — a record from a recorder with another idea of the format;
`RaisingLate` sleeps in a step, writes the wall time to a file and raises right after.
For tests/test_watchdog_judgement.py: `HangingConstructor` never returns from its constructor (a
simulator waiting for a licence server), with `subprocesses_only` only in an async vector env's
subprocesses; `Computing` computes for `busy_s`, reading the process
CPU clock as it goes (a real system call), once per process: in its constructor (a scene load),
its first step (a JIT warm-up) or its `at_step`-th step (a hard simulator step), then is CartPole
(with `subprocesses_only`, only in an async vector env's subprocesses);
`SpinningFirstStep` waits forever in its first step by polling (a spin-wait: CPU, one line)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import socket
import time
from pathlib import Path

from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from fleetrl.probe import flight_recorder


class CorruptingHeartbeat(CartPoleEnv):
    def __init__(self, after_steps: int = 50, **kwargs):
        super().__init__(**kwargs)
        self.after_steps, self.steps = after_steps, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.after_steps:
            recorder = flight_recorder.current()
            record = recorder.record
            recorder.record = lambda: {**record(), "phase_max_s": ["not", "a", "mapping"]}
        return super().step(action)


class RaisingLate(CartPoleEnv):
    def __init__(self, raised_at_file: str = "", after_steps: int = 50, sleep_s: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.raised_at_file, self.after_steps, self.sleep_s, self.steps = raised_at_file, after_steps, sleep_s, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.after_steps:
            time.sleep(self.sleep_s)
            Path(self.raised_at_file).write_text(repr(time.time()))
            raise RuntimeError("the simulator gave up")
        return super().step(action)


class HangingConstructor(CartPoleEnv):
    def __init__(self, subprocesses_only: bool = False, **kwargs):
        super().__init__(**kwargs)
        while not (subprocesses_only and in_main_process()):
            time.sleep(3600)


def in_main_process() -> bool:
    """Not a subprocess of an async vector env (which builds one env in its own process too)."""
    return multiprocessing.parent_process() is None


class Computing(CartPoleEnv):
    computed_in_this_process = False  # once per process, not once per sub-env of the vector env

    def __init__(
        self,
        busy_s: float = 60.0,
        at_step: int = 1,
        in_constructor: bool = False,
        in_reset: bool = False,
        subprocesses_only: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.busy_s, self.at_step, self.steps, self.in_reset = busy_s, at_step, 0, in_reset
        Computing.computed_in_this_process |= subprocesses_only and in_main_process()
        if in_constructor:
            self.compute()

    def reset(self, *, seed=None, options=None):
        if self.in_reset:  # a scene loaded lazily, on the first reset
            self.compute()
        return super().reset(seed=seed, options=options)

    def compute(self) -> None:
        if not Computing.computed_in_this_process:
            Computing.computed_in_this_process = True
            spent = time.process_time() + self.busy_s  # CPU seconds: a loaded host's steal is not work
            deadline = time.monotonic() + 3 * self.busy_s  # ... but never more than this
            while time.process_time() < spent and time.monotonic() < deadline:
                sum(range(1_000))  # computation in the calling thread, the CPU clock read between

    def step(self, action):
        self.steps += 1
        if self.steps == self.at_step:
            self.compute()
        return super().step(action)


class SpinningFirstStep(CartPoleEnv):
    """The first step waits for something that never comes by polling: `time.sleep(0)` in a loop
    (`poll: sleep`), a non-blocking socket read (`poll: socket`), `select` with a zero timeout
    (`poll: select`) or `os.sched_yield()` (`poll: yield`), using CPU at one line."""

    spin_in_this_process = True  # once per process, not once per sub-env of the vector env

    def __init__(self, poll: str = "sleep", **kwargs):
        super().__init__(**kwargs)
        self.poll = poll

    def step(self, action):
        if SpinningFirstStep.spin_in_this_process:
            SpinningFirstStep.spin_in_this_process = False
            ready = False
            if self.poll == "sleep":
                while not ready:
                    time.sleep(0)
            elif self.poll == "select":
                while not ready:
                    ready = bool(select.select([], [], [], 0)[0])
            elif self.poll == "yield":
                while not ready:
                    os.sched_yield()
            else:
                never, _peer = socket.socketpair()  # nothing is ever sent on it
                never.setblocking(False)
                while not ready:
                    with contextlib.suppress(BlockingIOError):
                        ready = bool(never.recv(1))
        return super().step(action)

"""Fault injection (`debug.fault`), to rehearse failures on purpose and to test fleetrl's diagnosis.

    debug:
      fault: {kind: kill, component: actor, rank: 1, method: train, call: 3}

fires on the 3rd call of `train` on actor rank 1. Kinds:
  kill              SIGKILL the worker process
  stop              SIGSTOP it (frozen, not dead)
  exception         raise an error inside the worker
  hang              block forever in a sleep (a simulator that never returns; the GIL is free)
  gil_hang          spin forever in C code holding the GIL (heartbeats stop too)
  extra_collective  (actor) after the call, an all_reduce that no other rank makes
  extra_step        (actor) train twice: one rank doing more optimisation steps than the others
"""

from __future__ import annotations

import os
import signal
import time

import torch

from fleetrl.errors import ConfigError

KINDS = ("kill", "stop", "exception", "hang", "gil_hang", "extra_collective", "extra_step")
DEFAULT_METHOD = {"env": "step", "rollout": "act", "actor": "train"}


class InjectedFault(RuntimeError):
    """The error raised by `kind: exception`."""


def check_fault(fault: dict) -> None:
    if not fault:
        return
    unknown = set(fault) - {"kind", "component", "rank", "method", "call"}
    if unknown:
        raise ConfigError(f"debug.fault.{sorted(unknown)[0]}", fault, "keys kind, component, rank, method, call")
    if fault.get("kind") not in KINDS:
        raise ConfigError("debug.fault.kind", fault.get("kind"), f"one of {list(KINDS)}")
    if fault.get("component") not in DEFAULT_METHOD:
        raise ConfigError("debug.fault.component", fault.get("component"), f"one of {list(DEFAULT_METHOD)}")


class FaultPlan:
    """Decides, per method call of one worker, whether the configured fault fires now."""

    def __init__(self, fault: dict, component: str, rank: int):
        self.armed = bool(fault) and fault["component"] == component and fault.get("rank", 0) == rank
        self.kind = fault.get("kind")
        self.method = fault.get("method", DEFAULT_METHOD.get(component))
        self.call = fault.get("call", 1)
        self.calls = 0

    def fires(self, method: str) -> bool:
        if not self.armed or method != self.method:
            return False
        self.calls += 1
        return self.calls == self.call


def inject_before(kind: str, where: str) -> None:
    """Faults that strike before the method runs."""
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "exception":
        raise InjectedFault(f"injected fault (debug.fault) in {where}")
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "gil_hang":
        sum(range(10**15))  # one C call that never yields the GIL


def inject_extra_collective() -> None:
    """After the method: one all_reduce more than the other ranks make."""
    from fleetrl.parallel import reduce

    reduce.all_reduce_sum(torch.zeros(7))

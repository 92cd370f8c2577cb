"""User networks that fail under DDP: a head never used on any rank
(`tests.fault_models:UnusedHeadNet`), one dropped by one actor rank mid-training
(`tests.fault_models:HeadDroppingNet`), and a cross-rank sync of their own that one rank enters
with another size (`tests.fault_models:StatSyncingNet`, whose diverging rank may also fall silent
as it is built); and one that tells a test it is in the
middle of an update (`tests.fault_models:MidUpdateNet`), for a signal sent there; and one whose
update fails only once a collection is known to be under way (`tests.fault_models:FailsOnMarkNet`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

from fleetrl.probe import flight_recorder


class UnusedHeadNet(nn.Module):
    def __init__(self, observation_space, num_action_params):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, num_action_params), nn.Linear(32, 1)
        self.forgotten_head = nn.Linear(32, 5)  # built, never used in forward

    def forward(self, obs: torch.Tensor):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class HeadDroppingNet(nn.Module):
    """Seed 2's trap: an actor-critic whose actor rank `on_rank` stops using its value head from
    its `drop_at`-th training forward (a branch on local data), computing values from the body."""

    def __init__(self, observation_space, num_action_params, drop_at: int = 20, on_rank: int = 1):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, num_action_params), nn.Linear(32, 1)
        self.drop_at, self.calls = drop_at, 0
        self.drops = (os.environ.get("FLEETRL_COMPONENT"), os.environ.get("FLEETRL_RANK")) == ("actor", str(on_rank))

    def forward(self, obs: torch.Tensor):
        h = self.body(obs)
        if self.drops and torch.is_grad_enabled():
            self.calls += 1
            if self.calls >= self.drop_at:
                return self.pi(h), h.mean(-1)  # the value head is left out
        return self.pi(h), self.v(h).squeeze(-1)


class StatSyncingNet(nn.Module):
    """A user's own cross-rank sync in forward: an actor-critic that all-reduces the batch mean of
    its 32 hidden features over the actor ranks on every training forward (as a hand-written
    SyncBatchNorm would), whose actor rank `on_rank` from its `diverge_at`-th training forward
    reduces only the first (a branch on local data). Gloo aborts the rank that receives more bytes
    than its own collective expects: `on_rank`, which diverged. With `silent`, that rank's
    heartbeat thread stops as the model is built (in actor.construct), as one that gets no turn on
    a loaded host: its last heartbeat predates every call it runs after."""

    def __init__(
        self, observation_space, num_action_params, diverge_at: int = 3, on_rank: int = 1, silent: bool = False
    ):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, num_action_params), nn.Linear(32, 1)
        self.diverge_at, self.calls = diverge_at, 0
        self.diverges = (os.environ.get("FLEETRL_COMPONENT"), os.environ.get("FLEETRL_RANK")) == ("actor", str(on_rank))
        if silent and self.diverges:
            flight_recorder.current().stop()

    def forward(self, obs: torch.Tensor):
        h = self.body(obs)
        if torch.is_grad_enabled() and torch.distributed.is_initialized():
            self.calls += 1
            mean = h.detach().mean(0)
            if self.diverges and self.calls >= self.diverge_at:
                mean = mean[:1]
            torch.distributed.all_reduce(mean)
        return self.pi(h), self.v(h).squeeze(-1)


class MidUpdateNet(nn.Module):
    """An actor-critic that, at its `at`-th training forward (gradients on) in a process, writes the
    file `marker` and waits there until the file is gone (at most `hold_s`): a test that sees the
    file knows the update is under way and sends its signal while the update waits, then removes
    the file. Its arithmetic is that of any small MLP: a run whose marker never fires (`at: 0`)
    is its uninterrupted twin."""

    def __init__(self, observation_space, num_action_params, marker: str = "", at: int = 0, hold_s: float = 60.0):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, num_action_params), nn.Linear(32, 1)
        self.marker, self.at, self.hold_s, self.calls = Path(marker), at, hold_s, 0

    def forward(self, obs: torch.Tensor):
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.at:
                self.hold_while_marked()
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)

    def hold_while_marked(self) -> None:
        written = self.marker.with_name(f"{self.marker.name}.{os.getpid()}")
        written.write_text(str(os.getpid()))
        written.replace(self.marker)
        deadline = time.monotonic() + self.hold_s
        while self.marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


class UpdateFailed(RuntimeError):
    """The error `FailsOnMarkNet` raises."""


class FailsOnMarkNet(nn.Module):
    """An actor-critic whose actor rank `on_rank` fails its first training forward (gradients on),
    but only once the file `marker` exists, waiting for it at most `wait_s`: beside an env that
    writes the marker at the first step of the next collection (tests/envs.py `MarksACollection`),
    an update that fails while the overlapped collection is under way, whatever the host's load.
    It raises `UpdateFailed` either way, its message saying whether the marker was seen."""

    def __init__(self, observation_space, num_action_params, marker: str = "", on_rank: int = 1, wait_s: float = 60.0):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], 32), nn.Tanh())
        self.pi, self.v = nn.Linear(32, num_action_params), nn.Linear(32, 1)
        self.marker, self.wait_s = Path(marker), wait_s
        self.fails = (os.environ.get("FLEETRL_COMPONENT"), os.environ.get("FLEETRL_RANK")) == ("actor", str(on_rank))

    def forward(self, obs: torch.Tensor):
        if self.fails and torch.is_grad_enabled():
            deadline = time.monotonic() + self.wait_s
            while not self.marker.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.marker.exists():
                raise UpdateFailed("the update failed while the next collection was under way")
            raise UpdateFailed(f"{self.marker} was not written within {self.wait_s:g} s: no collection began")
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)

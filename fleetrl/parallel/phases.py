"""Loss paths for algorithms whose phases train different parameter subsets.

A head trained in one phase only (an auxiliary value head) gets no gradient in the others. One DDP
wrapper over the whole policy would wait, in every other phase's backward, for a gradient that
never comes (and error on the next forward); `find_unused_parameters=True` avoids that by walking
the autograd graph after every forward and all-reducing zeros for the unused parameters, on every
step of every phase. Here each phase gets its own DDP wrapper instead:

- `PhaseView(policy, phase)` is the policy seen through one loss path (`phase(policy, *args)`: its
  `forward`, or an auxiliary phase's function) — a thin module, so the same parameters can sit
  under two DDP wrappers;
- each wrapper is told which parameters its phase never reaches (DDP's per-module ignore list),
  found by `unused_parameters`: one local forward/backward of the phase's outputs on a probe
  batch before anything is wrapped — the same graph, hence the same answer, on every rank;
- a parameter that no phase reaches is an error naming it, before any collective.

Two DDP wrappers over shared parameters are safe as long as each backward follows a forward of
exactly one of them (DDP arms its gradient hooks in its own forward; the other wrapper's hooks
stay idle) and every rank calls them in the same order — which the phase schedule guarantees,
being a function of the iteration count alone. Both phases' gradients are all-reduced.
(The auxiliary-phase benchmark on docs/benchmarks.md measures what this saves against
`find_unused_parameters=True`.)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch
from torch import nn

from fleetrl.parallel.wrap import LossPath, ddp

log = logging.getLogger("fleetrl")

Phase = Callable[..., tuple]  # phase(policy, *args): the phase's loss-path outputs


class PhaseView(nn.Module):
    """`policy` seen through one phase: `forward(*args)` = `phase(policy, *args)`."""

    def __init__(self, policy: nn.Module, phase: Phase):
        super().__init__()
        self.policy = policy
        self.phase = phase

    def forward(self, *args):
        return self.phase(self.policy, *args)


def unused_parameters(policy: nn.Module, outputs: Callable[[nn.Module], tuple]) -> list[str]:
    """Names of `policy`'s trainable parameters that none of `outputs(policy)` depends on (one
    local forward and backward; gradients are left as they were)."""
    named = [(name, p) for name, p in policy.named_parameters() if p.requires_grad]
    saved = [p.grad for _, p in named]
    for _, p in named:
        p.grad = None
    try:
        total = sum(out.float().sum() for out in outputs(policy) if out is not None and out.requires_grad)
        if isinstance(total, torch.Tensor):
            total.backward()
        return [name for name, p in named if p.grad is None]
    finally:
        for (_, p), grad in zip(named, saved):
            p.grad = grad


def local_phase_path(policy: nn.Module, phase: Phase, ignored) -> LossPath:
    """One rank: the phase called directly, no collective."""
    return LossPath(PhaseView(policy, phase), policy, "local", contextlib.nullcontext, frozenset(ignored))


def ddp_phase_path(policy: nn.Module, phase: Phase, ignored, device: torch.device) -> LossPath:
    """DDP around `PhaseView(policy, phase)`, ignoring the parameters named in `ignored` (which
    this phase never reaches): only the phase's own parameters are reduced, and none is waited for."""
    view = PhaseView(policy, phase)
    names = {f"policy.{name}" for name in ignored}
    # DDP reads this (private) list from the module it wraps (the documented effect of
    # DistributedDataParallel._set_params_and_buffers_to_ignore_for_model, without that helper's
    # marking of the parameters themselves, which would follow them into the other wrapper).
    view._ddp_params_and_buffers_to_ignore = sorted(names)
    wrapped = ddp(view, device)
    if names and getattr(wrapped, "parameters_to_ignore", None) != names:
        # a torch whose DDP no longer reads the list: the public option, which finds the unused
        # parameters after every forward instead (slower, same gradients). Every rank runs the
        # same torch, so every rank takes this branch and wraps again together.
        log.warning("DDP did not take the list of parameters to ignore: find_unused_parameters=True instead")
        wrapped = ddp(view, device, find_unused_parameters=True)
    return LossPath(wrapped, policy, "ddp", wrapped.no_sync, frozenset(ignored))

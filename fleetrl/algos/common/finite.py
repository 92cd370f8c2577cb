"""An update's numbers stay finite: its loss, its gradients before clipping, its parameters after.

`UpdateChecks` watches one update (a `train` call's gradient steps) without a host sync per step:
each step's loss terms and per-parameter gradient norms stay tensors in lists — the norms are the
ones gradient clipping computes anyway (`norms_of`), handed on to it; the loss terms are the ones
the update sums for its metrics (`loss_table`, stacked once for both) — and `verify`, at the
update's end, where the update reads its metrics anyway, sums them all with the parameters' norms
(one pass over the trainable weights) in float64 and reads the sum in one host sync: a handful of
device operations, whatever the number of steps. The sum is finite exactly when every value is
(float32 values cannot overflow a float64 sum; where float64 ones do, the values are looked at one
by one before anything is said). Only when it is not finite are the steps looked at. The first
non-finite value raises `NonFiniteError`
naming the loss term or the parameters and the gradient step (1-based, of this update) — the loss
where its step is as early as the gradients' (a NaN loss makes NaN gradients: the loss is the
cause). Nothing in between reaches a checkpoint: the controller saves only after an update has
returned.

Without gradient clipping (`max_grad_norm: 0`) there are no norms to share, and a check of its
own per step cost 3.5 % of RL-Zoo's CartPole update on the CPU (one small operator per parameter
tensor: benchmarks/costs/non_finite_checks.py, its update without clipping): the gradients are then
not looked at step by step. A non-finite gradient reaches the parameters through the optimizer step (Adam turns
it into NaN weights), and shows as the next step's non-finite loss, or as the parameters after the
update; the message says that the gradients were not checked.

With several ranks, gradients are reduced: one rank's NaN loss gives every rank NaN gradients at
that step (and NaN losses after it). The rank whose own loss went non-finite no later than its
gradients is the cause: `evidence()` says so, and whether this rank's gradients went non-finite,
as two numbers the update adds to the all-reduce it makes anyway; `verify(evidence=...)` with
their sums lets the other ranks return and leave the report to the cause. Reduced gradients that
went non-finite on every rank (an exploding gradient under DDP: the same on all) are named by rank
0 alone, so that one report names them whatever rank's error arrives first; where only some ranks
see them (FSDP's shards), each of those reports.

Cost: benchmarks/costs/non_finite_checks.py measures it against the update it watches.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fleetrl.non_finite import NonFiniteError

MAX_NAMED = 4  # parameters named in one message, the rest counted
NEVER = math.inf  # the gradient step of something that never went non-finite


class UpdateChecks:
    """One update's non-finite checks (module docstring). `module`: what the update trains (its
    trainable parameters are checked after it, and name the gradients); `terms`: the names of the
    loss terms `loss` is given, in order; `update`: what the messages call the update; this is
    actor rank `rank` of `ranks`."""

    def __init__(
        self,
        module: nn.Module,
        terms: tuple[str, ...],
        update: str,
        rank: int = 0,
        ranks: int = 1,
        params: list[torch.Tensor] | None = None,
    ):
        self.module, self.terms, self.update, self.rank, self.ranks = module, terms, update, rank, ranks
        # `params`: the module's trainable parameters where the update has listed them already
        self.params = [p for p in module.parameters() if p.requires_grad] if params is None else params
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.losses: list[torch.Tensor] = []  # each piece's detached loss terms
        self.stacked: torch.Tensor | None = None  # ... stacked, once asked for (`loss_table`)
        self.loss_steps: list[int] = []  # ... and its gradient step
        self.norms: list[torch.Tensor] = []  # each step's per-parameter gradient norms
        self.norm_steps: list[int] = []  # ... its gradient step
        self.norm_params: list[list[torch.Tensor]] = []  # ... and the parameters they are of

    def loss(self, terms: torch.Tensor, grad_step: int) -> None:
        """This piece's detached loss terms (in `terms` order), for gradient step `grad_step`."""
        self.losses.append(terms)
        self.loss_steps.append(grad_step)
        self.stacked = None

    def loss_table(self) -> torch.Tensor:
        """(pieces, terms): every piece's loss terms so far, stacked once — the update sums them
        for its metrics, `verify` checks the same tensor. Every piece gives the same terms."""
        if self.stacked is None:
            self.stacked = torch.stack(self.losses)
        return self.stacked

    def gradient_norms(self, params: list[torch.Tensor], grad_step: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Record gradient step `grad_step`'s gradients before clipping; returns (the gradients,
        their norms stacked), which clipping takes (`LossPath.clip_grad_norm_(..., norms=)`)."""
        grads = [p.grad for p in params if p.grad is not None]
        with_grad = params if len(grads) == len(params) else [p for p in params if p.grad is not None]
        norms = norms_of(grads)
        self.norms.append(norms)
        self.norm_steps.append(grad_step)
        self.norm_params.append(with_grad)
        return grads, norms

    def first_steps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(first gradient step with a non-finite loss term, ... with a non-finite gradient), 0-dim
        float64 tensors on the device (`NEVER` for none), without a host sync."""
        grads = first_bad_step(self.norms, self.norm_steps, self.device)
        return first_bad_step(self.losses, self.loss_steps, self.device), grads

    def evidence(self) -> torch.Tensor:
        """[1.0 where this rank's own loss turned non-finite at a gradient step no later than its
        gradients did (this rank is the cause), 1.0 where its gradients went non-finite] (float64),
        without a host sync: the update sums it over ranks in its final all-reduce and hands the
        sum to `verify`. (Zeros at once with one rank, which has no other to leave the report to.)"""
        if self.ranks == 1:
            return torch.zeros(2, dtype=torch.float64, device=self.device)
        loss_step, grad_step = self.first_steps()
        loss_first = (loss_step <= grad_step) & (loss_step < NEVER)
        return torch.stack([loss_first, grad_step < NEVER]).to(torch.float64)

    def verify(self, evidence: torch.Tensor | None = None) -> None:
        """Raise `NonFiniteError` for the first non-finite loss term, gradient or parameter of the
        update (see the module docstring); `evidence`: `evidence()` summed over ranks, where there
        are several. Every value of the update summed in float64 and one host sync: the sum is
        finite exactly when every value is, unless large finite float64 values overflow it (float32
        ones cannot); only when it is not finite are the steps looked at, element by element."""
        with torch.no_grad():
            watched = [norms_of(self.params)]
        if self.losses:
            watched += [self.loss_table().reshape(-1)] if same_shapes(self.losses) else self.losses
        if self.norms:
            watched += [torch.stack(self.norms).reshape(-1)] if same_shapes(self.norms) else self.norms
        total = torch.cat([t.to(self.device).reshape(-1) for t in watched]).sum(dtype=torch.float64)
        if evidence is None or self.ranks == 1:
            total, loss_causes, gradient_ranks = total.item(), 0.0, 0.0  # the one host sync
        else:
            ranks = evidence.reshape(2).to(self.device, torch.float64)
            total, loss_causes, gradient_ranks = torch.cat([total.reshape(1), ranks]).tolist()  # the one host sync
        if math.isfinite(total):
            return
        loss_step, grad_step = (step.item() for step in self.first_steps())
        if loss_step < NEVER and loss_step <= grad_step:
            raise self.loss_error(int(loss_step))
        if loss_causes > 0:
            return  # another rank's NaN loss reached this rank's gradients through the reduction: it names it
        if grad_step < NEVER:
            if self.rank != 0 and gradient_ranks == self.ranks:
                return  # every rank holds the same reduced gradients (DDP): rank 0 names them
            raise self.gradient_error(int(grad_step))
        error = self.parameter_error()
        if error is not None:
            raise error
        # every value finite: large ones overflowed the sum

    def loss_error(self, step: int) -> NonFiniteError:
        terms = self.losses[self.loss_steps.index(step)]
        where = f"gradient step {step} of {self.update}"
        if step > 1 and not self.norms:  # no clipping: the steps' gradients were not looked at
            where += (
                "; without gradient clipping the gradients are not checked step by step: a non-finite gradient "
                "at an earlier step shows first here, in the loss of the parameters it made non-finite"
            )
        for name, value in zip(self.terms, terms.tolist()):
            if not math.isfinite(value):
                return NonFiniteError("loss", name, value, where)
        raise AssertionError("no non-finite loss term")  # pragma: no cover

    def gradient_error(self, step: int) -> NonFiniteError:
        at = self.norm_steps.index(step)
        norms, params = self.norms[at], self.norm_params[at]
        bad = (~torch.isfinite(norms)).nonzero().flatten().tolist()
        where = f"its norm, at gradient step {step} of {self.update}, before clipping"
        return NonFiniteError("gradient", self.named([params[i] for i in bad]), norms[bad[0]].item(), where)

    def parameter_error(self) -> NonFiniteError | None:
        with torch.no_grad():
            norms = norms_of(self.params)
        bad = (~torch.isfinite(norms)).nonzero().flatten().tolist()
        if not bad:
            return None
        steps = max(self.loss_steps + self.norm_steps, default=0)
        where = f"its norm, after gradient step {steps} of {self.update}"
        return NonFiniteError("parameter", self.named([self.params[i] for i in bad]), norms[bad[0]].item(), where)

    def named(self, params: list[torch.Tensor]) -> str:
        names = {id(p): name for name, p in self.module.named_parameters()}
        listed = [names.get(id(p), "<unnamed>") for p in params]
        more = f" and {len(listed) - MAX_NAMED} more" if len(listed) > MAX_NAMED else ""
        return ", ".join(listed[:MAX_NAMED]) + more


def norms_of(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of each tensor, stacked: one multi-tensor kernel, the one gradient clipping runs
    (`fleetrl.parallel.wrap.clip_grad_norm_`); of a sharded tensor (FSDP's DTensor) this rank's
    shard."""
    if not tensors:
        return torch.zeros(0)
    if type(tensors[0]) is not torch.Tensor:  # DTensor shards
        tensors = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return torch.stack(torch._foreach_norm(tensors))


def same_shapes(tensors: list[torch.Tensor]) -> bool:
    return all(t.shape == tensors[0].shape for t in tensors)


def first_bad_step(tensors: list[torch.Tensor], steps: list[int], device: torch.device) -> torch.Tensor:
    """The first of `steps` whose tensor holds a non-finite value, as a 0-dim float64 tensor on
    `device` (`NEVER` for none), without a host sync: one stacked reduction where the tensors have
    one shape (every step's: the common case), one per tensor otherwise."""
    if not tensors:
        return torch.tensor(NEVER, dtype=torch.float64, device=device)
    if same_shapes(tensors):
        bad = ~torch.isfinite(torch.stack(tensors).reshape(len(tensors), -1)).all(1)
    else:
        bad = torch.stack([~torch.isfinite(t).all() for t in tensors])
    numbers = torch.tensor(steps, dtype=torch.float64, device=device)
    return torch.where(bad.to(device), numbers, NEVER).min()

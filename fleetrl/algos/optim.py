"""The optimizer every actor uses, and a faster step for it.

`build_optimizer`: `actor.optimizer` (Adam or AdamW) with `actor.adam_eps` and
`actor.weight_decay`, over parameter groups that carry their own learning rate (PPO: one group at
`algorithm.lr`; SAC: critics, actor and temperature at theirs). Always torch's fused kernel: one
call for all parameters of a group, 2.5x faster than `foreach` on a 64x64 MLP here.
"""

from __future__ import annotations

import torch

from fleetrl.config.schema import ActorConfig


def build_optimizer(config: ActorConfig, groups: list[dict]) -> torch.optim.Optimizer:
    """Adam(W) over `groups` ([{'params': [...], 'lr': ...}, ...]) with the fused kernel."""
    optimizer_class = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return optimizer_class(groups, eps=config.adam_eps, weight_decay=config.weight_decay, fused=True)


class FusedAdamStep:
    """`optimizer.step()` of a fused torch Adam/AdamW without its per-call Python bookkeeping
    (parameter-group scans, state checks, device grouping: ~150 µs a call here, against ~10 µs for
    the fused kernel itself): the same two kernels — step counters += 1, then `_fused_adam(w)_` —
    on tensor lists cached after the first step. Bitwise the same result; the optimizer object
    keeps the state (checkpoints as usual; call `reset` after loading one)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.groups: list | None = None

    def reset(self) -> None:
        self.groups = None

    def __call__(self) -> None:
        if self.groups is None:
            self.optimizer.step()  # creates the state
            self.groups = []
            for group in self.optimizer.param_groups:
                state = [self.optimizer.state[p] for p in group["params"]]
                fused = torch._fused_adamw_ if group.get("decoupled_weight_decay") else torch._fused_adam_
                self.groups.append(
                    (
                        group,
                        fused,
                        list(group["params"]),
                        [s["exp_avg"] for s in state],
                        [s["exp_avg_sq"] for s in state],
                        [s["step"] for s in state],
                    )
                )
            return
        for group, fused, params, exp_avgs, exp_avg_sqs, steps in self.groups:
            grads = [p.grad for p in params]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            fused(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                amsgrad=False,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )

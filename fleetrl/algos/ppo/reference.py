"""The KL penalty to a reference policy (`algorithm.kl_coef`): what holds RL near the policy the run
started from (`runner.init_from`, e.g. a supervised stage's), as RLHF's KL to the SFT model and
verl's `use_kl_loss`.

The reference is a frozen copy of the policy taken once, right after `runner.init_from`'s weights
are loaded: in eval mode, without gradients, never wrapped for several ranks (each rank holds its
own copy and computes the reference log-probs of its own pieces). It lives in the checkpoint beside
the policy, so a resumed run penalises against the very weights its first start loaded, whatever
has since happened to the run it was initialised from.

Per sample the penalty is the k3 estimator of KL(π ‖ π_ref) on the taken action,

    k3 = exp(d) − d − 1,   d = log π_ref(a|s) − log π(a|s),

at the level the PPO ratio uses (`algorithm.logprob_type`: per token, action or chunk, averaged
over the executed pieces). With the action sampled from π it is unbiased, always ≥ 0 (unlike k1 = −d,
which is negative for half the samples and so has a high variance per sample), and its gradient
vanishes where π = π_ref (Schulman 2020, "Approximating KL divergence"; verl's `low_var_kl`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def frozen_copy(policy: nn.Module) -> nn.Module:
    """A copy of `policy` (the plain module, not a DDP wrapper) that never trains: eval mode, no
    parameter requires a gradient."""
    reference = copy.deepcopy(policy)
    reference.eval()
    reference.requires_grad_(False)
    return reference


def k3(reference_logprobs: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """Per piece exp(d) − d − 1 with d = reference − policy log-prob: the k3 estimate of KL(π ‖ π_ref)."""
    log_ratio = reference_logprobs - logprobs
    return log_ratio.exp() - log_ratio - 1

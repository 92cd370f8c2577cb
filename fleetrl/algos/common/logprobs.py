"""How a policy's log-probs and entropies become probability ratios: per token, per action
or per chunk, over the actions that were executed.

A policy returns one log-prob per sample (B,), or finer ones: per token (B, D) for a token
policy (`model.action_bins`, D tokens per action), per action of a chunk (B, K) with
`model.action_chunk` K > 1, or per token of each chunk action (B, K, D). A chunk may be cut short
by the episode's end: only its first k actions ran (`Trajectory.steps`). The actions after them
never reached the env, so they take no part in the ratio — the executed prefix's probability is
the product of its actions' (the chunk's actions are decoded independently given the
observation, or autoregressively: either way the prefix's log-prob is the sum of its actions').

`algorithm.logprob_type` (and `entropy_type` alike):
  chunk_level   one ratio per decision: Σ over the executed actions and their tokens
  action_level  one ratio per executed action (Σ over its tokens), each clipped against the
                decision's advantage; the decision's loss is their mean (without chunks: one
                action, the same as chunk_level)
  token_level   one ratio per executed token, clipped; the decision's loss is their mean

The result is (log-probs, old log-probs, entropy, weights): log-probs and entropy (B,) or (B, M)
with `weights` (B, M) summing to 1 over each row (the executed pieces' share; None: the plain
mean over M), so that the loss, the KL and the clip fraction average over exactly the executed
pieces.
"""

from __future__ import annotations

import torch

Level = str  # "chunk_level" | "action_level" | "token_level"


def executed_mask(steps: torch.Tensor, chunk: int) -> torch.Tensor:
    """(B,) executed env steps of each decision → (B, K) bool: action j of the chunk ran."""
    return torch.arange(chunk, device=steps.device) < steps.unsqueeze(-1)


def combine(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    entropy: torch.Tensor,
    steps: torch.Tensor | None,
    logprob_level: Level,
    entropy_level: Level,
):
    """See the module docstring. `steps` (B,): env steps each decision executed (chunk
    policies), None without chunks — then axis 1 onwards are tokens of one action."""
    if logprobs.dim() == 1:
        return logprobs, old_logprobs, entropy, None
    if steps is None:  # (B, D): tokens of one action
        unit = logprobs.unsqueeze(1)
        mask = torch.ones(unit.shape[:2], dtype=torch.bool, device=unit.device)
    else:  # (B, K) or (B, K, D)
        unit = logprobs if logprobs.dim() == 3 else logprobs.unsqueeze(-1)
        mask = executed_mask(steps, unit.shape[1])
    shape = unit.shape

    def at(level: Level, values: torch.Tensor):
        """`values` (shaped like the log-probs) at `level`: summed or kept, and their weights."""
        values = values.reshape(shape) * mask.unsqueeze(-1)
        if level == "chunk_level" or (level == "action_level" and shape[1] == 1):
            return values.sum((1, 2)), None
        if level == "action_level":
            pieces, piece_mask = values.sum(2), mask
        else:
            pieces, piece_mask = values.flatten(1), mask.unsqueeze(-1).expand(shape).flatten(1)
        if steps is None:
            return pieces, None  # every piece counts: the plain mean
        weights = piece_mask.float()
        return pieces, weights / weights.sum(-1, keepdim=True)

    new, weights = at(logprob_level, logprobs)
    old, _ = at(logprob_level, old_logprobs)
    entropy, entropy_weights = at(entropy_level, entropy)
    if entropy.dim() > 1:
        entropy = per_sample(entropy, entropy_weights)
    return new, old, entropy, weights


def per_sample(value: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """(B,) as is; (B, M) pieces averaged with their `weights` (None: the plain mean)."""
    if value.dim() == 1:
        return value
    return value.mean(-1) if weights is None else (value * weights).sum(-1)


def decision_logprob(logprobs: torch.Tensor, steps: torch.Tensor | None) -> torch.Tensor:
    """(B,) the log-probability of each decision's executed part — Σ over its executed actions
    and their tokens (`chunk_level`): what behaviour cloning maximises for a demonstrated chunk."""
    return combine(logprobs, logprobs, logprobs, steps, "chunk_level", "chunk_level")[0]


def executed_mean(values: torch.Tensor, steps: torch.Tensor | None) -> torch.Tensor:
    """(B,) the mean of per-action `values` — (B,), or (B, K) with chunks — over each decision's
    executed actions: a continuous head's supervised loss of a demonstrated chunk."""
    if values.dim() == 1:
        return values
    if steps is None:
        return values.mean(-1)
    mask = executed_mask(steps, values.shape[1]).float()
    return (values * mask).sum(-1) / mask.sum(-1)

"""`LossOutputs`: what every policy's loss path (`forward(obs, actions)`) returns — fleetrl's own
`Policy`, the Hugging Face `VLAPolicy` — in a module of its own, so that both import it without
importing each other."""

from __future__ import annotations

from typing import NamedTuple

import torch


class LossOutputs(NamedTuple):
    """The loss path's outputs: what a loss reads of the policy on a batch of (obs, actions)."""

    logprobs: torch.Tensor  # of the actions: (B,), per token (B, K), per chunk action (B, K[, d])
    entropy: torch.Tensor  # the action distribution's, shaped as logprobs
    value: torch.Tensor  # (B,)
    prediction_error: torch.Tensor | None  # (B,) with an auxiliary prediction (model.predict_keys), else None


class ImitationOutputs(NamedTuple):
    """A continuous action head's supervised outputs (`forward(obs, actions, imitation=True)`: the
    L1 and flow heads of `model.id: hf`), what `fleetrl sft` minimises instead of a likelihood."""

    error: torch.Tensor  # the head's loss per chunk action: (B,), (B, K) with chunks
    value: torch.Tensor  # (B,)

"""Behaviour cloning's `algorithm` section (`algorithm.name: bc`, run by `fleetrl sft`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fleetrl.config.constraints import NonNegative, Positive
from fleetrl.config.schema import AlgorithmConfig


@dataclass
class BCConfig(AlgorithmConfig):
    """Behaviour cloning's own keys: the supervised stage (docs: guides/manipulation.md)."""

    demonstrations: str = ""
    """A folder of demonstrations (`fleetrl record`: index.json and one .npz per episode)."""
    updates_per_iteration: Annotated[int, Positive] = 50
    """Optimizer steps on demonstration minibatches per iteration."""
    vf_coef: Annotated[float, NonNegative] = 0.5
    """Weight of the value loss: the value head learns the demonstrations' discounted returns, so
    RL starts with a critic."""

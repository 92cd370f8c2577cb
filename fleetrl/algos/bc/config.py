"""Behaviour cloning's `algorithm` section (`algorithm.name: bc`, run by `fleetrl sft`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fleetrl.config.constraints import NonNegative, Positive
from fleetrl.config.schema import AlgorithmConfig


@dataclass
class BCConfig(AlgorithmConfig):
    demonstrations: str = ""  # a folder of demonstrations (`fleetrl record`: index.json + one .npz per episode)
    updates_per_iteration: Annotated[int, Positive] = 50  # optimizer steps on demonstration minibatches per iteration
    vf_coef: Annotated[float, NonNegative] = (
        0.5  # weight of the value loss (the value head learns the demonstrations' discounted returns: RL starts with a critic)
    )

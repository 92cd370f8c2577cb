"""Behaviour cloning's `algorithm` section (`algorithm.name: bc`, run by `fleetrl sft`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fleetrl.config.constraints import Check, NonNegative, Positive
from fleetrl.config.schema import AlgorithmConfig

# LeRobot refuses feature names with '/' (its episodes table's columns are 'stats/<feature>/...')
FeatureName = Check(lambda name: bool(name) and "/" not in name, "a dataset feature's name (not empty, no '/')", "")


@dataclass
class BCConfig(AlgorithmConfig):
    """Behaviour cloning's own keys: the supervised stage (docs: guides/manipulation.md)."""

    demonstrations: str = ""
    """A LeRobotDataset folder, v3.0 or v2.1 (`fleetrl record` writes v3.0; LeRobot's recorders
    and published datasets too)."""
    features: dict[str, Annotated[str, FeatureName]] = field(default_factory=dict)
    """The dataset feature each env observation key is read from, for the keys whose feature is not
    the one `fleetrl record` names (`task` for text, `observation.images.<key>` for a camera,
    `observation.<key>` otherwise), e.g. `{image: observation.images.top, instruction: task}`.
    `observation` names a whole observation that is one array (default: `observation.state`)."""
    action_feature: Annotated[str, FeatureName] = "action"
    """The dataset feature holding the action of each frame (its shape: the env's action space's)."""
    updates_per_iteration: Annotated[int, Positive] = 50
    """Optimizer steps on demonstration minibatches per iteration."""
    vf_coef: Annotated[float, NonNegative] = 0.5
    """Weight of the value loss: the value head learns the demonstrations' discounted returns, so
    RL starts with a critic."""

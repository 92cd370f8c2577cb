"""The rules of `model.action_head` (model.id hf): which keys each head reads, and what
contradicts it — checked before anything starts (`validate_action_head`, from plan/rules.py), and
once the env's spaces are known (`check_action_head_spaces`).

| key | tokens | l1 | flow |
| --- | --- | --- | --- |
| `decode`, `action_bins`, `temperature`, `top_k` | yes | no | no |
| `action_attention` | with `decode: parallel` | yes (the action positions) | no (the VLM reads the prompt alone) |
| `action_chunk`, `action_stats`, `lora`, `dtype`, ... | yes | yes | yes |
| `state_key` | no | yes | yes |
| `model.l1` / `model.flow` | no | `l1` | `flow` |
| `algorithm.logprob_type` / `entropy_type` | every level | `chunk_level`, `action_level` | `chunk_level`, `action_level` |

A key a head does not read, set to anything but its default, is exit 2 naming it (a value
silently ignored would be a run that differs from what was asked), and so is an ODE chain
(`model.flow.noise: ode`) for reinforcement learning: it has no log-probability.
"""

from __future__ import annotations

import dataclasses

from fleetrl.algos.registry import algorithm_spec
from fleetrl.config.model_sections import HfModelConfig
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError, nearest

TOKENS_ONLY = ("decode", "action_bins", "temperature", "top_k")  # the tokens head's alone


def validate_action_head(config: Config) -> None:
    model = config.model
    if config.debug.fault.get("kind") == "hang_in_denoising" and getattr(model, "action_head", None) != "flow":
        raise ConfigError(
            "debug.fault.kind", "hang_in_denoising", "another kind: only model.id hf with action_head flow denoises"
        )
    if model.id != "hf":
        return
    head, defaults = model.action_head, HfModelConfig()
    for section in ("flow", "l1"):
        if getattr(model, section) is not None and head != section:
            raise ConfigError(
                f"model.{section}",
                dataclasses.asdict(getattr(model, section)),
                f"null unless model.action_head is '{section}' (it is {head!r})",
            )
    if head == "tokens":
        if model.state_key != defaults.state_key:
            raise ConfigError(
                "model.state_key", model.state_key, f"its default ({defaults.state_key!r}) with action_head tokens",
                "the tokens head reads no proprioception: action_head l1 or flow does",
            )  # fmt: skip
        return
    for key in TOKENS_ONLY:
        if getattr(model, key) != getattr(defaults, key):
            raise ConfigError(
                f"model.{key}",
                getattr(model, key),
                f"its default ({getattr(defaults, key)!r}) with model.action_head {head!r}",
                "it is the tokens head's key",
            )
    if head == "flow":
        validate_flow(config)


def validate_flow(config: Config) -> None:
    model, flow = config.model, config.model.flow_chain
    if model.action_attention != "causal":
        raise ConfigError(
            "model.action_attention",
            model.action_attention,
            "causal with model.action_head flow",
            "the VLM reads the prompt alone; the expert's action tokens attend to one another both ways already",
        )
    if flow.width % (2 * flow.heads):
        raise ConfigError("model.flow.width", flow.width, f"a multiple of 2 × model.flow.heads ({2 * flow.heads})")
    if flow.noise == "ode" and algorithm_spec(config.algorithm.name).stage == "rl":
        raise ConfigError(
            "model.flow.noise",
            "ode",
            f"sde with algorithm.name {config.algorithm.name}",
            "the ODE chain is deterministic: it has no log-probability for the ratio",
        )


def check_action_head_spaces(config: Config, observation_space, action_space) -> None:
    """The continuous heads' actions (a 1-D Box) and proprioception (a 1-D Box, where named)."""
    from fleetrl.models.hf.continuous import ContinuousActions, proprioception

    model = config.model
    ContinuousActions(action_space, model.action_chunk, model.action_stats, model.action_head)
    if proprioception(observation_space, model.state_key) is None and model.state_key not in (None, "state"):
        keys = list(getattr(observation_space, "spaces", {}))
        raise ConfigError(
            "model.state_key",
            model.state_key,
            f"an observation key of the env ({keys}), or null",
            nearest(str(model.state_key), map(str, keys)),
        )

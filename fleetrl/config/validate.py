"""Cross-field rules of the config, checked before anything starts."""

from __future__ import annotations

from pathlib import Path

from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError

CHOICES = {
    "env.vectorization": ("sync", "async"),
    "algorithm.name": ("ppo",),
    "model.activation": ("tanh", "relu", "elu", "gelu"),
    "actor.optimizer": ("adam", "adamw"),
    "cluster.backend": ("auto", "inline", "ray"),
}
POSITIVE = (
    "env.num_envs", "algorithm.num_steps", "algorithm.lr", "algorithm.update_epochs",
    "algorithm.minibatch_size", "runner.total_env_steps", "runner.checkpoint_interval",
    "runner.keep_checkpoints", "runner.log_interval", "actor.adam_eps",
)
NON_NEGATIVE = (
    "algorithm.clip_coef", "algorithm.vf_coef", "algorithm.ent_coef", "algorithm.max_grad_norm",
    "runner.torch_threads", "actor.weight_decay",
)
UNIT_INTERVAL = ("algorithm.gamma", "algorithm.gae_lambda")


def get(config: Config, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def validate(config: Config) -> None:
    for key, choices in CHOICES.items():
        if get(config, key) not in choices:
            raise ConfigError(key, get(config, key), f"one of {list(choices)}")
    for key in POSITIVE:
        if get(config, key) <= 0:
            raise ConfigError(key, get(config, key), "a number > 0")
    for key in NON_NEGATIVE:
        if get(config, key) < 0:
            raise ConfigError(key, get(config, key), "a number >= 0")
    for key in UNIT_INTERVAL:
        if not 0 <= get(config, key) <= 1:
            raise ConfigError(key, get(config, key), "a number in [0, 1]")
    if config.batch_size % config.algorithm.minibatch_size:
        raise ConfigError(
            "algorithm.minibatch_size", config.algorithm.minibatch_size,
            f"a divisor of the batch algorithm.num_steps * env.num_envs = "
            f"{config.algorithm.num_steps} * {config.env.num_envs} = {config.batch_size}")
    resume = config.runner.resume
    if resume is not None and not (Path(resume) / "checkpoints").is_dir():
        raise ConfigError("runner.resume", resume, "a run directory that holds checkpoints/")
    max_steps = config.env.max_episode_steps
    if max_steps is not None and max_steps <= 0:
        raise ConfigError("env.max_episode_steps", max_steps, "a positive integer or null")
    if not config.model.hidden_sizes or not all(
            isinstance(size, int) and size > 0 for size in config.model.hidden_sizes):
        raise ConfigError("model.hidden_sizes", config.model.hidden_sizes,
                          "a non-empty list of positive integers")


def check_entry_points(config: Config) -> None:
    """Resolve `env.id` and a custom `model.id` now, so a typo fails before anything starts."""
    from fleetrl.entry_points import resolve_entry_point
    from fleetrl.envs.make import env_factory

    env_factory(config.env)
    if config.model.id != "mlp":
        resolve_entry_point("model.id", config.model.id)

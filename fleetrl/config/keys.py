"""Reading the config by dotted key, and what several keys decide together: the minibatch.

Here, below everything, because the rules of the plan (plan/rules.py) and those each algorithm
registers (`algos/<name>/config.py`) both read them.
"""

from __future__ import annotations

from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError


def get(config: Config, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def minibatch_key(config: Config) -> str:
    """The key that sets the minibatch: `actor.global_batch_size` when set, else
    `algorithm.minibatch_size`."""
    return "algorithm.minibatch_size" if config.actor.global_batch_size is None else "actor.global_batch_size"


def effective_minibatch_size(config: Config) -> int:
    """Samples per optimizer step, summed over all actor ranks."""
    return get(config, minibatch_key(config))


def check_split_over_ranks(config: Config, key: str, minibatch: int, world: int, what: str = "minibatch") -> None:
    """A minibatch of `minibatch` samples (set by `key`) spread over `world` ranks: W must divide
    it, and a micro-batch each rank's share."""
    if minibatch % world:
        raise ConfigError(key, minibatch, f"a multiple of the actor world size {world}")
    micro = config.actor.micro_batch_size
    if micro is not None and (minibatch // world) % micro:
        raise ConfigError(
            "actor.micro_batch_size",
            micro,
            f"a divisor of the per-rank {what} {key} / actor ranks = {minibatch} / {world} = {minibatch // world}",
        )

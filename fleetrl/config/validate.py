"""Cross-field rules of the config, checked before anything starts.

The rules on an algorithm's own keys live with the algorithm and run through its registered spec
(`fleetrl.algos.registry`): `validate` runs `spec.validate`, `check_actor_layout` runs
`spec.check_layout`, `check_spaces` runs `spec.check_spaces`.
"""

from __future__ import annotations

from pathlib import Path

from fleetrl.algos.registry import algorithm_spec
from fleetrl.checkpoint import list_checkpoints
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError

CHOICES = {
    "model.activation": ("tanh", "relu", "elu", "gelu"),
    "actor.optimizer": ("adam", "adamw"),
    "cluster.backend": ("auto", "inline", "ray"),
}
POSITIVE = (
    "runner.total_env_steps",
    "runner.checkpoint_interval",
    "runner.keep_checkpoints",
    "runner.log_interval",
    "actor.adam_eps",
)
NON_NEGATIVE = (
    "runner.torch_threads",
    "actor.weight_decay",
    "runner.param_check_interval",
)


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
    validate_actor(config)
    validate_tokens(config)
    algorithm_spec(config.algorithm.name).validate(config)
    resume = config.runner.resume
    if resume is not None and not list_checkpoints(Path(resume)):
        raise ConfigError("runner.resume", resume, "a run directory that holds a complete checkpoint")
    max_steps = config.env.max_episode_steps
    if max_steps is not None and max_steps <= 0:
        raise ConfigError("env.max_episode_steps", max_steps, "a positive integer or null")
    if not config.model.hidden_sizes or not all(
        isinstance(size, int) and size > 0 for size in config.model.hidden_sizes
    ):
        raise ConfigError("model.hidden_sizes", config.model.hidden_sizes, "a non-empty list of positive integers")


FSDP_ONLY = (
    "fsdp_sharding_strategy",
    "fsdp_hybrid_shard_size",
    "fsdp_param_dtype",
    "fsdp_reduce_dtype",
    "fsdp_cpu_offload",
)
FSDP_DTYPES = ("float32", "bfloat16")


def minibatch_key(config: Config) -> str:
    """The key that sets the minibatch: `actor.global_batch_size` when set, else
    `algorithm.minibatch_size`."""
    return "algorithm.minibatch_size" if config.actor.global_batch_size is None else "actor.global_batch_size"


def effective_minibatch_size(config: Config) -> int:
    """Samples per optimizer step, summed over all actor ranks."""
    return get(config, minibatch_key(config))


def validate_actor(config: Config) -> None:
    """The actor's distributed-training keys, as far as they can be checked without knowing the
    actor world size (`check_actor_layout` does the rest once placement is resolved)."""
    actor = config.actor
    if actor.strategy not in ("ddp", "fsdp"):
        raise ConfigError("actor.strategy", actor.strategy, "one of ['ddp', 'fsdp']")
    if not 0 < actor.dist_timeout_s < float("inf"):
        raise ConfigError(
            "actor.dist_timeout_s", actor.dist_timeout_s, "a finite number of seconds > 0 (there is no 'wait forever')"
        )
    for key in ("global_batch_size", "micro_batch_size", "fsdp_hybrid_shard_size"):
        value = getattr(actor, key)
        if value is not None and value <= 0:
            raise ConfigError(f"actor.{key}", value, "a positive integer or null")
    minibatch = effective_minibatch_size(config)
    if actor.micro_batch_size is not None and minibatch % actor.micro_batch_size:
        raise ConfigError(
            "actor.micro_batch_size",
            actor.micro_batch_size,
            f"a divisor of the minibatch {minibatch_key(config)} = {minibatch}",
        )
    strategies = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard")
    if actor.fsdp_sharding_strategy not in strategies:
        raise ConfigError("actor.fsdp_sharding_strategy", actor.fsdp_sharding_strategy, f"one of {list(strategies)}")
    for key in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
        value = getattr(actor, key)
        if value is not None and value not in FSDP_DTYPES:
            hint = (
                "float16 needs loss scaling, which fleetrl does not do; bfloat16 does not"
                if value in ("float16", "half", "fp16")
                else ""
            )
            raise ConfigError(f"actor.{key}", value, f"null or one of {list(FSDP_DTYPES)}", hint)
    if actor.fsdp_hybrid_shard_size is not None and actor.fsdp_sharding_strategy != "hybrid_shard":
        raise ConfigError(
            "actor.fsdp_hybrid_shard_size",
            actor.fsdp_hybrid_shard_size,
            f"null unless actor.fsdp_sharding_strategy is 'hybrid_shard' (it is {actor.fsdp_sharding_strategy!r})",
        )
    if actor.strategy != "fsdp":
        defaults = type(actor)()
        for key in FSDP_ONLY:
            if getattr(actor, key) != getattr(defaults, key):
                raise ConfigError(
                    f"actor.{key}",
                    getattr(actor, key),
                    f"its default ({getattr(defaults, key)!r}) unless actor.strategy is "
                    f"'fsdp' (it is {actor.strategy!r})",
                )


def check_actor_layout(config: Config, actor_world_size: int) -> None:
    """The rules that need the actor world size W; the runtime calls this once placement is
    resolved (and `ActorWorker` on construction). Trajectories are sharded by env columns, so W
    must divide env.num_envs; the minibatch M is spread over the W ranks, so W must divide M; and
    a micro-batch must divide each rank's share M / W."""
    world = actor_world_size
    if world < 1:
        raise ConfigError("cluster.component_placement.actor", world, "at least one actor rank")
    if config.env.num_envs % world:
        raise ConfigError(
            "env.num_envs",
            config.env.num_envs,
            f"a multiple of the actor world size {world} (trajectories are split by env)",
        )
    check_split_over_ranks(config, minibatch_key(config), effective_minibatch_size(config), world)
    hybrid = config.actor.fsdp_hybrid_shard_size
    if world > 1 and config.actor.strategy == "fsdp" and hybrid is not None and world % hybrid:
        raise ConfigError("actor.fsdp_hybrid_shard_size", hybrid, f"a divisor of the actor world size {world}")
    algorithm_spec(config.algorithm.name).check_layout(config, world)


def validate_tokens(config: Config) -> None:
    """Action chunks and token policies (the model and env keys behind them)."""
    if config.env.action_chunk < 1:
        raise ConfigError("env.action_chunk", config.env.action_chunk, "an integer >= 1")
    bins = config.model.action_bins
    if bins is not None and bins < 2:
        raise ConfigError("model.action_bins", bins, "null (Gaussian) or an integer >= 2")


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


def check_entry_points(config: Config) -> None:
    """Resolve `env.id` and a custom `model.id` now, so a typo fails before anything starts."""
    from fleetrl.entry_points import resolve_entry_point
    from fleetrl.envs.make import env_factory

    env_factory(config.env)
    if config.model.id != "mlp":
        resolve_entry_point("model.id", config.model.id)


def check_spaces(config: Config, observation_space, action_space) -> None:
    """The rules that need the env's spaces (the algorithm's: e.g. SAC's continuous actions); the
    runtime calls this as soon as they are known, before any actor is built."""
    algorithm_spec(config.algorithm.name).check_spaces(config, observation_space, action_space)

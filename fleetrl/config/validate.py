"""Cross-field rules of the config, checked before anything starts."""

from __future__ import annotations

from pathlib import Path

from fleetrl.algos.registry import ALGORITHMS
from fleetrl.checkpoint import list_checkpoints
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError

CHOICES = {
    "algorithm.name": ALGORITHMS,
    "model.activation": ("tanh", "relu", "elu", "gelu"),
    "actor.optimizer": ("adam", "adamw"),
    "cluster.backend": ("auto", "inline", "ray"),
    "algorithm.adv_type": ("gae", "grpo"),
    "algorithm.logprob_type": ("action_level", "token_level"),
    "algorithm.entropy_type": ("action_level", "token_level"),
}
POSITIVE = (
    "algorithm.num_steps",
    "algorithm.lr",
    "algorithm.update_epochs",
    "algorithm.minibatch_size",
    "runner.total_env_steps",
    "runner.checkpoint_interval",
    "runner.keep_checkpoints",
    "runner.log_interval",
    "actor.adam_eps",
)
NON_NEGATIVE = (
    "algorithm.clip_coef",
    "algorithm.vf_coef",
    "algorithm.ent_coef",
    "algorithm.max_grad_norm",
    "runner.torch_threads",
    "actor.weight_decay",
    "algorithm.beta_clone",
    "runner.param_check_interval",
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
    validate_actor(config)
    validate_tokens_grpo_ppg(config)
    validate_sac(config)
    # (SAC draws its minibatches from the replay buffer: any size)
    if config.algorithm.name != "sac" and config.batch_size % effective_minibatch_size(config):
        key = minibatch_key(config)
        raise ConfigError(
            key,
            get(config, key),
            f"a divisor of the batch algorithm.num_steps * env.num_envs = "
            f"{config.algorithm.num_steps} * {config.env.num_envs} = {config.batch_size}",
        )
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
            config.env.num_envs,
            f"a multiple of the actor world size {world} (trajectories are split by env)",
        )
    key, minibatch = minibatch_key(config), effective_minibatch_size(config)
    if minibatch % world:
        raise ConfigError(key, minibatch, f"a multiple of the actor world size {world}")
    micro = config.actor.micro_batch_size
    if micro is not None and (minibatch // world) % micro:
        raise ConfigError(
            "actor.micro_batch_size",
            micro,
            f"a divisor of the per-rank minibatch {key} / actor ranks = {minibatch} / {world} = {minibatch // world}",
        )
    hybrid = config.actor.fsdp_hybrid_shard_size
    if world > 1 and config.actor.strategy == "fsdp" and hybrid is not None and world % hybrid:
        raise ConfigError("actor.fsdp_hybrid_shard_size", hybrid, f"a divisor of the actor world size {world}")
    check_grpo_ppg_layout(config, world)


def aux_minibatch_size(config: Config) -> int:
    """PPG: samples per auxiliary-phase optimizer step, over all actor ranks."""
    return config.algorithm.aux_minibatch_size or effective_minibatch_size(config)


def validate_tokens_grpo_ppg(config: Config) -> None:
    """Token-level action policies, GRPO advantages, PPG and action chunks."""
    algo, model = config.algorithm, config.model
    for key in ("algorithm.n_pi", "algorithm.aux_epochs", "env.action_chunk"):
        if get(config, key) < 1:
            raise ConfigError(key, get(config, key), "an integer >= 1")
    if model.action_bins is not None and model.action_bins < 2:
        raise ConfigError("model.action_bins", model.action_bins, "null (Gaussian) or an integer >= 2")
    for key in ("algorithm.logprob_type", "algorithm.entropy_type"):
        if get(config, key) == "token_level" and model.action_bins is None:
            raise ConfigError(
                key,
                "token_level",
                "'action_level' unless model.action_bins is set",
                "token_level needs a policy that emits tokens (model.action_bins)",
            )
    if algo.adv_type == "grpo":
        if algo.group_size < 2:
            raise ConfigError("algorithm.group_size", algo.group_size, "an integer >= 2 with adv_type grpo")
        if config.env.num_envs % algo.group_size:
            raise ConfigError(
                "algorithm.group_size",
                algo.group_size,
                f"a divisor of env.num_envs ({config.env.num_envs}): groups are consecutive envs",
            )
        if algo.norm_adv:
            raise ConfigError(
                "algorithm.norm_adv",
                True,
                "false with algorithm.adv_type grpo",
                "group-relative advantages are normalised within each group already, and "
                "steps outside complete episodes must keep advantage 0",
            )
    if algo.name == "ppg":
        if not model.aux_value_head:
            raise ConfigError(
                "model.aux_value_head",
                False,
                "true with algorithm.name ppg",
                "PPG distils the value into an auxiliary head of the policy network",
            )
        if config.actor.strategy != "ddp":
            raise ConfigError(
                "actor.strategy",
                config.actor.strategy,
                "'ddp' with algorithm.name ppg",
                "PPG's two phases are wrapped per phase with DDP; FSDP is not supported",
            )
        aux = aux_minibatch_size(config)
        stored = algo.n_pi * config.batch_size
        key = "algorithm.aux_minibatch_size" if algo.aux_minibatch_size is not None else minibatch_key(config)
        if aux <= 0 or stored % aux:
            raise ConfigError(
                key,
                aux,
                f"a positive divisor of the auxiliary phase's data algorithm.n_pi * num_steps * num_envs = {stored}",
            )
        micro = config.actor.micro_batch_size
        if micro is not None and aux % micro:
            raise ConfigError("actor.micro_batch_size", micro, f"a divisor of the auxiliary minibatch {aux}")


def check_grpo_ppg_layout(config: Config, world: int) -> None:
    """GRPO groups never span actor ranks; PPG's auxiliary minibatch splits over them."""
    algo = config.algorithm
    if algo.adv_type == "grpo" and (config.env.num_envs // world) % algo.group_size:
        raise ConfigError(
            "algorithm.group_size",
            algo.group_size,
            f"a divisor of the envs per actor rank env.num_envs / {world} = "
            f"{config.env.num_envs // world} (a group must not span actor ranks)",
        )
    if algo.name == "ppg":
        aux = aux_minibatch_size(config)
        if aux % world:
            raise ConfigError("algorithm.aux_minibatch_size", aux, f"a multiple of the actor world size {world}")
        micro = config.actor.micro_batch_size
        if micro is not None and (aux // world) % micro:
            raise ConfigError(
                "actor.micro_batch_size",
                micro,
                f"a divisor of the per-rank auxiliary minibatch {aux} / {world} = {aux // world}",
            )


def check_entry_points(config: Config) -> None:
    """Resolve `env.id` and a custom `model.id` now, so a typo fails before anything starts."""
    from fleetrl.entry_points import resolve_entry_point
    from fleetrl.envs.make import env_factory

    env_factory(config.env)
    if config.model.id != "mlp":
        resolve_entry_point("model.id", config.model.id)


def validate_sac(config: Config) -> None:
    """SAC's keys, and what SAC does not combine with (algorithm.name: sac only)."""
    algo, env, _model, _actor = config.algorithm, config.env, config.model, config.actor
    if algo.matmul_dtype not in (None, "float32", "bfloat16"):
        raise ConfigError("algorithm.matmul_dtype", algo.matmul_dtype, "null, 'float32' or 'bfloat16'")
    if algo.name != "sac":
        if algo.matmul_dtype is not None:
            raise ConfigError(
                "algorithm.matmul_dtype",
                algo.matmul_dtype,
                f"null unless algorithm.name is 'sac' (it is {algo.name!r})",
            )
        return
    per_env = algo.buffer_size // env.num_envs
    if per_env <= algo.num_steps:
        raise ConfigError(
            "algorithm.buffer_size",
            algo.buffer_size,
            f"more than algorithm.num_steps * env.num_envs = {algo.num_steps * env.num_envs} "
            "(each env keeps buffer_size // env.num_envs transitions, more than one iteration's)",
        )
    if algo.learning_starts < 0:
        raise ConfigError("algorithm.learning_starts", algo.learning_starts, "an integer >= 0")
    if not 0 < algo.update_to_data < float("inf"):
        raise ConfigError("algorithm.update_to_data", algo.update_to_data, "a finite number > 0")
    if not 0 <= algo.tau <= 1:
        raise ConfigError("algorithm.tau", algo.tau, "a number in [0, 1]")
    if not algo.alpha > 0:
        raise ConfigError("algorithm.alpha", algo.alpha, "a number > 0 (the initial or fixed entropy coefficient)")
    for key in ("q_lr", "policy_lr"):
        value = getattr(algo, key)
        if value is not None and not value > 0:
            raise ConfigError(f"algorithm.{key}", value, "a number > 0, or null (algorithm.lr)")
    for key in ("policy_frequency", "target_network_frequency"):
        if getattr(algo, key) < 1:
            raise ConfigError(f"algorithm.{key}", getattr(algo, key), "an integer >= 1")
    unsupported = {  # key: (value SAC needs, why)
        "model.id": (
            "mlp",
            "sac builds its own actor and twin-critic MLPs from model.hidden_sizes and model.activation",
        ),
        "model.action_bins": (None, "sac's actor is a squashed Gaussian"),
        "env.action_chunk": (1, "sac's replay stores one action per env step"),
        "env.normalize_obs": (
            False,
            "the replay buffer would keep observations normalised with statistics that later change",
        ),
        "env.normalize_reward": (False, "the replay buffer would keep rewards scaled by statistics that later change"),
        "algorithm.adv_type": ("gae", "advantages are an on-policy notion; sac learns critics"),
        "actor.strategy": ("ddp", "sac's replicas train with DDP"),
        "actor.micro_batch_size": (None, "sac does not accumulate gradients"),
        "actor.gradient_checkpointing": (False, "sac does not recompute activations"),
    }
    for key, (needed, why) in unsupported.items():
        if get(config, key) != needed:
            raise ConfigError(key, get(config, key), f"{needed!r} with algorithm.name 'sac'", why)


def check_spaces(config: Config, observation_space, action_space) -> None:
    """The rules that need the env's spaces; the runtime calls this as soon as they are known,
    before any actor is built. SAC: a flat Box observation and a 1-D Box action with finite
    bounds (its tanh-squashed actions are mapped onto them)."""
    import gymnasium as gym
    import numpy as np

    if config.algorithm.name != "sac":
        return
    box = isinstance(action_space, gym.spaces.Box)
    if not (
        box
        and len(action_space.shape) == 1
        and np.all(np.isfinite(action_space.low))
        and np.all(np.isfinite(action_space.high))
    ):
        raise ConfigError(
            "algorithm.name",
            "sac",
            f"an algorithm for env.id {config.env.id!r}, whose action space is {action_space}",
            "sac needs continuous actions: a 1-D Box with finite bounds (use ppo for discrete actions)",
        )
    if not isinstance(observation_space, gym.spaces.Box):
        raise ConfigError(
            "algorithm.name",
            "sac",
            f"an algorithm for env.id {config.env.id!r}, whose observation space is {observation_space}",
            "sac's MLPs need a Box observation space",
        )

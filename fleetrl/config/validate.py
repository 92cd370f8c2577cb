"""Cross-field rules of the config, checked before anything starts.

A key's own type, choices and range are declared on its field (`schema.py`, `constraints.py`) and
checked by the loader; what is here relates keys to each other (or, once the placement is
resolved, to it: `check_actor_layout`, `check_fault_placement`). `debug.fault`'s own keys are
checked by `watch/faults.check_fault`, next to the kinds it implements.
"""

from __future__ import annotations

from pathlib import Path

from fleetrl.algos.registry import ALGORITHMS
from fleetrl.checkpoint import list_checkpoints
from fleetrl.cluster.placement import PLACEMENT_KEY, Placement
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError
from fleetrl.watch.faults import check_fault

CHOICES = {
    "algorithm.name": ALGORITHMS,
    "algorithm.adv_type": ("gae", "grpo"),
    "algorithm.logprob_type": ("action_level", "token_level"),
    "algorithm.entropy_type": ("action_level", "token_level"),
}
POSITIVE = (
    "algorithm.num_steps",
    "algorithm.lr",
    "algorithm.update_epochs",
    "algorithm.minibatch_size",
)
NON_NEGATIVE = (
    "algorithm.clip_coef",
    "algorithm.vf_coef",
    "algorithm.ent_coef",
    "algorithm.max_grad_norm",
    "algorithm.beta_clone",
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
    if config.model.id == "mlp" and config.model.kwargs:
        raise ConfigError(
            "model.kwargs",
            config.model.kwargs,
            "{} with model.id 'mlp'",
            "the built-in MLP reads model.hidden_sizes, activation, shared_trunk, ortho_init; kwargs go to a custom model",
        )
    validate_cluster(config)
    validate_watchdog(config)
    check_fault(config.debug.fault, config.algorithm.name)


def validate_cluster(config: Config) -> None:
    cluster = config.cluster
    if cluster.simulate_nodes > 1 and cluster.simulate_nodes != cluster.num_nodes:
        raise ConfigError(
            "cluster.simulate_nodes", cluster.simulate_nodes, f"0, or equal to cluster.num_nodes ({cluster.num_nodes})"
        )
    if cluster.simulate_nodes > 1 and cluster.ray_address is not None:
        raise ConfigError(
            "cluster.simulate_nodes",
            cluster.simulate_nodes,
            f"0 with cluster.ray_address set ({cluster.ray_address!r}): either join a cluster or simulate one",
        )
    for name, value in cluster.env_vars.items():
        node = isinstance(name, int) and not isinstance(name, bool) or isinstance(name, str) and name.isdigit()
        entries = value.items() if node and isinstance(value, dict) else [(name, value)]
        for key, item in entries:
            where = f"cluster.env_vars.{name}" + (f".{key}" if node else "")
            if not isinstance(key, str) or not isinstance(item, (str, int, float, bool)):
                raise ConfigError(
                    where, item, "a variable name with a string or number value, or a node index with a mapping of them"
                )


def validate_watchdog(config: Config) -> None:
    """The relations between the watchdog's keys (each key's own range is on its field)."""
    watchdog = config.watchdog
    if watchdog.heartbeat_interval_s >= watchdog.heartbeat_timeout_s:
        raise ConfigError(
            "watchdog.heartbeat_interval_s",
            watchdog.heartbeat_interval_s,
            f"less than watchdog.heartbeat_timeout_s ({watchdog.heartbeat_timeout_s:g})",
            "a worker that beats less often than the timeout would be declared frozen while it is fine",
        )
    if watchdog.min_deadline_s > watchdog.max_deadline_s:
        raise ConfigError(
            "watchdog.min_deadline_s",
            watchdog.min_deadline_s,
            f"at most watchdog.max_deadline_s ({watchdog.max_deadline_s:g})",
        )


def check_fault_placement(config: Config, placement: Placement) -> None:
    """`debug.fault.rank` against the placement: a rank beyond its component's world size would
    never fire. The runtime calls this once placement is resolved."""
    fault = config.debug.fault
    if fault:
        world = placement.world_size(fault["component"])
        if fault.get("rank", 0) >= world:
            raise ConfigError(
                "debug.fault.rank",
                fault["rank"],
                f"a rank of {fault['component']} below its world size {world}",
                f"{PLACEMENT_KEY}.{fault['component']} places {world} rank(s)",
            )


FSDP_ONLY = (
    "fsdp_sharding_strategy",
    "fsdp_hybrid_shard_size",
    "fsdp_param_dtype",
    "fsdp_reduce_dtype",
    "fsdp_cpu_offload",
)


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
    minibatch = effective_minibatch_size(config)
    if actor.micro_batch_size is not None and minibatch % actor.micro_batch_size:
        raise ConfigError(
            "actor.micro_batch_size",
            actor.micro_batch_size,
            f"a divisor of the minibatch {minibatch_key(config)} = {minibatch}",
        )
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
    """Resolve `env.id` and a custom `model.id` now, and check the kwargs each is given against its
    signature, so a typo fails before anything starts."""
    from fleetrl.entry_points import check_keyword_arguments, resolve_entry_point
    from fleetrl.envs.make import env_factory

    env_factory(config.env)
    if config.model.id != "mlp":
        network = resolve_entry_point("model.id", config.model.id)
        check_keyword_arguments("model.kwargs", network, config.model.kwargs)


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

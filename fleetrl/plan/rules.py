"""Cross-field rules of the config, checked before anything starts — by `plan.resolve` alone.

A key's own type, choices and range are declared on its field (`schema.py`, `constraints.py`) and
checked by the loader; what is here relates keys to each other (or, once the placement is
resolved, to it: `check_actor_layout`, `check_fault_placement`), to the command that runs them
(`check_stage`) and to the env's spaces (`check_spaces`, run through `RunPlan.check_spaces` once an
env worker is built). `debug.fault`'s own keys are checked by `debug/faults.check_fault`, next to
the kinds it implements. Nothing outside plan/ imports this module (an import-linter contract in
pyproject.toml): the backends, the controller and the workers take a checked `RunPlan`.

The rules on an algorithm's own keys live with the algorithm and run through its registered spec
(`fleetrl.algos.registry`): `validate` runs `spec.validate`, `check_inputs` runs
`spec.check_inputs`, `check_actor_layout` runs `spec.check_layout`, `check_spaces` runs
`spec.check_spaces`.
"""

from __future__ import annotations

import os
import shutil

from fleetrl.algos.registry import algorithm_names, algorithm_spec
from fleetrl.config.keys import check_split_over_ranks, effective_minibatch_size, minibatch_key
from fleetrl.config.model_sections import BUILTIN_MODELS
from fleetrl.config.schema import ClusterConfig, Config
from fleetrl.debug.faults import check_fault
from fleetrl.errors import ConfigError, nearest
from fleetrl.plan.action_heads import check_action_head_spaces, validate_action_head
from fleetrl.plan.placement import EVAL, PLACEMENT_KEY, Placement
from fleetrl.run_dir import resume_dir
from fleetrl.watch.incident import CAUSES, NEVER_RESTART

ISOLATION_TOOLS = ("ip", "unshare")  # what cluster/isolation/nodes.py runs


def validate(config: Config) -> None:
    validate_actor(config)
    validate_staleness(config)  # before the algorithm's own rules: whether it can train asynchronously at all
    validate_weight_sync(config)
    algorithm_spec(config.algorithm.name).validate(config)
    resume_dir(config)  # raises naming the run directory that cannot be continued
    validate_trunk_keys(config)
    validate_input_statistics(config)
    validate_precision(config)
    validate_action_attention(config)
    validate_token_readout(config)
    validate_action_head(config)
    validate_cluster(config)
    validate_watchdog(config)
    validate_restarts(config)
    check_fault(config.debug.fault, config.algorithm.name)


def check_inputs(config: Config) -> None:
    """What a run of `config` reads before it starts (the algorithm's `check_inputs`: a supervised
    stage's demonstrations folder). Apart from `validate`: a finished run's saved config is read
    back by `fleetrl eval` and `export` without it, since the folder it trained from may have moved
    or been re-recorded, and neither command reads it."""
    algorithm_spec(config.algorithm.name).check_inputs(config)


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
    validate_isolation(cluster)
    for name, value in cluster.env_vars.items():
        node = isinstance(name, int) and not isinstance(name, bool) or isinstance(name, str) and name.isdigit()
        entries = value.items() if node and isinstance(value, dict) else [(name, value)]
        for key, item in entries:
            where = f"cluster.env_vars.{name}" + (f".{key}" if node else "")
            if not isinstance(key, str) or not isinstance(item, (str, int, float, bool)):
                raise ConfigError(
                    where, item, "a variable name with a string or number value, or a node index with a mapping of them"
                )


def validate_isolation(cluster: ClusterConfig) -> None:
    """`cluster.simulate_isolation` and its clock skews: only for simulated nodes, on a machine
    that can isolate them (root, iproute2, util-linux)."""
    for node, seconds in cluster.simulate_clock_skew_s.items():
        index = int(node) if str(node).isdigit() else -1
        if not 0 <= index < cluster.num_nodes or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise ConfigError(
                f"cluster.simulate_clock_skew_s.{node}",
                seconds,
                f"a node index below cluster.num_nodes ({cluster.num_nodes}) with a number of seconds",
            )
    if cluster.simulate_clock_skew_s and cluster.simulate_isolation != "namespaces":
        raise ConfigError(
            "cluster.simulate_clock_skew_s",
            cluster.simulate_clock_skew_s,
            "{} unless cluster.simulate_isolation is 'namespaces' (only isolated nodes have clocks of their own)",
        )
    if cluster.simulate_isolation == "none":
        return
    if cluster.simulate_nodes <= 1:
        raise ConfigError(
            "cluster.simulate_isolation",
            cluster.simulate_isolation,
            "'none' unless cluster.simulate_nodes is above 1 (it isolates simulated nodes)",
        )
    missing = why_not_isolated()
    if missing:
        raise ConfigError(
            "cluster.simulate_isolation",
            cluster.simulate_isolation,
            f"'none' here: isolated simulated nodes need {missing}",
        )


def why_not_isolated() -> str | None:
    """What this machine lacks to isolate simulated nodes, or None."""
    if os.geteuid() != 0:
        return f"root (network, PID and mount namespaces need it; this process runs as uid {os.geteuid()})"
    missing = [tool for tool in ISOLATION_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the command(s) {', '.join(missing)} (Debian's iproute2, util-linux)"
    return None


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


def validate_staleness(config: Config) -> None:
    """`runner.asynchronous` needs an algorithm that trains on stale samples (its spec says so)
    and ranks that are not fused (a fused rank collects and trains in one process,
    one after the other); `algorithm.max_staleness` must admit the age that
    `runner.weight_sync_interval` gives every sample between two syncs (docs: concepts/async.md)."""
    runner = config.runner
    if runner.asynchronous and not algorithm_spec(config.algorithm.name).asynchronous:
        accepting = [name for name in algorithm_names() if algorithm_spec(name).asynchronous]
        raise ConfigError(
            "runner.asynchronous",
            True,
            f"false with algorithm.name {config.algorithm.name!r}",
            f"the algorithms that train on samples older policy versions acted: {', '.join(accepting)}",
        )
    if runner.asynchronous and config.cluster.fuse_collocated:
        raise ConfigError(
            "runner.asynchronous",
            True,
            "false with cluster.fuse_collocated true",
            "a fused rank collects and trains in one process, one after the other: there is nothing to overlap",
        )
    bound = config.algorithm.staleness_bound
    if bound is not None and bound < runner.weight_sync_interval - 1:
        raise ConfigError(
            "algorithm.max_staleness",
            bound,
            f"at least runner.weight_sync_interval - 1 = {runner.weight_sync_interval - 1}",
            f"the rollout acts up to {runner.weight_sync_interval - 1} versions behind the actor between two "
            "weight syncs: every batch but those right after a sync would be dropped",
        )


def validate_weight_sync(config: Config) -> None:
    """`runner.weight_sync_transport: collective` makes every rollout worker receive while actor
    rank 0 sends: with `runner.asynchronous` the actor's send queues behind the update it trains
    meanwhile, and the rollout, which asynchronous training keeps collecting, would wait for it."""
    runner = config.runner
    if runner.weight_sync_transport == "collective" and runner.asynchronous:
        raise ConfigError(
            "runner.weight_sync_transport",
            "collective",
            "'ray' with runner.asynchronous true",
            "a collective sync makes the rollout wait for the actor's update to end, which asynchronous "
            "training exists to avoid",
        )


def validate_restarts(config: Config) -> None:
    """runner.restart_on: incident causes (watch/incident.py) a restart can help with; an
    interruption, a full disk or a failed watchdog would only come back."""
    check_restart_on(config.runner.restart_on)


def check_eval_fault(config: Config) -> None:
    """A fault in the eval worker fires only in a run that evaluates."""
    if config.debug.fault.get("component") == EVAL and config.runner.eval_interval <= 0:
        raise ConfigError(
            "debug.fault.component",
            EVAL,
            "another component, or runner.eval_interval > 0: this run starts no eval worker",
            f"{PLACEMENT_KEY}.{EVAL} places it when the run evaluates",
        )


def check_fault_placement(config: Config, placement: Placement) -> None:
    """`debug.fault.rank` against the placement: a rank beyond its component's world size would
    never fire."""
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


def validate_trunk_keys(config: Config) -> None:
    """The transformer's `model.predict_keys` only with keypoints to predict them from: set
    without, they would be silently ignored."""
    model = config.model
    if model.id == "transformer" and model.predict_keys and model.keypoints is None:
        raise ConfigError(
            "model.predict_keys",
            model.predict_keys,
            "[] unless model.keypoints is set",
            "the keypoints' positions are what predicts them",
        )


def validate_input_statistics(config: Config) -> None:
    """The transformer's `model.standardize_inputs` only where its statistics come from: the
    demonstrations of a supervised stage (`fleetrl sft`), or the weights of `runner.init_from`.
    Set without either, they would stay 0 and 1 and standardise nothing."""
    model = config.model
    supervised = algorithm_spec(config.algorithm.name).stage == "sft"
    if model.id == "transformer" and model.standardize_inputs and not supervised and config.runner.init_from is None:
        raise ConfigError(
            "model.standardize_inputs",
            True,
            "false unless the run is a supervised stage (fleetrl sft: the demonstrations' statistics) or "
            "runner.init_from names a run whose weights hold them",
            "nothing would set the statistics",
        )


def validate_action_attention(config: Config) -> None:
    """Bidirectional attention over the action positions needs them all in one pass."""
    model = config.model
    if model.id == "hf" and model.action_attention == "bidirectional" and model.decode != "parallel":
        raise ConfigError(
            "model.action_attention",
            "bidirectional",
            "causal with model.decode autoregressive",
            "one token at a time, a token cannot see the ones after it",
        )


def validate_token_readout(config: Config) -> None:
    """The expected readout weighs bins: it needs a token policy whose bins are all chosen from one
    distribution at once, which a VLA's are not (each of its tokens follows the one chosen before)."""
    model = config.model
    if model.token_readout == "mode":
        return
    if model.id == "hf":
        raise ConfigError(
            "model.token_readout",
            model.token_readout,
            "mode with model.id hf",
            "a VLA chooses its action tokens one after another, each conditioned on the one before",
        )
    if model.action_bins is None:
        raise ConfigError(
            "model.token_readout",
            model.token_readout,
            "mode unless model.action_bins is set",
            "only a token policy has bins to weigh",
        )


def validate_precision(config: Config) -> None:
    """`model.dtype` against the other dtype keys (the precedence table: docs/guides/vla.md,
    Precision): bfloat16 weights cannot act in float32, and FSDP keeps float32 master shards,
    computing in `actor.fsdp_param_dtype` instead."""
    model = config.model
    if model.id != "hf" or model.dtype == "float32":
        return
    if config.rollout.dtype == "float32":
        raise ConfigError(
            "rollout.dtype",
            "float32",
            "bfloat16 or auto with model.dtype bfloat16",
            "the rollout's weights are bfloat16: acting cannot be float32 on them",
        )
    if config.actor.strategy == "fsdp":
        raise ConfigError(
            "model.dtype",
            "bfloat16",
            "float32 with actor.strategy fsdp",
            "FSDP keeps float32 master shards; compute in bfloat16 with actor.fsdp_param_dtype: bfloat16",
        )


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
    """The rules that need the actor world size W, once the placement is resolved. Trajectories
    are sharded by env columns, so W must divide env.num_envs; the minibatch M is spread over the
    W ranks, so W must divide M; and a micro-batch must divide each rank's share M / W."""
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


def check_stage(config: Config, command: str) -> None:
    """`fleetrl train` runs RL algorithms, `fleetrl sft` supervised ones (the spec's `stage`)."""
    stage = "sft" if command == "sft" else "rl"
    if algorithm_spec(config.algorithm.name).stage != stage:
        fitting = [name for name in algorithm_names() if algorithm_spec(name).stage == stage]
        other = "sft" if stage == "rl" else "train"
        raise ConfigError(
            "algorithm.name",
            config.algorithm.name,
            f"one of {fitting} with fleetrl {command}",
            f"it is a {'supervised' if stage == 'rl' else 'reinforcement-learning'} algorithm: run it with fleetrl {other}",
        )


def check_entry_points(config: Config) -> None:
    """Resolve `env.id` and a custom `model.id` now, and check the kwargs each is given against its
    signature, so a typo fails before anything starts."""
    from fleetrl.entry_points import check_keyword_arguments, resolve_entry_point
    from fleetrl.envs.make import env_factory

    env_factory(config.env)
    if config.model.id == "hf":
        from fleetrl.models.hf.folder import check_attention, check_folder

        check_folder(config.model.path, config.model.trust_remote_code)
        check_attention(config.model.attn_implementation)
    elif config.model.id not in BUILTIN_MODELS:
        network = resolve_entry_point("model.id", config.model.id)
        check_keyword_arguments("model.kwargs", network, config.model.kwargs)


def check_spaces(config: Config, observation_space, action_space) -> None:
    """The rules that need the env's spaces (the algorithm's: e.g. continuous actions only); run
    through `RunPlan.check_spaces` as soon as they are known, before any actor is built."""
    algorithm_spec(config.algorithm.name).check_spaces(config, observation_space, action_space)
    if config.model.id == "hf":  # what needs no model: the folder itself is checked by check_entry_points
        from fleetrl.models.hf.actions import VocabActions
        from fleetrl.models.hf.prompts import observation_keys

        model = config.model
        observation_keys(observation_space, model.prompt_template)
        if model.action_head == "tokens":
            bins = model.action_bins
            VocabActions(action_space, bins, VocabActions.placeholder_ids(bins), model.action_chunk, model.action_stats)
        else:
            check_action_head_spaces(config, observation_space, action_space)
    if config.model.id in ("mlp", "transformer"):
        import torch

        from fleetrl.models.policy import build_network

        with torch.random.fork_rng():  # its ConfigErrors now, before any worker; no draw from the seeded RNG
            build_network(config.model, observation_space, action_space)


def check_restart_on(causes: list) -> None:
    """Every entry of runner.restart_on is a cause a restart can help with."""
    allowed = [cause for cause in CAUSES if cause not in NEVER_RESTART]
    if not isinstance(causes, list):
        raise ConfigError("runner.restart_on", causes, f"a list of incident causes, from {allowed}")
    for cause in causes:
        if cause not in allowed:
            why = f"{cause!r} never restarts (it would come back at once)" if cause in NEVER_RESTART else ""
            raise ConfigError(
                "runner.restart_on",
                causes,
                f"a list of incident causes, from {allowed}",
                why or nearest(str(cause), allowed),
            )

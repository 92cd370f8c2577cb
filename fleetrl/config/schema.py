"""The typed config: one dataclass per YAML section, with the defaults a user gets.

Field comments are the reference documentation for each key. A key's type, choices (`Literal`) and
range (`Annotated[..., Range]`, `constraints.py`) stand on the field and are checked by the loader;
rules that relate several keys live in `validate.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fleetrl.config.constraints import (
    AtLeastOne,
    Finite,
    IPAddress,
    NonNegative,
    Note,
    Positive,
    PositiveOrInf,
    Range,
    TorchDevice,
    UnitInterval,
)

RESUME_AUTO = "auto"  # runner.resume: continue the newest run of this config's name (run_dir.resume_dir)
TRACKERS = Literal["jsonl", "tensorboard", "wandb", "mlflow"]  # fleetrl/tracking/trackers.py

DEFAULT_PLACEMENT = {"actor": 0, "env": 0}  # and rollout: see plan/placement.py default_rollout; eval: default_eval

FLOAT16 = Note("float16 is not offered: it needs loss scaling, which fleetrl does not do; bfloat16 does not")


@dataclass
class EnvConfig:
    id: str = (
        "CartPole-v1"  # Gymnasium id, or 'module:attr' returning a gymnasium.Env (resolved before anything starts)
    )
    kwargs: dict = field(
        default_factory=dict
    )  # passed to gymnasium.make / the entry point (checked against its signature)
    num_envs: Annotated[int, Positive] = 8  # simulators in total, split over the env workers
    max_episode_steps: Annotated[int, Positive] | None = None  # truncate episodes here (None: the env's own limit)
    vectorization: Literal["sync", "async"] = "sync"  # sync (one process) | async (one subprocess per env)
    normalize_obs: bool = False  # running mean/std of observations, checkpointed
    normalize_reward: bool = False  # scale rewards by the std of the discounted return
    clip_obs: Annotated[float, PositiveOrInf] = 10.0  # clip normalised observations to [-clip_obs, clip_obs]
    clip_reward: Annotated[float, PositiveOrInf] = 10.0  # clip normalised rewards likewise
    action_chunk: Annotated[int, AtLeastOne] = (
        1  # Box actions: each policy step emits this many consecutive actions, executed in order until the episode ends (README: 'Token-level policies')
    )
    wrappers: Literal["none", "atari"] = (
        "none"  # a preset of standard wrappers around each simulator; atari: CleanRL's Atari preprocessing (envs/atari.py)
    )


@dataclass
class AlgorithmConfig:
    """The keys every algorithm reads. Each algorithm's section is a subclass holding its own keys
    too (`PPOConfig` in algos/ppo/config.py, `PPGConfig`, `SACConfig`), chosen by `name` through
    the registry (`fleetrl.algos.registry`); the loader builds that subclass."""

    name: str = "ppo"  # a registered algorithm: ppo | ppg | sac (and any a plugin registers)
    num_steps: Annotated[int, Positive] = 128  # steps per env per iteration (rollout length)
    gamma: Annotated[float, UnitInterval] = 0.99  # discount factor
    lr: Annotated[float, Positive] = 3e-4  # learning rate
    anneal_lr: bool = True  # linear decay of lr to 0 over runner.total_env_steps
    minibatch_size: Annotated[int, Positive] = (
        256  # samples per optimizer step, over all actor ranks (on-policy: must divide num_steps * env.num_envs)
    )
    max_grad_norm: Annotated[float, NonNegative] = 0.5  # clip the global gradient norm to this (0: no clipping)

    @property
    def resets_envs_each_iteration(self) -> bool:
        """Whether every iteration's episodes start from fresh, group-seeded resets (GRPO)."""
        return False

    @property
    def reset_group_size(self) -> int:
        """Consecutive envs reset with one seed (a group); 1: every env its own seed."""
        return 1


@dataclass
class ModelConfig:
    id: str = "mlp"  # 'mlp', 'transformer', or 'module:attr' building an nn.Module (README: 'Your own network')
    kwargs: dict = field(
        default_factory=dict
    )  # passed to a custom model's constructor ({} with 'mlp', which reads the keys below)
    hidden_sizes: list[Annotated[int, Positive]] = field(
        default_factory=lambda: [64, 64]
    )  # mlp: hidden layers of the trunk ([]: the heads read the observation, or its encoder's features, directly)
    activation: Literal["tanh", "relu", "elu", "gelu"] = "tanh"
    shared_trunk: bool = False  # one trunk for policy and value, or one each
    init_log_std: Annotated[float, Finite] = 0.0  # initial log std of the Gaussian policy (Box actions)
    ortho_init: bool = True
    aux_value_head: bool = (
        False  # an auxiliary value head on the policy trunk (PPG); computed only in PPG's auxiliary phase
    )
    action_bins: Annotated[int, Range(2)] | None = (
        None  # Box actions as tokens: each dimension (of each chunked action) discretised into this many evenly spaced values, one categorical each (None: Gaussian)
    )
    # Image and Dict observations (README: 'Images, instructions and the transformer policy').
    image_encoder: Literal["auto", "nature_cnn", "grid_cnn", "flatten"] = (
        "auto"  # mlp: the encoder of image keys (auto: nature_cnn from 36 pixels a side, grid_cnn from 7, flatten below)
    )
    embed_dim: Annotated[int, Positive] = 64  # width of token embeddings: the text encoder's, and the transformer's
    num_layers: Annotated[int, Positive] = 2  # transformer: blocks
    num_heads: Annotated[int, Positive] = 4  # transformer: attention heads per block (divides embed_dim)
    patch_size: Annotated[int, Positive] | None = (
        None  # transformer: image patch side in pixels (None: about 7×7 patches per image; 1 for a 7×7 grid)
    )


BUILTIN_MODELS = ("mlp", "transformer")  # model.id values that are no entry point


@dataclass
class ActorConfig:
    optimizer: Literal["adam", "adamw"] = "adam"
    adam_eps: Annotated[float, Positive] = 1e-5
    weight_decay: Annotated[float, NonNegative] = 0.0
    device: Annotated[str, TorchDevice] = "cpu"
    strategy: Literal["ddp", "fsdp"] = "ddp"  # how several actor ranks share the model; ignored with one rank
    dist_timeout_s: Annotated[float, Positive] = (
        60.0  # the actor ranks' rendezvous and every collective fail after this long (never torch's 30 min)
    )
    global_batch_size: Annotated[int, Positive] | None = (
        None  # samples per optimizer step summed over all actor ranks (None: algorithm.minibatch_size; set, it replaces it)
    )
    micro_batch_size: Annotated[int, Positive] | None = (
        None  # samples per forward/backward on one rank; gradients accumulate over a minibatch's micro-batches (None: no accumulation)
    )
    gradient_checkpointing: bool = (
        False  # recompute the network's activations in backward: less memory, one more forward
    )
    # The fsdp_* keys keep their defaults unless strategy is fsdp.
    fsdp_sharding_strategy: Literal["full_shard", "shard_grad_op", "no_shard", "hybrid_shard"] = "full_shard"
    fsdp_hybrid_shard_size: Annotated[int, Positive] | None = (
        None  # hybrid_shard: ranks per shard group (None: the actor ranks of one node)
    )
    fsdp_param_dtype: Annotated[Literal["float32", "bfloat16"] | None, FLOAT16] = (
        None  # compute dtype of forward and backward (None: the parameters' own)
    )
    fsdp_reduce_dtype: Annotated[Literal["float32", "bfloat16"] | None, FLOAT16] = (
        None  # dtype of the gradient reduction (None: fsdp_param_dtype)
    )
    fsdp_cpu_offload: bool = False  # keep sharded parameters, gradients and optimizer state in CPU memory


@dataclass
class RolloutConfig:
    device: Annotated[str, TorchDevice] = "cpu"
    pipeline_stage_num: Annotated[int, AtLeastOne] = (
        1  # env stages per env worker: env steps stage i while rollout infers i+1; divides the envs per env worker
    )


@dataclass
class ClusterConfig:
    backend: Literal["auto", "inline", "ray"] = (
        "auto"  # auto: inline when every component has one rank on one node, else ray
    )
    num_nodes: Annotated[int, AtLeastOne] = 1
    devices_per_node: Annotated[int, AtLeastOne] | None = (
        None  # GPUs per node, or CPU slots without GPUs (None: detect)
    )
    # {component: device range} for actor, rollout, env, eval (README: 'Placement'). A component it
    # does not name keeps its default: actor and env device 0; rollout on the actor's devices, one
    # rank each, as many as divide the env ranks; eval (one device, placed only when
    # runner.eval_interval > 0) with env rank 0. So `component_placement.actor=0-1` alone is complete.
    component_placement: dict = field(default_factory=lambda: dict(DEFAULT_PLACEMENT))
    simulate_nodes: Annotated[int, NonNegative] = (
        0  # >1: rehearse num_nodes (equal to it) on this machine as a local multi-raylet Ray cluster
    )
    simulate_isolation: Literal["none", "namespaces"] = (
        "none"  # namespaces: each simulated node its own network, PIDs, /tmp and hostname (root; README: 'Rehearsing a cluster in isolation')
    )
    simulate_clock_skew_s: dict = field(
        default_factory=dict
    )  # {node index: seconds} a simulated node's clock is off by (its Python processes' wall clock; needs simulate_isolation: namespaces)
    ray_address: str | None = None  # an existing Ray cluster (as after `ray start`); None: start one
    node_ip: Annotated[str, IPAddress] = "127.0.0.1"  # the address a locally started Ray advertises
    env_vars: dict = field(
        default_factory=dict
    )  # set in every worker: {NAME: value}, and {node index: {NAME: value}} per node
    exchange: Literal["auto", "compiled", "classic", "direct"] = (
        "auto"  # ray: env ⇄ rollout through a Ray Compiled Graph (compiled), two actor calls per step via the controller (classic), worker-to-worker sockets (direct), or, auto: direct when env and rollout workers are on different nodes, else the graph where it can be built (README: 'Env ⇄ rollout exchanges')
    )
    fuse_collocated: bool = False  # ray: run rank r of env, rollout and actor in one process when they share a device (one call per rank per iteration, no weight sync; README: 'Fused ranks')


# The incident causes a restart may help with by default (runner.restart_on); watch/watchdog.py
# lists all of them, and validate.py checks restart_on against that list.
RESTARTABLE = (
    "worker_died",
    "worker_exception",
    "process_frozen",
    "phase_timeout",
    "rank_missing_from_collective",
    "collective_mismatch",
    "peer_unreachable",
    "startup_timeout",
)


@dataclass
class RunnerConfig:
    total_env_steps: Annotated[int, Positive] = 100_000
    seed: Annotated[int, NonNegative] = 1
    run_dir: str = "runs"  # parent folder of run directories
    name: str | None = None  # run name (default: env id); the folder is <name>-<time>
    checkpoint_interval: Annotated[int, AtLeastOne] = 50  # iterations between checkpoints (and one at the end)
    keep_checkpoints: Annotated[int, AtLeastOne] = 3  # how many of the newest checkpoints to keep
    log_interval: Annotated[int, AtLeastOne] = 1  # iterations between console lines
    resume: str | None = (
        None  # a run directory to continue (it must hold a complete checkpoint), or 'auto': the newest run of this config's name in run_dir, a new run if there is none
    )
    torch_threads: Annotated[int, NonNegative] = 1  # intra-op threads of this process (0: torch's default)
    target_return: Annotated[float, Finite] | None = None  # stop once the last-100-episode mean reaches this
    loggers: list[TRACKERS] = field(
        default_factory=lambda: ["jsonl", "tensorboard"]
    )  # where metrics go: jsonl (metrics.jsonl) | tensorboard | wandb | mlflow (optional extras; README: 'Tracking')
    tensorboard: bool = (
        True  # false: no TensorBoard even where runner.loggers names it (the switch from before runner.loggers)
    )
    tracker_timeout_s: Annotated[float, Positive] = (
        30.0  # the longest one tracker call may take; past it (or on an error) that tracker is dropped with one warning and training goes on
    )
    weight_sync_interval: Annotated[int, AtLeastOne] = (
        1  # iterations between actor → rollout weight syncs (separate processes)
    )
    param_check_interval: Annotated[int, NonNegative] = (
        10  # iterations between cross-rank comparisons of every parameter's and buffer's fingerprint; a divergence stops the run (0: never)
    )
    checkpoint_replay_buffer: bool = False  # sac: checkpoints also hold every actor rank's replay buffer shard (bigger files; a resume trains on the same data instead of refilling)
    eval_interval: Annotated[int, NonNegative] = (
        0  # iterations between deterministic evaluations on eval envs of their own (0: never; README: 'Evaluation during training')
    )
    eval_episodes: Annotated[int, Positive] = (
        10  # deterministic episodes per evaluation, shared evenly by min(eval_episodes, 10) eval envs
    )
    eval_video: bool = False  # film each evaluation's first episode: <run>/video/eval-<iteration>.gif (its episodes then play on one env)
    max_restarts: Annotated[int, NonNegative] = (
        0  # after an incident whose cause is in restart_on, restart from the newest intact checkpoint, at most this often within restart_window_s (README: 'Supervisor and restarts')
    )
    restart_on: list[str] = field(
        default_factory=lambda: list(RESTARTABLE)
    )  # incident causes that restart (watch/watchdog.py CAUSES; never interrupted, disk_full or watchdog_error)
    restart_window_s: Annotated[float, Positive] = (
        3600.0  # a restart storm ends the run: max_restarts within this many seconds
    )


@dataclass
class WatchdogConfig:
    # All in seconds but deadline_factor; validate.py relates them (interval < timeout, min <= max).
    enabled: bool = True
    heartbeat_interval_s: Annotated[float, Positive] = 0.5  # how often each worker publishes its record
    heartbeat_timeout_s: Annotated[float, Positive] = (
        5.0  # no beat for this long: the process is frozen (or gone); > heartbeat_interval_s
    )
    startup_allowance_s: Annotated[float, Positive] = (
        300.0  # a worker process's first heartbeat (Ray scheduling and starting it), from when watching starts
    )
    startup_step_allowance_s: Annotated[float, Positive] = (
        60.0  # a start-up step never seen finishing (env construction, spaces, first reset, group join)
    )
    first_call_bound_s: Annotated[float, Positive] = 15.0  # any other call never seen finishing
    busy_allowance_s: Annotated[float, Positive] = (
        600.0  # a call past its deadline that is busy (CPU, a moving stack), not blocked: a warning until this
    )
    deadline_factor: Annotated[float, AtLeastOne] = (
        10.0  # a phase may take this many times its longest observed duration
    )
    min_deadline_s: Annotated[float, Positive] = 5.0  # ... but never less than this
    max_deadline_s: Annotated[float, Positive] = 1800.0  # ... nor more than this (>= min_deadline_s)
    collective_timeout_s: Annotated[float, Positive] = 5.0  # ranks waiting in a collective another rank never entered
    poll_interval_s: Annotated[float, Positive] = 0.25  # how often the watchdog reads the heartbeats
    stop_grace_s: Annotated[float, Positive] = (
        30.0  # after Ctrl-C / SIGTERM, how long the controller has to checkpoint and stop before it is killed
    )


@dataclass
class DebugConfig:
    # Fault injection for rehearsing failures (README: 'Freeze-proofing'): {kind, component, rank,
    # method, call}, e.g. {kind: kill, component: actor, rank: 1, call: 3} (debug/faults.py lists
    # the kinds and defaults; validate.py checks it, and the rank against the placement).
    fault: dict = field(default_factory=dict)


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    # The common keys until the plan parses the section as its algorithm's own (plan/load.py).
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    @property
    def batch_size(self) -> int:
        """Transitions gathered per iteration."""
        return self.algorithm.num_steps * self.env.num_envs


SECTION_TYPES: dict[str, Any] = {
    "env": EnvConfig,
    "algorithm": AlgorithmConfig,
    "model": ModelConfig,
    "actor": ActorConfig,
    "rollout": RolloutConfig,
    "cluster": ClusterConfig,
    "runner": RunnerConfig,
    "watchdog": WatchdogConfig,
    "debug": DebugConfig,
}

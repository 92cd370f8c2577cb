"""The typed config: one dataclass per YAML section, with the defaults a user gets.

The docstring under each field is the reference documentation for its key: the site's config
reference (docs/reference/config.md) is generated from them. A key's type, choices (`Literal`) and
range (`Annotated[..., Range]`, `constraints.py`) stand on the field and are checked by the loader;
rules that relate several keys live in `plan/rules.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fleetrl.config.constraints import (
    AtLeastOne,
    Finite,
    IPAddress,
    NonNegative,
    Positive,
    PositiveOrInf,
    TorchDevice,
    UnitInterval,
)
from fleetrl.config.model_sections import FLOAT16, MlpModelConfig, ModelConfig

RESUME_AUTO = "auto"  # runner.resume: continue the newest run of this config's name (run_dir.resume_dir)
TRACKERS = Literal["jsonl", "tensorboard", "wandb", "mlflow"]  # fleetrl/tracking/trackers.py

DEFAULT_PLACEMENT = {"actor": 0, "env": 0}  # and rollout: see plan/placement.py default_rollout; eval: default_eval


@dataclass
class EnvConfig:
    """The simulators: which environment, how many copies, and what wraps them."""

    id: str = "CartPole-v1"
    """A Gymnasium id, or `module:attr` naming a callable that returns one `gymnasium.Env`; resolved
    before anything starts (docs: guides/simulator.md)."""
    kwargs: dict = field(default_factory=dict)
    """Passed to `gymnasium.make` or to the `module:attr` callable (checked against its signature)."""
    num_envs: Annotated[int, Positive] = 8
    """Simulators in total, split evenly over the env workers."""
    max_episode_steps: Annotated[int, Positive] | None = None
    """Truncate episodes after this many simulator steps (null: the env's own limit)."""
    vectorization: Literal["sync", "async"] = "sync"
    """How an env worker steps its simulators: `sync` in its own process, `async` one subprocess per
    simulator."""
    normalize_obs: bool = False
    """Normalise observations by a running mean and std (per float key of a Dict), checkpointed."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return, checkpointed."""
    clip_obs: Annotated[float, PositiveOrInf] = 10.0
    """Clip normalised observations to [-clip_obs, clip_obs]."""
    clip_reward: Annotated[float, PositiveOrInf] = 10.0
    """Clip normalised rewards to [-clip_reward, clip_reward]."""
    wrappers: Literal["none", "atari"] = "none"
    """A preset of standard wrappers around each simulator: `atari` is CleanRL's Atari preprocessing
    (docs: guides/atari.md); `none` leaves the env as it is."""
    nan_policy: Literal["error", "zero", "skip_episode"] = "error"
    """What a NaN or infinite reward or observation from a simulator does, checked before any
    normalisation: `error` stops the run as the incident `non_finite`, naming the env worker, the
    env, the key and the step; `zero` replaces each such value by 0; `skip_episode` ends that env's
    episode there (reward 0, no bootstrap, the env reset) and counts it in no return. Both are
    counted (`non_finite_replaced`, `non_finite_skipped` in metrics.jsonl and summary.json): for
    simulators known to emit them now and then (docs: concepts/incidents.md)."""


@dataclass
class AlgorithmConfig:
    """The keys every algorithm reads. Each algorithm's section is a subclass holding its own keys
    too (in its package, `fleetrl/algos/<name>/config.py`), chosen by `name` through the registry
    (`fleetrl.algos.registry`); the loader builds that subclass."""

    name: str = "ppo"
    """A registered algorithm: a built-in (docs: concepts/algorithms.md) or one a plugin registers
    (docs: guides/algorithm.md). A key of another algorithm is an error that says whose it is."""
    num_steps: Annotated[int, Positive] = 128
    """Env steps per env per iteration (the rollout length)."""
    gamma: Annotated[float, UnitInterval] = 0.99
    """Discount factor."""
    lr: Annotated[float, Positive] = 3e-4
    """Learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over `runner.total_env_steps`."""
    minibatch_size: Annotated[int, Positive] = 256
    """Samples per optimizer step, over all actor ranks (on-policy: a divisor of
    `num_steps * env.num_envs`)."""
    max_grad_norm: Annotated[float, NonNegative] = 0.5
    """Clip the global gradient norm to this (0: no clipping)."""

    @property
    def resets_envs_each_iteration(self) -> bool:
        """Whether every iteration's episodes start from fresh, group-seeded resets (groups of
        `reset_group_size` envs, e.g. for group-relative advantages)."""
        return False

    @property
    def reset_group_size(self) -> int:
        """Consecutive envs reset with one seed (a group); 1: every env its own seed."""
        return 1

    @property
    def staleness_bound(self) -> int | None:
        """The most policy versions a sample may lag the actor by when it is trained; older ones
        are dropped (None: no bound; docs: concepts/async.md)."""
        return None


@dataclass
class ActorConfig:
    """The trainable model's ranks: optimizer, device, and how several ranks share the model. The
    `fsdp_*` keys keep their defaults unless `strategy` is `fsdp` (docs: guides/fsdp.md)."""

    optimizer: Literal["adam", "adamw"] = "adam"
    """Adam, or AdamW (decoupled weight decay)."""
    adam_eps: Annotated[float, Positive] = 1e-5
    """The optimizer's epsilon."""
    weight_decay: Annotated[float, NonNegative] = 0.0
    """The optimizer's weight decay (L2 with `adam`, decoupled with `adamw`)."""
    device: Annotated[str, TorchDevice] = "cpu"
    """Where the actor ranks train: `cpu`, `cuda`, `cuda:1` (docs: guides/gpu.md)."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """How several actor ranks share the model; ignored with one rank."""
    dist_timeout_s: Annotated[float, Positive] = 60.0
    """The actor ranks' rendezvous and every collective fail after this long (never torch's 30 min);
    so do the weight-sync group's (`runner.weight_sync_transport: collective`)."""
    global_batch_size: Annotated[int, Positive] | None = None
    """Samples per optimizer step summed over all actor ranks (null: `algorithm.minibatch_size`;
    set, it replaces it)."""
    micro_batch_size: Annotated[int, Positive] | None = None
    """Samples per forward/backward on one rank; gradients accumulate over a minibatch's
    micro-batches (null: no accumulation)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (per block for the transformer, the whole network for the
    MLP): less memory, one more forward."""
    fsdp_sharding_strategy: Literal["full_shard", "shard_grad_op", "no_shard", "hybrid_shard"] = "full_shard"
    """`full_shard` (ZeRO-3), `shard_grad_op` (ZeRO-2: blocks stay gathered from forward to
    backward), `no_shard` (replicas), `hybrid_shard` (sharded within a node, replicated across)."""
    fsdp_hybrid_shard_size: Annotated[int, Positive] | None = None
    """`hybrid_shard`: ranks per shard group (null: the actor ranks of one node)."""
    fsdp_param_dtype: Annotated[Literal["float32", "bfloat16"] | None, FLOAT16] = None
    """Compute dtype of forward and backward (null: the parameters' own, float32); master weights,
    optimizer state, checkpoints and the rollout's weights stay float32 (docs: guides/vla.md,
    Precision)."""
    fsdp_reduce_dtype: Annotated[Literal["float32", "bfloat16"] | None, FLOAT16] = None
    """Dtype gradients are reduce-scattered in (null: `fsdp_param_dtype`)."""
    fsdp_cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in CPU memory, copied to the device per
    block."""
    checkpoint_format: Literal["full", "sharded"] = "full"
    """`full`: rank 0 gathers the whole actor state into the .pt; `sharded`: each rank writes its own
    shards through torch.distributed.checkpoint, resumable at any actor world size (docs:
    guides/action-chunks-and-fsdp.md)."""


@dataclass
class RolloutConfig:
    """The inference copies of the policy that turn observations into actions."""

    device: Annotated[str, TorchDevice] = "cpu"
    """Where the rollout workers infer: `cpu`, `cuda`, `cuda:1`."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype of acting (autocast on the rollout's copy of the weights): `auto` is bfloat16 on
    a GPU that has it, or where the weights are bfloat16 already (a VLA's `model.dtype`), else
    float32 (docs: guides/vla.md, Precision)."""
    pipeline_stage_num: Annotated[int, AtLeastOne] = 1
    """Env stages per env worker: the env steps stage i while the rollout infers stage i+1 (a divisor
    of the envs per env worker)."""


@dataclass
class ClusterConfig:
    """Where the components run: nodes, devices, the backend and how env and rollout talk
    (docs: concepts/placement.md)."""

    backend: Literal["auto", "inline", "ray"] = "auto"
    """`auto`: `inline` (one process) when every component has one rank on one node, else `ray`."""
    num_nodes: Annotated[int, AtLeastOne] = 1
    """Nodes of the cluster; device ranks count across them."""
    devices_per_node: Annotated[int, AtLeastOne] | None = None
    """GPUs per node, or CPU slots where there are none (null: detected)."""
    component_placement: dict = field(default_factory=lambda: dict(DEFAULT_PLACEMENT))
    """`{component: device range}` for `actor`, `rollout`, `env`, `eval`. A component it does not name
    keeps its default: actor and env on device 0; rollout on the actor's devices, one rank each, as
    many as divide the env ranks; eval (one device, placed only when `runner.eval_interval` > 0) with
    env rank 0. So `component_placement.actor=0-1` alone is complete (docs: concepts/placement.md)."""
    simulate_nodes: Annotated[int, NonNegative] = 0
    """Above 1: rehearse `num_nodes` (equal to it) on this machine as a local multi-raylet Ray
    cluster."""
    simulate_isolation: Literal["none", "namespaces"] = "none"
    """`namespaces`: each simulated node gets its own network, PIDs, /tmp and hostname (needs root;
    docs: guides/isolation.md)."""
    simulate_clock_skew_s: dict = field(default_factory=dict)
    """`{node index: seconds}` a simulated node's wall clock is off by (its Python processes'; needs
    `simulate_isolation: namespaces`)."""
    ray_address: str | None = None
    """An existing Ray cluster to join (as after `ray start`); null: start a private one."""
    node_ip: Annotated[str, IPAddress] = "127.0.0.1"
    """The address a locally started Ray advertises."""
    env_vars: dict = field(default_factory=dict)
    """Environment variables set in every worker: `{NAME: value}`, or `{node index: {NAME: value}}`
    per node."""
    exchange: Literal["auto", "compiled", "classic", "direct"] = "auto"
    """On Ray, how env and rollout workers exchange observations and actions: a Ray Compiled Graph
    (`compiled`), two actor calls per step through the controller (`classic`), worker-to-worker
    sockets (`direct`); `auto`: direct, the cheapest in CPU and time on one node and between nodes
    (docs: concepts/backends.md, Env ⇄ rollout exchanges)."""
    fuse_collocated: bool = False
    """On Ray, run rank r of env, rollout and actor in one process when they share a device: one call
    per rank per iteration, no weight sync (docs: concepts/backends.md, Fused ranks)."""


# The incident causes a restart may help with by default (runner.restart_on); watch/incident.py
# lists all of them, and plan/rules.py checks restart_on against that list.
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
    """The run: its length, seed, directory, checkpoints, logging, evaluation and restarts."""

    total_env_steps: Annotated[int, Positive] = 100_000
    """Env steps to train for, counted over all env workers (every executed step of an action chunk)."""
    seed: Annotated[int, NonNegative] = 1
    """The seed every rank's and env's random streams derive from."""
    run_dir: str = "runs"
    """Parent folder of run directories."""
    name: str | None = None
    """Run name (null: the env id); the run's folder is `<name>-<time>`."""
    checkpoint_interval: Annotated[int, AtLeastOne] = 50
    """Iterations between checkpoints (and one at the end)."""
    keep_checkpoints: Annotated[int, AtLeastOne] = 3
    """How many of the newest checkpoints to keep."""
    log_interval: Annotated[int, AtLeastOne] = 1
    """Iterations between progress lines, each written to train.log. On a terminal the live line
    shows each; off one (a log file, CI) the console shows at most one every 5 seconds, and the
    last."""
    resume: str | None = None
    """A run directory to continue (it must hold an intact checkpoint), or `auto`: the newest run of
    this config's name in `run_dir`, a new run if there is none (docs: guides/recover.md)."""
    init_from: str | None = None
    """A run directory (its newest intact checkpoint) or a checkpoint file whose policy weights
    start this run, e.g. `fleetrl sft`'s for RL; the optimizer, counters and normaliser statistics
    start fresh (docs: guides/manipulation.md). Read when a run starts, never on a resume, whose
    checkpoint holds the weights (and `algorithm.kl_coef`'s reference)."""
    torch_threads: Annotated[int, NonNegative] = 1
    """Intra-op threads of the controller's process (0: torch's default)."""
    target_return: Annotated[float, Finite] | None = None
    """Stop once the last-100-episode mean return reaches this (null: train to the end)."""
    loggers: list[TRACKERS] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Where metrics go: `jsonl` (metrics.jsonl), `tensorboard`, `wandb`, `mlflow` (optional extras;
    docs: guides/trackers.md)."""
    tensorboard: bool = True
    """false: no TensorBoard even where `loggers` names it (the switch from before `loggers`)."""
    tracker_timeout_s: Annotated[float, Positive] = 30.0
    """The longest one tracker call may take; past it (or on an error) that tracker is dropped with
    one warning and training goes on."""
    weight_sync_interval: Annotated[int, AtLeastOne] = 1
    """Policy versions between actor → rollout weight syncs (when they are separate processes): the
    rollout loads the actor's weights at the start of a collection once they are this many versions
    (updates) newer than its own, so its samples are up to `weight_sync_interval` − 1 versions old, plus
    the queue's lag with `asynchronous` (docs: concepts/async.md)."""
    asynchronous: bool = False
    """Collect and train at once: env and rollout workers go on collecting with the weights they hold
    while the actor trains on what has arrived (a queue of `async_queue_batches`), and the rollout
    picks up each new policy version at its next collection without waiting for the actor. Samples
    are then policy versions old (`algorithm.max_staleness`, `algorithm.off_policy_correction`);
    for the algorithms whose spec accepts it (docs: concepts/async.md)."""
    async_queue_batches: Annotated[int, AtLeastOne] = 1
    """With `asynchronous`: collected batches that may wait for the actor; a collection starts only
    while the queue has room for it (back-pressure), so a sample is at most this many versions old
    when trained (with `weight_sync_interval` 1)."""
    weight_sync: Literal["full", "trainable", "changed"] = "full"
    """What a sync sends: every tensor; or (after a first full sync) only the trainable parameters
    and buffers — with LoRA or a frozen base, the adapters and heads — whole; or, `changed`, only
    their values that changed at the rollout's precision (`rollout.dtype`: a bfloat16 rollout gets
    only values whose bfloat16 rounding moved), sparse and delta-encoded (docs:
    guides/action-chunks-and-fsdp.md)."""
    weight_sync_compress: bool = False
    """With `weight_sync: changed`: zlib-compress (level 1) each patch's positions and values."""
    weight_sync_transport: Literal["ray", "collective"] = "ray"
    """How a sync reaches rollout workers in processes of their own. `ray`: actor rank 0's payload goes
    to each through Ray's object store. `collective`: its bytes are broadcast from actor rank 0 over a
    process group of actor rank 0 and every rollout worker, formed when the run starts (Gloo on the
    CPU, NCCL where each member is on a GPU of its own; the rendezvous on actor rank 0's node address
    alone, every member proving the run's secret before any weights move), only a small header
    through Ray. If that group cannot be formed within `actor.dist_timeout_s` (a member unreachable,
    or one without the secret) the run says why and syncs through Ray. Where rollout and actor share
    a process (inline, fused ranks) nothing is sent either way. Not with `asynchronous`: the rollout
    would wait for the actor's update to receive (docs: guides/action-chunks-and-fsdp.md)."""
    param_check_interval: Annotated[int, NonNegative] = 10
    """Iterations between cross-rank comparisons of every parameter's and buffer's fingerprint; a
    divergence stops the run (0: never)."""
    eval_interval: Annotated[int, NonNegative] = 0
    """Iterations between deterministic evaluations on eval envs of their own (0: never;
    docs: guides/evaluation.md)."""
    eval_episodes: Annotated[int, Positive] = 10
    """Deterministic episodes per evaluation, shared evenly by min(eval_episodes, 10) eval envs."""
    eval_video: bool = False
    """Film each evaluation's first episode to `<run>/video/eval-<iteration>.gif` (its episodes then
    play one after another on one env)."""
    max_restarts: Annotated[int, NonNegative] = 0
    """After an incident whose cause is in `restart_on`, restart from the newest intact checkpoint, at
    most this often within `restart_window_s` (docs: concepts/supervisor.md, Restarts)."""
    restart_on: list[str] = field(default_factory=lambda: list(RESTARTABLE))
    """Incident causes that restart (docs: reference/incident-causes.md); never `interrupted`,
    `disk_full`, `watchdog_error` or `non_finite`, which a restart cannot cure."""
    restart_window_s: Annotated[float, Positive] = 3600.0
    """A restart storm ends the run: more than `max_restarts` within this many seconds is exit 4."""


@dataclass
class WatchdogConfig:
    """The supervisor's watchdog: heartbeats, deadlines and allowances, all in seconds but
    `deadline_factor` (docs: concepts/incidents.md). `plan/rules.py` relates them (interval < timeout,
    min <= max)."""

    enabled: bool = True
    """Run the watchdog that judges the heartbeats (false: workers still beat and record their calls,
    for `fleetrl top` and `fleetrl stack`, but no stall is detected)."""
    heartbeat_interval_s: Annotated[float, Positive] = 0.5
    """How often each worker publishes its heartbeat record."""
    heartbeat_timeout_s: Annotated[float, Positive] = 5.0
    """No beat for this long: the process is frozen (or gone); above `heartbeat_interval_s`."""
    startup_allowance_s: Annotated[float, Positive] = 300.0
    """A worker process's first heartbeat (Ray scheduling and starting it), from when watching
    starts."""
    startup_step_allowance_s: Annotated[float, Positive] = 60.0
    """A start-up step never seen finishing (worker construction, spaces, first reset, process-group
    join)."""
    first_call_bound_s: Annotated[float, Positive] = 15.0
    """Any other call never seen finishing."""
    busy_allowance_s: Annotated[float, Positive] = 600.0
    """A call past its deadline that is busy (CPU, a moving stack), not blocked: a warning until it
    has run this long, then an incident. The time its thread waited, runnable, for a CPU (a host
    loaded past its cores) is not counted."""
    deadline_factor: Annotated[float, AtLeastOne] = 10.0
    """A phase may take this many times its longest observed duration."""
    min_deadline_s: Annotated[float, Positive] = 5.0
    """A learned deadline is never shorter than this."""
    max_deadline_s: Annotated[float, Positive] = 1800.0
    """A learned deadline is never longer than this (at least `min_deadline_s`)."""
    collective_timeout_s: Annotated[float, Positive] = 5.0
    """Ranks waiting this long in a collective another rank never entered (or entered differently)
    are an incident."""
    poll_interval_s: Annotated[float, Positive] = 0.25
    """How often the watchdog reads the heartbeats."""
    stop_grace_s: Annotated[float, Positive] = 30.0
    """After Ctrl-C / SIGTERM, how long the controller has to checkpoint and stop before it is
    killed. A stop during an update waits for it: where an update can outlast this, the stop ends
    without a checkpoint of the iteration under way, so raise it for runs with long updates."""


@dataclass
class DebugConfig:
    """Rehearsing failures on purpose."""

    fault: dict = field(default_factory=dict)
    """Inject a failure: `{kind, component, rank, method, call}`, e.g. `{kind: kill, component:
    actor, rank: 1, call: 3}`; debug/faults.py lists the kinds and defaults, and one that could never
    fire is a config error (docs: guides/recover.md, Rehearse a failure)."""


@dataclass
class Config:
    """A whole run's config: one section per YAML section."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """The simulators."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The algorithm, chosen by `algorithm.name`, and its keys (the common ones until the plan parses
    the section as its algorithm's own: plan/load.py)."""
    model: ModelConfig = field(default_factory=MlpModelConfig)
    """The policy network, chosen by `model.id`, and its keys (config/model_sections.py)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The trainable model's ranks."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The inference copies of the policy."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Nodes, devices, placement and backend."""
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    """The run itself."""
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    """The supervisor's watchdog."""
    debug: DebugConfig = field(default_factory=DebugConfig)
    """Fault injection."""

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

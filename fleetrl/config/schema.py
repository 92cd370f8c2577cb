"""The typed config: one dataclass per YAML section, with the defaults a user gets.

Field comments are the reference documentation for each key. A key's type, choices (`Literal`) and
range (`Annotated[..., Range]`, `constraints.py`) stand on the field and are checked by the loader;
rules that relate several keys live in `validate.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fleetrl.cluster.placement import DEFAULT_PLACEMENT
from fleetrl.config.constraints import (
    AtLeastOne,
    Finite,
    IPAddress,
    NonEmpty,
    NonNegative,
    Note,
    Positive,
    PositiveOrInf,
    Range,
    TorchDevice,
)

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


@dataclass
class AlgorithmConfig:
    name: str = "ppo"  # ppo | ppg | sac
    num_steps: int = 128  # steps per env per iteration (rollout length)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    lr: float = 3e-4
    anneal_lr: bool = True  # linear decay of lr to 0 over runner.total_env_steps
    update_epochs: int = 4
    minibatch_size: int = 256  # samples per optimizer step, over all actor ranks; must divide num_steps * env.num_envs
    clip_coef: float = 0.2
    anneal_clip: bool = False  # linear decay of clip_coef to 0, as RL-Zoo's lin_0.2
    clip_vloss: bool = False  # clip the value update around the old values (clip_coef)
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    norm_adv: bool = True  # normalise advantages per minibatch
    target_kl: float | None = None  # stop the epoch loop when the approx. KL exceeds this
    adv_type: str = "gae"  # gae | grpo: (return - group mean) / group std over episodes that started from one state (README: 'GRPO')
    group_size: int = (
        8  # grpo: envs i..i+g-1 (consecutive, g = group_size) are reset with one seed each iteration and form a group
    )
    logprob_type: str = "action_level"  # action_level | token_level (needs model.action_bins): one PPO ratio per action from the summed token log-probs, or one clipped ratio per token, averaged
    entropy_type: str = "action_level"  # action_level | token_level (needs model.action_bins): entropy bonus of the whole action (sum over tokens) or the mean per-token entropy
    # PPG (algorithm.name: ppg, Cobbe et al. 2020); needs model.aux_value_head: true
    n_pi: int = 32  # ppg: policy-phase iterations per auxiliary phase
    aux_epochs: int = 6  # ppg: epochs over the phase's stored data in the auxiliary phase
    aux_minibatch_size: int | None = (
        None  # ppg: samples per auxiliary optimizer step over all actor ranks (None: the policy phase's minibatch)
    )
    beta_clone: float = 1.0  # ppg: weight of the behavioural-cloning KL(pi_old || pi) in the auxiliary loss
    # SAC (algorithm.name: sac, Haarnoja et al. 2018): off-policy, Box actions. It also reads num_steps
    # (env steps per env per iteration), gamma, minibatch_size (the sample of every gradient step, over
    # all actor ranks), lr (default of q_lr / policy_lr), anneal_lr and max_grad_norm (0: no clipping).
    buffer_size: int = 1_000_000  # sac: replay capacity in transitions over all actor ranks; each env keeps its newest buffer_size // env.num_envs
    learning_starts: int = 100  # sac: the first this many global env steps take uniform random actions, and training waits until the replay holds this many
    update_to_data: float = 1.0  # sac: gradient steps per new env step, global: an iteration runs update_to_data * num_steps * env.num_envs of them (fractions carry over), all ranks together
    tau: float = 0.005  # sac: Polyak factor of the target critics, target += tau * (critic - target)
    q_lr: float | None = (
        None  # sac: learning rate of the twin critics and of the entropy coefficient (None: algorithm.lr)
    )
    policy_lr: float | None = None  # sac: learning rate of the actor (None: algorithm.lr)
    alpha: float = 1.0  # sac: entropy coefficient: its initial value with autotune, else fixed
    autotune: bool = True  # sac: tune alpha so that the policy's entropy tracks target_entropy
    target_entropy: float | None = None  # sac: autotune's target entropy (None: minus the action dimension)
    policy_frequency: int = 1  # sac: one actor (and alpha) update every this many critic updates
    target_network_frequency: int = 1  # sac: one Polyak update of the target critics every this many critic updates
    matmul_dtype: str | None = (
        None  # sac: bfloat16 runs the hidden-to-hidden layers' matmuls (forward and backward) in bfloat16, ~4x faster on CPUs with AVX512-BF16/AMX; weights, Adam, losses and the input/output layers stay float32 (None: float32 throughout)
    )


@dataclass
class ModelConfig:
    id: str = "mlp"  # 'mlp', or 'module:attr' building an nn.Module (README: 'Your own network')
    kwargs: dict = field(
        default_factory=dict
    )  # passed to a custom model's constructor ({} with 'mlp', which reads the keys below)
    hidden_sizes: Annotated[list[Annotated[int, Positive]], NonEmpty] = field(default_factory=lambda: [64, 64])
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
    # {component: device range} for actor, rollout, env (README: 'Placement'). A component it does
    # not name keeps its default: actor and env device 0; rollout on the actor's devices, one rank
    # each, as many as divide the env ranks. So `component_placement.actor=0-1` alone is complete.
    component_placement: dict = field(default_factory=lambda: dict(DEFAULT_PLACEMENT))
    simulate_nodes: Annotated[int, NonNegative] = (
        0  # >1: rehearse num_nodes (equal to it) on this machine as a local multi-raylet Ray cluster
    )
    ray_address: str | None = None  # an existing Ray cluster (as after `ray start`); None: start one
    node_ip: Annotated[str, IPAddress] = "127.0.0.1"  # the address a locally started Ray advertises
    env_vars: dict = field(
        default_factory=dict
    )  # set in every worker: {NAME: value}, and {node index: {NAME: value}} per node
    fuse_collocated: bool = False  # ray: run rank r of env, rollout and actor in one process when they share a device (one call per rank per iteration, no weight sync; README: 'Fused ranks')


@dataclass
class RunnerConfig:
    total_env_steps: Annotated[int, Positive] = 100_000
    seed: Annotated[int, NonNegative] = 1
    run_dir: str = "runs"  # parent folder of run directories
    name: str | None = None  # run name (default: env id); the folder is <name>-<time>
    checkpoint_interval: Annotated[int, AtLeastOne] = 50  # iterations between checkpoints (and one at the end)
    keep_checkpoints: Annotated[int, AtLeastOne] = 3  # how many of the newest checkpoints to keep
    log_interval: Annotated[int, AtLeastOne] = 1  # iterations between console lines
    resume: str | None = None  # a run directory to continue (it must hold a complete checkpoint)
    torch_threads: Annotated[int, NonNegative] = 1  # intra-op threads of this process (0: torch's default)
    target_return: Annotated[float, Finite] | None = None  # stop once the last-100-episode mean reaches this
    tensorboard: bool = True
    weight_sync_interval: Annotated[int, AtLeastOne] = (
        1  # iterations between actor → rollout weight syncs (separate processes)
    )
    param_check_interval: Annotated[int, NonNegative] = (
        10  # iterations between cross-rank comparisons of every parameter's and buffer's fingerprint; a divergence stops the run (0: never)
    )
    checkpoint_replay_buffer: bool = False  # sac: checkpoints also hold every actor rank's replay buffer shard (bigger files; a resume trains on the same data instead of refilling)


@dataclass
class WatchdogConfig:
    # All in seconds but deadline_factor; validate.py relates them (interval < timeout, min <= max).
    enabled: bool = True
    heartbeat_interval_s: Annotated[float, Positive] = 0.5  # how often each worker publishes its record
    heartbeat_timeout_s: Annotated[float, Positive] = (
        5.0  # no beat for this long: the process is frozen (or gone); > heartbeat_interval_s
    )
    startup_allowance_s: Annotated[float, Positive] = (
        300.0  # deadline of a phase never seen finishing (slow simulator start-up)
    )
    deadline_factor: Annotated[float, AtLeastOne] = (
        10.0  # a phase may take this many times its longest observed duration
    )
    min_deadline_s: Annotated[float, Positive] = 5.0  # ... but never less than this
    max_deadline_s: Annotated[float, Positive] = 1800.0  # ... nor more than this (>= min_deadline_s)
    collective_timeout_s: Annotated[float, Positive] = 5.0  # ranks waiting in a collective another rank never entered
    poll_interval_s: Annotated[float, Positive] = 0.25  # how often the watchdog reads the heartbeats


@dataclass
class DebugConfig:
    # Fault injection for rehearsing failures (README: 'Freeze-proofing'): {kind, component, rank,
    # method, call}, e.g. {kind: kill, component: actor, rank: 1, call: 3} (watch/faults.py lists
    # the kinds and defaults; validate.py checks it, and the rank against the placement).
    fault: dict = field(default_factory=dict)


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
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

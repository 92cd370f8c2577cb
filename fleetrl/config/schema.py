"""The typed config: one dataclass per YAML section, with the defaults a user gets.

Field comments are the reference documentation for each key; `fleetrl train --help-config`
prints them. Cross-field rules (divisibility, ranges) live in `validate.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"  # Gymnasium id, or 'module:attr' returning a gymnasium.Env
    kwargs: dict = field(default_factory=dict)  # passed to gymnasium.make / the entry point
    num_envs: int = 8  # simulators per env worker
    max_episode_steps: Optional[int] = None  # truncate episodes here (None: the env's own limit)
    vectorization: str = "sync"  # sync (one process) | async (one subprocess per env)
    normalize_obs: bool = False  # running mean/std of observations, checkpointed
    normalize_reward: bool = False  # scale rewards by the std of the discounted return
    clip_obs: float = 10.0  # clip normalised observations to [-clip_obs, clip_obs]
    clip_reward: float = 10.0  # clip normalised rewards likewise


@dataclass
class AlgorithmConfig:
    name: str = "ppo"  # ppo
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
    target_kl: Optional[float] = None  # stop the epoch loop when the approx. KL exceeds this


@dataclass
class ModelConfig:
    id: str = "mlp"  # 'mlp', or 'module:attr' building an nn.Module (README: 'Your own network')
    kwargs: dict = field(default_factory=dict)  # passed to a custom model's constructor
    hidden_sizes: list = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"  # tanh | relu | elu | gelu
    shared_trunk: bool = False  # one trunk for policy and value, or one each
    init_log_std: float = 0.0  # initial log std of the Gaussian policy (Box actions)
    ortho_init: bool = True


@dataclass
class ActorConfig:
    optimizer: str = "adam"  # adam | adamw
    adam_eps: float = 1e-5
    weight_decay: float = 0.0
    device: str = "cpu"
    strategy: str = "ddp"  # ddp | fsdp (FSDP2): how several actor ranks share the model; ignored with one rank
    dist_timeout_s: float = 60.0  # the actor ranks' rendezvous and every collective fail after this long (never torch's 30 min)
    global_batch_size: Optional[int] = None  # samples per optimizer step summed over all actor ranks (None: algorithm.minibatch_size; set, it replaces it)
    micro_batch_size: Optional[int] = None  # samples per forward/backward on one rank; gradients accumulate over a minibatch's micro-batches (None: no accumulation)
    gradient_checkpointing: bool = False  # recompute the network's activations in backward: less memory, one more forward
    fsdp_sharding_strategy: str = "full_shard"  # full_shard | shard_grad_op | no_shard | hybrid_shard (strategy: fsdp)
    fsdp_hybrid_shard_size: Optional[int] = None  # hybrid_shard: ranks per shard group (None: the actor ranks of one node)
    fsdp_param_dtype: Optional[str] = None  # float32 | bfloat16: compute dtype of forward and backward (None: the parameters' own)
    fsdp_reduce_dtype: Optional[str] = None  # float32 | bfloat16: dtype of the gradient reduction (None: fsdp_param_dtype)
    fsdp_cpu_offload: bool = False  # keep sharded parameters, gradients and optimizer state in CPU memory


@dataclass
class RolloutConfig:
    device: str = "cpu"
    pipeline_stage_num: int = 1  # env stages per env worker: env steps stage i while rollout infers i+1


@dataclass
class ClusterConfig:
    backend: str = "auto"  # auto (inline when every component has one rank on one node) | inline | ray
    num_nodes: int = 1
    devices_per_node: Optional[int] = None  # GPUs per node, or CPU slots without GPUs (None: detect)
    component_placement: dict = field(default_factory=lambda: {"actor": 0, "env": 0})
    simulate_nodes: int = 0  # >1: rehearse num_nodes on this machine as a local multi-raylet Ray cluster
    ray_address: Optional[str] = None  # an existing Ray cluster (as after `ray start`); None: start one
    node_ip: str = "127.0.0.1"  # the address a locally started Ray advertises
    env_vars: dict = field(default_factory=dict)  # set in every worker; {node index: {...}} per node


@dataclass
class RunnerConfig:
    total_env_steps: int = 100_000
    seed: int = 1
    run_dir: str = "runs"  # parent folder of run directories
    name: Optional[str] = None  # run name (default: env id); the folder is <name>-<time>
    checkpoint_interval: int = 50  # iterations between checkpoints (and one at the end)
    keep_checkpoints: int = 3  # how many of the newest checkpoints to keep
    log_interval: int = 1  # iterations between console lines
    resume: Optional[str] = None  # a run directory to continue
    torch_threads: int = 1  # intra-op threads of this process (0: torch's default)
    target_return: Optional[float] = None  # stop once the last-100-episode mean reaches this
    tensorboard: bool = True
    weight_sync_interval: int = 1  # iterations between actor → rollout weight syncs (separate processes)


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)

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
}

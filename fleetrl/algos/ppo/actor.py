"""PPO's actor component: the trainable policy and its optimizer; advantages and PPO updates.

One `ActorWorker` per actor rank. With one rank it trains alone: no process group, no wrapping,
no collective. With W ranks the runtime builds W workers (rank 0..W-1), then calls
`init_distributed(master_addr, master_port)` on all of them together; each then trains on its
shard of every trajectory (env columns, `Trajectory.shard`) and together they compute exactly the
single-process update (`fleetrl.algos.ppo.update.ppo_update`).

Collective methods — every rank must call them, in the same order, or the others wait (until
`actor.dist_timeout_s`, then fail): those of `ActorBase`, and with `actor.strategy: fsdp` also
`state_dict`, `load_state_dict` and `policy_weights`, which gather or scatter the shards (rank 0
receives the full state, other ranks an empty dict).

With `algorithm.kl_coef` > 0 each rank also holds the reference policy
(`fleetrl.algos.ppo.reference`): a frozen copy of the policy taken when `runner.init_from`'s weights
are loaded, kept in the checkpoint as `reference` and restored from it on resume. Its log-probs of
an update's batch come from one pass before the update (`fleetrl.algos.ppo.batch_pass`), not one
per minibatch piece in every epoch: they are the same in each.

`spec` registers the `ppo` algorithm.
"""

from __future__ import annotations

import logging
from pathlib import Path

import gymnasium as gym
import torch

from fleetrl.algos.common.gae import compute_gae
from fleetrl.algos.common.optim import build_optimizer
from fleetrl.algos.ppo.batch_pass import batch_pass
from fleetrl.algos.ppo.config import decoupled, interpolates_proximal, needs_proximal_pass, reference_kl_coef
from fleetrl.algos.ppo.correction import (
    Proximal,
    importance_metrics,
    importance_weights,
    interpolation_weights,
    proximal_pass,
    vtrace_targets,
)
from fleetrl.algos.ppo.grpo import grpo_advantages
from fleetrl.algos.ppo.reference import frozen_copy
from fleetrl.algos.ppo.update import PPOBatch, ppo_update
from fleetrl.config.keys import effective_minibatch_size
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError
from fleetrl.models.policy import Policy
from fleetrl.observations import map_obs
from fleetrl.parallel import dcp, state, weight_sync
from fleetrl.parallel.changed_values import Changes
from fleetrl.parallel.sharding import EnvShard, Minibatches
from fleetrl.parallel.wrap import LossPath, enable_gradient_checkpointing, local_loss_path, wrap_policy
from fleetrl.trajectory import Trajectory
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.rollout_worker import rollout_dtype

log = logging.getLogger("fleetrl")


def sample_ages(trajectory: Trajectory) -> torch.Tensor:
    """`trajectory.ages`, which the asynchronous controller sets on every batch it submits."""
    if trajectory.ages is None:
        raise ValueError(
            "algorithm.proximal_logprob loglinear interpolates by each sample's age, and this "
            "trajectory has none (Trajectory.ages: set by the asynchronous controller)"
        )
    return trajectory.ages


def policy_optimizer(config: Config, policy: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer over the policy's trainable parameters (with LoRA: the adapters and value head)."""
    trainable = [p for p in policy.parameters() if p.requires_grad]
    return build_optimizer(config.actor, [{"params": trainable, "lr": config.algorithm.lr}])


class ActorWorker(ActorBase):
    def __init__(
        self, config: Config, observation_space: gym.Space, action_space: gym.Space, rank: int = 0, world_size: int = 1
    ):
        super().__init__(config, observation_space, action_space, rank, world_size)
        self.policy = Policy.from_config(config.model, observation_space, action_space).to(self.device)
        if config.actor.gradient_checkpointing:
            enable_gradient_checkpointing(self.policy.network)
        self.optimizer = policy_optimizer(config, self.policy)
        self.generator = torch.Generator().manual_seed(config.runner.seed)
        self.minibatch_size = effective_minibatch_size(config)
        # the weight of the policy's auxiliary prediction error (model.predict_keys); None: none
        self.predict_coef = config.model.prediction_weight
        self.changes: Changes | None = None  # runner.weight_sync changed: what the rollouts hold
        # algorithm.kl_coef > 0: the frozen policy the run started from (load_policy_weights, or a
        # checkpoint's on resume); None otherwise, and then no reference forward pass runs
        self.reference: Policy | None = None
        # One rank: the policy itself. Several ranks get theirs (DDP or FSDP) in init_distributed.
        self.loss_path: LossPath = local_loss_path(self.policy)
        if world_size == 1 and config.actor.strategy == "fsdp":
            log.info(
                "one actor rank: actor.strategy 'fsdp' and the actor.fsdp_* settings do not "
                "apply (no sharding, no mixed precision)"
            )

    @property
    def sharded(self) -> bool:
        """Parameters and optimizer state are FSDP shards (state getters/setters are collective)."""
        return self.loss_path.strategy == "fsdp"

    def replicated_modules(self) -> dict:
        return {"policy": self.policy}

    def wrap_for_ranks(self) -> None:
        self.loss_path = self.wrap_loss_path()
        if self.sharded:  # fully_shard replaced the parameters: the optimizer must see the shards
            self.optimizer = policy_optimizer(self.config, self.policy)

    def wrap_loss_path(self) -> LossPath:
        """The loss path of several ranks (DDP or FSDP2 around the policy); algorithms whose
        phases use different parameters wrap each phase their own way."""
        return wrap_policy(self.policy, self.config.actor, self.device)

    def schedule(self, progress: float) -> tuple[float, float]:
        """(lr, clip_coef) at `progress` = global env steps / total env steps."""
        algo = self.config.algorithm
        remaining = max(0.0, 1.0 - progress)
        lr = algo.lr * remaining if algo.anneal_lr else algo.lr
        clip = algo.clip_coef * remaining if algo.anneal_clip else algo.clip_coef
        return lr, clip

    def train(self, trajectory: Trajectory, progress: float) -> dict:
        """Train on `trajectory` — this rank's shard (its env columns) when there are several
        ranks — and return metrics reduced over all ranks: identical on every rank. A
        collective with several ranks: all train together, with the same `progress`."""
        self.require_distributed()
        algo = self.config.algorithm
        proximal, reference_logprobs = None, None
        piece = self.config.actor.micro_batch_size or max(1, self.minibatch_size // self.world_size)
        if needs_proximal_pass(self.config):
            proximal = proximal_pass(self.loss_path.module, trajectory, piece, self.device)
        if self.reference is not None:
            reference_logprobs = batch_pass(self.reference, trajectory, piece, self.device)[0]
        advantages, returns = self.advantages(trajectory, proximal)
        logprobs, values, importance, interpolation = trajectory.logprobs, trajectory.values, None, None
        if proximal is not None and algo.adv_type == "vtrace":  # the targets' critic: the clip's and the metric's
            values = proximal.values
        if proximal is not None and decoupled(self.config):  # the ratio to the proximal policy, weighed
            logprobs = proximal.logprobs
            importance = importance_weights(proximal, trajectory, algo.logprob_type, algo.importance_cap)
        if interpolates_proximal(self.config):  # the same, the proximal policy interpolated in ppo_loss
            interpolation = interpolation_weights(sample_ages(trajectory))
        batch = PPOBatch(
            map_obs(lambda x: x.flatten(0, 1), trajectory.obs),
            trajectory.actions.flatten(0, 1),
            logprobs.flatten(0, 1),
            values.flatten(),
            advantages.flatten(),
            returns.flatten(),
            None if trajectory.steps is None else trajectory.steps.flatten(),
            None if importance is None else importance.flatten(0, 1),
            None if interpolation is None else interpolation.flatten(),
            None if reference_logprobs is None else reference_logprobs.flatten(0, 1),
        ).to(self.device)
        lr, clip = self.schedule(progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        minibatches = Minibatches(
            self.shard(trajectory), self.minibatch_size, self.config.actor.micro_batch_size, self.generator
        )
        train_policy = not self.critic_warmup(progress)
        metrics = ppo_update(
            self.loss_path,
            self.optimizer,
            batch,
            self.config.algorithm,
            clip,
            minibatches,
            self.all_reduce,
            train_policy,
            self.predict_coef,
        )
        metrics.update(
            lr=lr,
            clip_coef=clip,
            explained_variance=self.explained_variance(batch.values, batch.returns),
            policy_trained=int(train_policy),  # 0 in the critic warm-up
        )
        if proximal is not None:
            metrics.update(importance_metrics(proximal, trajectory, algo.importance_cap, self.all_reduce))
        return metrics

    def load_policy_weights(self, weights: dict) -> None:
        """`runner.init_from`'s weights, and with `algorithm.kl_coef` > 0 the reference policy: a
        frozen copy of the policy holding them."""
        super().load_policy_weights(weights)
        if reference_kl_coef(self.config) > 0:
            self.reference = frozen_copy(self.policy)

    def critic_warmup(self, progress: float) -> bool:
        """Whether the iteration at `progress` (env steps before it / total) is one of
        `algorithm.critic_warmup_steps`'s: derived from the step count, so a resumed run knows."""
        steps_before = round(progress * self.config.runner.total_env_steps)
        return steps_before < self.config.algorithm.critic_warmup_steps

    def advantages(self, trajectory: Trajectory, proximal: Proximal | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, value targets), both (T, N). The value targets are GAE's returns, or with
        `algorithm.adv_type: vtrace` V-trace's from the `proximal` policy and critic; the advantages
        GAE's, V-trace's, or with `grpo` group-relative episode returns
        (`fleetrl.algos.ppo.grpo.grpo_advantages`: groups lie within one rank's env columns)."""
        algo = self.config.algorithm
        if algo.adv_type == "vtrace":
            return vtrace_targets(trajectory, proximal, algo)
        advantages, returns = compute_gae(
            trajectory.rewards,
            trajectory.values,
            trajectory.next_values,
            trajectory.terminated,
            trajectory.dones,
            algo.gamma,
            algo.gae_lambda,
            trajectory.steps,
        )
        if algo.adv_type == "grpo":  # episode returns: raw chunk returns with chunks (γ^j would tell chunks apart)
            rewards = trajectory.rewards if trajectory.chunk_returns is None else trajectory.chunk_returns
            advantages = grpo_advantages(rewards, trajectory.dones, algo.group_size)
        return advantages, returns

    def shard(self, trajectory: Trajectory) -> EnvShard:
        """Where this rank's part of `trajectory` lies in the whole. A shard of another size than
        the config's would make this rank plan other minibatches than the others — a desync:
        fail loudly instead."""
        config = self.config
        steps, envs = trajectory.rewards.shape
        shard = EnvShard(steps, envs * self.world_size, self.rank, self.world_size)
        if self.world_size > 1 and (shard.steps, shard.total_envs) != (config.algorithm.num_steps, config.env.num_envs):
            raise ValueError(
                f"actor rank {self.rank}: got a trajectory shard of {shard.steps} steps × "
                f"{shard.envs_per_rank} envs, expected {config.algorithm.num_steps} × "
                f"{config.env.num_envs // self.world_size} (env.num_envs / {self.world_size} ranks)"
            )
        return shard

    def explained_variance(self, predicted: torch.Tensor, target: torch.Tensor) -> float:
        """1 - Var[target - predicted] / Var[target] over all ranks' samples (1: a perfect value
        function, ≤ 0 useless): one all-reduce of five float64 sums."""
        target, error = target.double(), (target - predicted).double()
        sums = self.all_reduce(
            torch.stack(
                [
                    torch.tensor(float(target.numel()), dtype=torch.float64, device=target.device),
                    target.sum(),
                    target.pow(2).sum(),
                    error.sum(),
                    error.pow(2).sum(),
                ]
            )
        )
        count, target_sum, target_squares, error_sum, error_squares = sums.tolist()
        target_var = target_squares - target_sum * target_sum / count
        error_var = error_squares - error_sum * error_sum / count
        return float("nan") if target_var <= 0 else 1 - error_var / target_var

    def policy_weights(self) -> dict:
        """A full CPU copy of the plain Policy's state_dict: what rollout workers load. Without
        FSDP every rank returns it, locally. Under FSDP it is gathered from the shards: ALL
        ranks must call this together; rank 0 gets the weights, the other ranks {}."""
        return state.model_state(self.policy, self.sharded)

    def trainable_weights(self) -> dict:
        """The trainable parameters and the buffers of the Policy (`fleetrl.parallel.weight_sync`):
        under FSDP collective, rank 0 gets them, and only they are all-gathered."""
        return weight_sync.trainable_state(self.policy, self.sharded)

    def changed_weights(self) -> dict:
        """`runner.weight_sync: changed` (`fleetrl.parallel.changed_values`): the first call
        {"full": the policy's weights}, every later one {"patch": only the trainable values that
        changed at the rollout's precision since}. Under FSDP collective; rank 0 gets them."""
        first = self.changes is None
        if first:
            self.changes = Changes(rollout_dtype(self.config), self.config.runner.weight_sync_compress)
        weights = self.policy_weights() if first else None
        trainable = self.trainable_weights()
        if not trainable and self.sharded:  # not rank 0: the gathered tensors are rank 0's
            return {}
        if first:
            self.changes.record(trainable)
            return {"full": weights}
        return {"patch": self.changes.patch(trainable)}

    def state_dict(self) -> dict:
        """The full actor state in the single-process format. Under FSDP: collective, complete
        on rank 0 only (other ranks get empty 'policy' and 'optimizer' dicts)."""
        if not self.sharded:
            policy = self.policy.state_dict()
            optimizer = self.optimizer.state_dict()
            if self.device.type != "cpu":  # checkpoints hold CPU tensors, loadable anywhere
                policy, optimizer = state.to_cpu(policy), state.to_cpu(optimizer)
        else:
            policy = state.model_state(self.policy, True)
            optimizer = state.optimizer_state(self.policy, self.optimizer, True)
        saved = {"policy": policy, "optimizer": optimizer, "generator": self.generator.get_state()}
        if self.reference is not None:  # full checkpoints only (validate_reference)
            saved["reference"] = state.to_cpu(self.reference.state_dict())
        return saved

    def save_sharded(self, folder: str) -> dict:
        """Each rank writes its shards of the policy and optimizer into `folder` (collective);
        the minibatch generator's state (the same on every rank) is returned."""
        dcp.save(Path(folder), self.policy, self.optimizer)
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, saved: dict) -> None:
        """Load a full state (from any strategy and rank count), or a sharded checkpoint's (its
        folder in `shards_path`, written by any number of ranks). Under FSDP: collective, and
        every rank must be given the full state."""
        if "shards_path" in saved:
            dcp.load(Path(saved["shards_path"]), self.policy, self.optimizer)
        else:
            state.load_model_state(self.policy, saved["policy"], self.sharded)
            state.load_optimizer_state(self.policy, self.optimizer, saved["optimizer"], self.sharded)
        self.generator.set_state(saved["generator"])
        self.load_reference(saved.get("reference"))

    def load_reference(self, weights: dict | None) -> None:
        """On resume with `algorithm.kl_coef` > 0: the reference the run started with, from its
        checkpoint — never the resumed policy, nor `runner.init_from` read again (that run may have
        trained on since). A checkpoint without one (written with kl_coef 0) is a `ConfigError`."""
        if reference_kl_coef(self.config) == 0:
            self.reference = None
            return
        if weights is None:
            raise ConfigError(
                "algorithm.kl_coef",
                reference_kl_coef(self.config),
                "0.0 when resuming a run that started without it (or start a new run with runner.init_from)",
                "its checkpoints hold no reference policy to stay near",
            )
        reference = frozen_copy(self.policy)
        reference.load_state_dict(weights)
        self.reference = reference

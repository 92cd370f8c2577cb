"""The SAC actor component: replay buffer shard, actor, twin critics, targets, temperature.

One `SACActorWorker` per actor rank (an `ActorBase`). An iteration (`train`):

1. the rank adds its shard of the trajectory (its env columns: T steps × N/W envs) to its own
   replay buffer shard (`fleetrl.algos.common.replay`, plain state — never a module buffer);
2. it counts the iteration's *global* env steps, T·N, into `env_steps`; once the replay (summed
   over ranks) holds `algorithm.learning_starts` transitions, it owes `update_to_data` gradient
   steps per new global env step (fractions carry over to the next iteration);
3. it runs them. Each gradient step samples `minibatch_size / W` transitions uniformly from the
   rank's own shard (its own generator), so the W ranks together train on a minibatch_size
   sample; the critic and policy losses are means over the rank's part, and their DDP wrappers
   average the gradients, which gives the mean over the whole global sample. The Adam steps, the
   Polyak update of the targets and α then see the same numbers on every rank: replicas, targets
   included, stay bitwise equal (checked every `runner.param_check_interval` iterations);
4. it decides, from `env_steps` (the same on every rank), whether the rollout workers still act
   at random (`algorithm.learning_starts`): on the shared actor module when they share the
   process, with the weights (`SACWeights`) otherwise.

Every rank-dependent quantity — the number of gradient steps, whether the actor or the targets
update at a step, the warm-up — is a function of global counters, so every rank takes the same
branches and joins the same collectives.

Why one DDP wrapper per loss path (critics; actor + log α) rather than a manual all-reduce of
the gradients: DDP overlaps the reduction with the backward pass and keeps the loss path the
only thing that is wrapped (parallel/wrap.py); the two wrappers are always called in the same order on
every rank (critic forward+backward, then policy forward+backward), which is what two DDP
modules need, and the actor loss evaluates the critics outside their wrapper, with detached
weights, so the critic reducer never waits for gradients that do not come. The target critics
are not wrapped: they are updated in place from the (identical) critics.

Collective methods with several ranks (every rank calls them, in the same order): those of
`ActorBase`, and `state_dict` (gathers every rank's generator and replay shard onto rank 0).

This module registers the `sac` algorithm.
"""

from __future__ import annotations

import copy
import logging

import gymnasium as gym
import torch

from fleetrl.algos.common.replay import ReplayBuffer
from fleetrl.algos.sac.learner import SACBatch, SACLearner, SACWeights
from fleetrl.algos.sac.networks import EntropyCoefficient, build_sac_actor, build_twin_q
from fleetrl.config.keys import effective_minibatch_size
from fleetrl.config.schema import Config
from fleetrl.observations import storage_dtype
from fleetrl.parallel import state
from fleetrl.parallel.seeds import ACTOR_SAMPLING, rank_seed
from fleetrl.parallel.wrap import ddp
from fleetrl.trajectory import Trajectory
from fleetrl.workers.actor_base import ActorBase

log = logging.getLogger("fleetrl")
SAMPLE_CHUNK = 32  # gradient steps whose samples are gathered at once


class SACActorWorker(ActorBase):
    def __init__(
        self, config: Config, observation_space: gym.Space, action_space: gym.Space, rank: int = 0, world_size: int = 1
    ):
        super().__init__(config, observation_space, action_space, rank, world_size)
        algo = config.algorithm
        self.action_dim = int(action_space.shape[0])
        self.policy = build_sac_actor(config, observation_space, action_space).to(self.device)
        self.critic = build_twin_q(config, observation_space, action_space).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.entropy = EntropyCoefficient(algo.alpha, algo.autotune).to(self.device)
        self.learner = SACLearner(config, self.policy, self.critic, self.critic_target, self.entropy)
        self.generator = torch.Generator().manual_seed(rank_seed(config.runner.seed, rank, ACTOR_SAMPLING))
        self.sample_size = effective_minibatch_size(config) // world_size
        self.replay = ReplayBuffer(
            algo.buffer_size // config.env.num_envs,
            config.env.num_envs // world_size,
            observation_space.shape,
            action_space.shape,
            obs_dtype=storage_dtype(observation_space),  # images stay uint8 in the buffer
        )
        self.env_steps = 0  # global (all ranks' env columns), as the trajectories arrived
        self.update_debt = 0.0  # gradient steps owed, the fraction update_to_data left over
        self.policy.random_actions = self.env_steps < algo.learning_starts

    # ---------------------------------------------------------------------------- distribution

    def wrap_for_ranks(self) -> None:
        """The two loss paths in DDP (critics; actor + log α)."""
        if self.config.actor.strategy != "ddp":
            log.info("sac trains its replicas with DDP; actor.strategy %r does not apply", self.config.actor.strategy)
        self.learner.wrap(lambda module: ddp(module, self.device))

    # -------------------------------------------------------------------------------- training

    def train(self, trajectory: Trajectory, progress: float) -> dict:
        """Store this rank's shard of the iteration, then run the gradient steps it is owed; the
        metrics are averaged over ranks (identical on every rank). Collective with several ranks."""
        algo = self.config.algorithm
        self.require_distributed()
        steps, envs = trajectory.rewards.shape
        expected = (algo.num_steps, self.config.env.num_envs // self.world_size)
        if (steps, envs) != expected:  # another shape would make this rank owe other step counts
            raise ValueError(
                f"actor rank {self.rank}: got a trajectory shard of {steps} steps × {envs} "
                f"envs, expected {expected[0]} × {expected[1]}"
            )
        if trajectory.next_obs is None:
            raise ValueError("SAC needs trajectories with next_obs (a rollout worker with record_next_obs)")
        truncated = trajectory.dones & ~trajectory.terminated
        self.replay.add(
            trajectory.obs,
            trajectory.actions,
            trajectory.rewards,
            trajectory.terminated,
            truncated,
            trajectory.next_obs,
        )
        new_steps = steps * envs * self.world_size
        self.env_steps += new_steps
        gradient_steps = 0
        if len(self.replay) * self.world_size >= max(1, algo.learning_starts):
            self.update_debt += algo.update_to_data * new_steps
            gradient_steps = int(self.update_debt + 1e-9)
            self.update_debt = max(0.0, self.update_debt - gradient_steps)
        self.learner.set_progress(progress)
        metrics = self.run_updates(gradient_steps)
        self.policy.random_actions = self.env_steps < algo.learning_starts
        return metrics

    def run_updates(self, count: int) -> dict:
        """`count` gradient steps on samples of this rank's shard; their mean statistics."""
        learner, algo, device = self.learner, self.config.algorithm, self.device
        learner.reset_stats(self.rank, self.world_size)
        done = 0
        while done < count:
            chunk = min(count - done, SAMPLE_CHUNK)
            index = torch.randint(0, len(self.replay), (chunk, self.sample_size), generator=self.generator)
            noise = torch.randn((chunk, 2, self.sample_size, self.action_dim), generator=self.generator)
            obs, actions, rewards, not_terminated, next_obs = (t.to(device) for t in self.replay.gather(index))
            discount = (algo.gamma * not_terminated).to(device)
            noise = noise.to(device)
            for k in range(chunk):
                learner.update(SACBatch(obs[k], actions[k], rewards[k], discount[k], next_obs[k], noise[k]))
            done += chunk
        alpha = float(self.entropy.log_alpha.detach().exp())
        metrics = {
            "grad_steps": count,
            "alpha": alpha,
            "replay_size": len(self.replay) * self.world_size,
            "random_actions": bool(self.policy.random_actions),
            "lr": learner.policy_optimizer.param_groups[0]["lr"],
            "q_loss": None,
            "q_mean": None,
            "actor_loss": None,
            "alpha_loss": None,
            "entropy": None,
        }
        if count == 0:  # the same on every rank: no collective either
            return metrics
        reduced = self.all_reduce(torch.cat([learner.mean_stats(), learner.evidence()]))
        learner.verify(reduced[5:])  # a NaN or inf loss, gradient or parameter: NonFiniteError
        q_loss, q_mean, actor_loss, alpha_loss, entropy = (reduced[:5] / self.world_size).tolist()
        metrics.update(q_loss=q_loss, q_mean=q_mean)
        if learner.policy_stats:
            metrics.update(actor_loss=actor_loss, entropy=entropy, alpha_loss=alpha_loss if algo.autotune else None)
        return metrics

    # ------------------------------------------------------------------------------- replicas

    def replicated_modules(self) -> dict:
        """Everything that must be identical on all ranks — the target critics included."""
        return {
            "actor": self.policy,
            "critic": self.critic,
            "critic_target": self.critic_target,
            "entropy": self.entropy,
        }

    # ---------------------------------------------------------------------------------- state

    def policy_weights(self) -> SACWeights:
        """What the rollout workers load: a CPU copy of the actor's weights and the warm-up flag."""
        return SACWeights(state.model_state(self.policy, False), bool(self.policy.random_actions))

    def shard_state(self) -> dict:
        replay = self.replay.state_dict() if self.config.algorithm.checkpoint_replay_buffer else None
        return {"generator": self.generator.get_state(), "replay": replay}

    def state_dict(self) -> dict:
        """The full state. 'policy' is the actor's state_dict (what `fleetrl eval` loads);
        'shards' holds every rank's sampling generator and, with algorithm.checkpoint_replay_buffer,
        its replay buffer shard. With several ranks a collective: rank 0 gathers the shards (the
        other ranks' 'shards' is None)."""
        shard = self.shard_state()
        if self.world_size == 1:
            shards = [shard]
        else:
            import torch.distributed as dist

            from fleetrl.probe import flight_recorder

            shards = [None] * self.world_size if self.rank == 0 else None
            with flight_recorder.collective("gather_object (replay shards)", torch.zeros(0)):
                dist.gather_object(shard, shards, dst=0)
        saved = {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "entropy": self.entropy.state_dict(),
            **self.learner.state_dict(),
            "env_steps": self.env_steps,
            "update_debt": self.update_debt,
            "shards": shards,
        }
        return state.to_cpu(saved) if self.device.type != "cpu" else saved

    def load_state_dict(self, saved: dict) -> None:
        """Load a full state (every rank gets all of it and takes its own shard). A replay
        shard is restored when the checkpoint has one for this rank count; otherwise the buffer
        starts empty and training resumes once it holds algorithm.learning_starts transitions."""
        self.policy.load_state_dict(saved["policy"])
        self.critic.load_state_dict(saved["critic"])
        self.critic_target.load_state_dict(saved["critic_target"])
        self.entropy.load_state_dict(saved["entropy"])
        self.learner.load_state_dict(saved)
        self.env_steps, self.update_debt = saved["env_steps"], saved["update_debt"]
        self.policy.random_actions = self.env_steps < self.config.algorithm.learning_starts
        shards = saved.get("shards") or []
        if len(shards) == self.world_size:
            shard = shards[self.rank]
            self.generator.set_state(shard["generator"])
            if shard["replay"] is not None:
                self.replay.load_state_dict(shard["replay"])
                return
        elif self.rank == 0:
            log.warning(
                "the checkpoint was written by %d actor rank(s), this run has %d: the replay "
                "shards and sampling generators are not restored",
                len(shards),
                self.world_size,
            )
        if self.rank == 0:
            log.info(
                "resuming with an empty replay buffer: training waits until it holds "
                "algorithm.learning_starts=%d transitions",
                self.config.algorithm.learning_starts,
            )

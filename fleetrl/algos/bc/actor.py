"""Behaviour cloning's actor: the PPO actor's policy, optimizer and wrapping, trained on
demonstrations instead of on its own trajectories.

The supervised stage is a run like any other (`fleetrl sft`: the same controller loop,
supervisor, watchdog, checkpoints, metrics and reports as `fleetrl train`), so each iteration
still plays `algorithm.num_steps` steps of the current policy on the training envs — the
training-time `success_rate` of a policy being cloned, and the env-step budget
(`runner.total_env_steps`) that sets the run's length — but the actor ignores that trajectory's
actions: it takes `updates_per_iteration` steps of maximum likelihood of the expert's actions
(under the same `Policy`, so the same action tokens with `model.action_bins`, and the same
Hugging Face VLA acting through its vocabulary with `model.id: hf`), plus a value loss on the
demonstrations' discounted returns, on minibatches drawn from the demonstrations. With
`model.action_chunk` K > 1 the expert's action at a step is the chunk of its next K actions
(`demonstrations.chunked`), its log-likelihood summed over the actions the expert took. A
Hugging Face VLA with a continuous action head (`model.action_head` l1 or flow) has no likelihood
to maximise here: the actor minimises the head's own supervised loss instead (the L1 distance,
π0's flow-matching loss), averaged over the actions the expert took.

With several ranks each rank draws its share of every minibatch from its own stream; every rank
takes the same number of steps (DDP's all-reduces line up). `spec` registers `bc`.
"""

from __future__ import annotations

import gymnasium as gym
import torch

from fleetrl.algos.common.finite import UpdateChecks
from fleetrl.algos.common.logprobs import decision_logprob, executed_mean
from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.config.schema import Config
from fleetrl.envs import demonstrations
from fleetrl.observations import map_obs
from fleetrl.parallel.grad_check import check_every_parameter_has_a_gradient
from fleetrl.parallel.seeds import ACTOR_SAMPLING, rank_seed
from fleetrl.trajectory import Trajectory

from .config import BCConfig

LOSS_TERMS = ("behaviour-cloning loss", "value loss", "prediction error")


class BCActor(ActorWorker):
    def __init__(
        self, config: Config, observation_space: gym.Space, action_space: gym.Space, rank: int = 0, world_size: int = 1
    ):
        super().__init__(config, observation_space, action_space, rank, world_size)
        algo: BCConfig = config.algorithm
        demos = demonstrations.load(
            algo.demonstrations,
            algo.features,
            algo.action_feature,
            observation_space,
            action_space,
            algo.gamma,
            config.model.action_chunk,
            algo.vf_coef,
        )
        if getattr(config.model, "standardize_inputs", False):  # before any rank wraps the policy
            self.policy.network.set_input_statistics(demos.statistics())
        self.obs = map_obs(lambda x: torch.from_numpy(x).to(self.device), demos.obs)
        self.actions = torch.from_numpy(demos.actions).to(self.device)
        self.steps = None if demos.steps is None else torch.from_numpy(demos.steps).to(self.device)
        self.returns = torch.from_numpy(demos.returns).to(self.device)
        self.sampler = torch.Generator().manual_seed(rank_seed(config.runner.seed, rank, ACTOR_SAMPLING))
        self.checked = False  # every parameter got a gradient (checked on the first step)
        # None: behaviour cloning maximises the likelihood of the expert's actions; a continuous head
        # of model.id hf (l1, flow) names its own supervised loss instead (models/hf/continuous.py)
        self.imitation_loss = getattr(self.policy, "imitation_loss", None)

    def train(self, trajectory: Trajectory, progress: float) -> dict:
        """`updates_per_iteration` behaviour-cloning steps; `trajectory` (the current policy's
        play) only counted, never learned from. Metrics reduced over ranks."""
        self.require_distributed()
        algo: BCConfig = self.config.algorithm
        lr = algo.lr * max(0.0, 1.0 - progress) if algo.anneal_lr else algo.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        per_rank = self.minibatch_size // self.world_size
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        checks = UpdateChecks(
            self.loss_path.policy, LOSS_TERMS, "the behaviour-cloning update", self.rank, self.world_size
        )
        params = self.loss_path.parameters()
        for grad_step in range(1, algo.updates_per_iteration + 1):
            index = torch.randint(len(self.actions), (per_rank,), generator=self.sampler).to(self.device)
            obs, actions = map_obs(lambda x, i=index: x[i], self.obs), self.actions[index]
            steps = None if self.steps is None else self.steps[index]
            if self.imitation_loss is None:  # maximum likelihood
                outputs = self.loss_path.module(obs, actions)
                logprob = decision_logprob(outputs.logprobs, steps)  # Σ over its tokens and executed chunk actions
                action_loss = -logprob.mean()
                probability = logprob.detach().exp().mean()
            else:  # a continuous head's own loss, over the executed actions of each chunk
                outputs = self.loss_path.module(obs, actions, imitation=True)
                action_loss = executed_mean(outputs.error, steps).mean()
                probability = torch.zeros_like(action_loss)  # no likelihood to report
            value_loss = 0.5 * (outputs.value - self.returns[index]).pow(2).mean()
            loss = action_loss + algo.vf_coef * value_loss
            prediction = torch.zeros_like(value_loss)
            if self.predict_coef is not None:  # model.predict_keys: the demonstrations' own recorded keys
                prediction = outputs.prediction_error.mean()
                loss = loss + self.predict_coef * prediction
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if not self.checked:
                check_every_parameter_has_a_gradient(self.loss_path.policy, self.loss_path.ignored, "behaviour-cloning")
                self.checked = True
            if algo.max_grad_norm > 0:  # the gradients checked before clipping, which takes their norms
                self.loss_path.clip_grad_norm_(algo.max_grad_norm, checks.gradient_norms(params, grad_step))
            self.optimizer.step()
            checks.loss(torch.stack([action_loss.detach(), value_loss.detach(), prediction.detach()]), grad_step)
            totals += torch.stack(
                [action_loss.detach(), value_loss.detach(), probability, prediction.detach()]
            ).double()
        reduced = self.all_reduce(torch.cat([totals, checks.evidence()]))  # [4:6]: ranks whose loss, gradients failed
        checks.verify(reduced[4:6])  # a NaN or inf loss, gradient or parameter: NonFiniteError
        means = (reduced[:4] / (self.world_size * algo.updates_per_iteration)).tolist()
        likelihood = {"expert_action_prob": means[2]} if self.imitation_loss is None else {}
        return {
            "bc_loss": means[0],  # minus the log-likelihood, or the continuous head's own loss
            "value_loss": means[1],
            **likelihood,  # the policy's probability (density) of the expert's action (chunk)
            "lr": lr,
            "grad_steps": algo.updates_per_iteration,
            "demonstration_steps": len(self.actions),
            **({"prediction_error": means[3]} if self.predict_coef is not None else {}),
        }

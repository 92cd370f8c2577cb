"""PPG's actor: PPO's actor (the policy phase) plus the auxiliary phase every `algorithm.n_pi`
iterations (`fleetrl.algos.ppg.update`). The rollout worker is PPO's.

`train(shard, progress)` keeps PPO's contract: it runs the policy phase on the iteration's data,
stores this rank's observations and value targets, and — after every n_pi-th iteration, a
decision taken from the iteration count alone and so the same on every rank — runs the
auxiliary phase on the stored data before returning. Its metrics then carry `aux_*` keys.

The auxiliary value head is PPG's own (`fleetrl.algos.ppg.aux_head`): added to the policy here,
never sent to the rollout workers. Several ranks: each phase has its own DDP wrapper
(`fleetrl.parallel.phases`), the policy phase's ignoring the auxiliary head, which gets no
gradient there; a parameter that neither phase reaches is named at construction. Both phases'
gradients are all-reduced.

Checkpoints hold, beside PPO's state (its `policy` without the head), the head, the stored data
of the phase in progress (gathered from all ranks into the single-process layout, so
`state_dict` is a collective with several ranks) and the iteration count; a resume with another
`env.num_envs` restarts the phase instead.

`spec` registers the `ppg` algorithm.
"""

from __future__ import annotations

import logging
import time

import gymnasium as gym
import torch

from fleetrl.algos.ppg.aux_head import add_aux_value_head, forward_aux, policy_forward, without_aux_head
from fleetrl.algos.ppg.config import aux_minibatch_size
from fleetrl.algos.ppg.update import aux_update, distribution_inputs, is_aux_iteration
from fleetrl.algos.ppo.actor import ActorWorker, policy_optimizer
from fleetrl.config.schema import Config
from fleetrl.parallel import state
from fleetrl.parallel.phases import ddp_phase_path, local_phase_path, unused_parameters
from fleetrl.parallel.sharding import EnvShard, Minibatches
from fleetrl.probe import flight_recorder
from fleetrl.trajectory import Trajectory

log = logging.getLogger("fleetrl")


class PPGActorWorker(ActorWorker):
    def __init__(
        self, config: Config, observation_space: gym.Space, action_space: gym.Space, rank: int = 0, world_size: int = 1
    ):
        super().__init__(config, observation_space, action_space, rank, world_size)
        add_aux_value_head(self.policy, config)
        self.optimizer = policy_optimizer(config, self.policy)  # over the head too
        self.unused = self.probe_unused_parameters(observation_space)
        self.aux_minibatch_size = aux_minibatch_size(config)
        self.aux_path = local_phase_path(self.policy, forward_aux, self.unused["aux"])
        self.loss_path = local_phase_path(self.policy, policy_forward, self.unused["policy"])
        self.stored_obs: list[torch.Tensor] = []  # per policy iteration: (T, local envs, *obs)
        self.stored_returns: list[torch.Tensor] = []  # (T, local envs)
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.policy_iterations = 0
        self.aux_phases = 0

    def probe_unused_parameters(self, observation_space: gym.Space) -> dict[str, list[str]]:
        """{phase: trainable parameters it never reaches}; raises naming any that no phase
        reaches (DDP would wait for its gradient forever, or it would silently never train)."""
        obs = torch.zeros(2, *observation_space.shape, device=self.device)
        actions = self.policy.act(obs, deterministic=True)[0]  # no random draw
        unused = {
            "policy": unused_parameters(self.policy, lambda p: p(obs, actions)),
            "aux": unused_parameters(self.policy, lambda p: forward_aux(p, obs)),
        }
        never = [name for name in unused["policy"] if name in unused["aux"]]
        if never:
            raise RuntimeError(
                f"PPG: the trainable parameter(s) {never} get a gradient in neither the policy phase "
                "(Policy.forward) nor the auxiliary phase (forward_features): DDP would wait for it. "
                "Use it in one of them, or freeze it (requires_grad=False)"
            )
        return unused

    def wrap_loss_path(self):
        """Several ranks: the policy phase's loss path (the base class's `loss_path`); the
        auxiliary phase's goes to `aux_path`."""
        self.aux_path = ddp_phase_path(self.policy, forward_aux, self.unused["aux"], self.device)
        return ddp_phase_path(self.policy, policy_forward, self.unused["policy"], self.device)

    def advantages(self, trajectory: Trajectory, proximal=None):
        advantages, returns = super().advantages(trajectory, proximal)
        self.pending = (trajectory.obs, returns)  # stored once the policy phase has trained on it
        return advantages, returns

    def train(self, trajectory: Trajectory, progress: float) -> dict:
        metrics = super().train(trajectory, progress)  # the policy phase: PPO
        obs, returns = self.pending
        self.pending = None
        # copies: a trajectory's tensors may be views of the rollout buffer, reused next iteration
        self.stored_obs.append(obs.detach().to("cpu", copy=True))
        self.stored_returns.append(returns.detach().to("cpu", copy=True))
        self.policy_iterations += 1
        metrics["ppg_policy_iterations"] = self.policy_iterations
        if is_aux_iteration(self.policy_iterations, self.config.algorithm.n_pi):
            recorder = flight_recorder.current()
            if recorder is None:
                metrics.update(self.auxiliary_phase())
            else:  # its own phase for the watchdog: far longer than a policy phase
                with recorder.in_phase(f"{recorder.phase or 'actor.train'}.aux"):
                    metrics.update(self.auxiliary_phase())
        return metrics

    def auxiliary_phase(self) -> dict:
        """Distil the value into the auxiliary head over the stored data, then clear it."""
        started = time.perf_counter()
        obs = torch.cat(self.stored_obs).to(self.device)  # (S, local envs, *obs)
        returns = torch.cat(self.stored_returns).to(self.device)
        steps, envs = returns.shape
        shard = EnvShard(steps, envs * self.world_size, self.rank, self.world_size)
        obs, returns = obs.flatten(0, 1), returns.flatten()
        old = distribution_inputs(self.policy, obs)
        minibatches = Minibatches(shard, self.aux_minibatch_size, self.config.actor.micro_batch_size, self.generator)
        metrics = aux_update(
            self.aux_path, self.optimizer, obs, returns, old, self.config.algorithm, minibatches, self.all_reduce
        )
        self.stored_obs, self.stored_returns = [], []
        self.aux_phases += 1
        metrics.update(aux_phases=self.aux_phases, aux_s=time.perf_counter() - started)
        return metrics

    # -- weights and checkpoints -------------------------------------------------------------

    def policy_weights(self) -> dict:
        """The policy's weights without the auxiliary head, which only the actor has."""
        return without_aux_head(super().policy_weights())[0]

    def trainable_weights(self) -> dict:
        return without_aux_head(super().trainable_weights())[0]

    def load_policy_weights(self, weights: dict) -> None:
        """Another run's policy (`runner.init_from`: a plain policy, no auxiliary head): the head
        keeps its fresh weights."""
        head = without_aux_head(state.model_state(self.policy, False))[1]
        super().load_policy_weights({**head, **weights})

    def gather_columns(self, local: torch.Tensor) -> torch.Tensor:
        """(S, local envs, ...) on every rank → (S, all envs, ...) in env order (one sum of
        zero-padded copies: exact). A collective with several ranks."""
        if self.world_size == 1:
            return local
        full = torch.zeros(local.shape[0], local.shape[1] * self.world_size, *local.shape[2:], dtype=local.dtype)
        per_rank = local.shape[1]
        full[:, self.rank * per_rank : (self.rank + 1) * per_rank] = local
        return self.all_reduce(full)

    def state_dict(self) -> dict:
        saved = super().state_dict()
        saved["policy"], head = without_aux_head(saved["policy"])  # the policy as PPO's: eval loads it
        stored = None
        if self.stored_obs:  # the same count on every rank: all gather, or none
            stored = {
                "obs": self.gather_columns(torch.cat(self.stored_obs)),
                "returns": self.gather_columns(torch.cat(self.stored_returns)),
                "iterations": len(self.stored_obs),
            }
        saved["ppg"] = {
            "policy_iterations": self.policy_iterations,
            "aux_phases": self.aux_phases,
            "stored": stored,
            "aux_value_head": head,
        }
        return saved

    def load_state_dict(self, saved: dict) -> None:
        ppg = saved.get("ppg") or {}
        head = ppg.get("aux_value_head", {})  # none in the `policy` of a checkpoint from before the split
        super().load_state_dict({**saved, "policy": {**saved["policy"], **head}})
        self.policy_iterations = ppg.get("policy_iterations", 0)
        self.aux_phases = ppg.get("aux_phases", 0)
        self.stored_obs, self.stored_returns = [], []
        stored = ppg.get("stored")
        if stored is None:
            return
        obs, returns, count = stored["obs"], stored["returns"], stored["iterations"]
        if returns.shape[1] != self.config.env.num_envs:
            log.warning(
                "the checkpoint's PPG phase data has %d env columns, this run %d: the "
                "auxiliary phase restarts with the next iteration's data",
                returns.shape[1],
                self.config.env.num_envs,
            )
            self.policy_iterations -= self.policy_iterations % self.config.algorithm.n_pi
            return
        per_rank = returns.shape[1] // self.world_size
        columns = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
        self.stored_obs = list(obs[:, columns].clone().chunk(count))
        self.stored_returns = list(returns[:, columns].clone().chunk(count))

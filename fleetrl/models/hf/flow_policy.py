"""`model.action_head: flow` — a Hugging Face VLM with a flow-matching action expert (π0, SmolVLA).

The VLM reads the prompt alone, once a decision; the expert (action_expert.py) denoises the chunk
from Gaussian noise in `model.flow.steps` Euler steps, each a forward of the expert that
cross-attends to the prompt's last hidden states (flow.py holds the chain's maths). The value head
reads the prompt's last token (backbone.py).

- **Acting** (phase `denoise`): with `model.flow.noise: sde` every step is a Gaussian transition
  and the decision's record is the whole chain, x_0..x_S (B, S + 1, K, D), with its
  log-probability (B, K): the sum of the steps' Gaussian log-densities. Deterministic acting
  (evaluation) runs the ODE. The env gets x_S (`to_env`).
- **The loss path** (RL updates; phase `denoise` too): the stored chain's S velocities in one
  batched call of the expert (B·S rows, the prefix's keys and values projected once a sample),
  then the same Gaussian log-densities — equal to acting's within float32 rounding
  (tests/test_vla_heads.py checks 1e-5). The entropy reported is the steps' Gaussian entropy,
  a constant of the fixed schedule.
- **Non-finite values**: a chain that turns NaN or infinite while acting stops the run as the
  incident `non_finite`, naming the denoising step whose velocity made it so (`check_chain`), before
  the rollout records anything; the update's loss and gradients are the actor's checks.
- **Imitation** (`fleetrl sft`): π0's flow-matching loss, a time from Beta(1.5, 1) and fresh noise per
  sample, the squared error of the predicted velocity (per chunk action, over its dimensions).
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import torch

from fleetrl.config.model_sections import HfModelConfig
from fleetrl.models.hf.action_expert import ActionExpert
from fleetrl.models.hf.backbone import VLANetwork, load_network
from fleetrl.models.hf.continuous import ContinuousActions, ContinuousVLA, proprioception
from fleetrl.models.hf.flow import (
    FlowChain,
    chain_log_prob,
    denoise,
    flow_matching_error,
    noisy_actions,
    training_times,
)
from fleetrl.models.hf.lora import keep_trainable_state
from fleetrl.models.hf.prompts import Prompts
from fleetrl.models.loss_outputs import LossOutputs
from fleetrl.non_finite import NonFiniteError
from fleetrl.probe.flight_recorder import phase


def check_chain(samples: torch.Tensor) -> None:
    """`NonFiniteError` naming the denoising step whose velocity first made acting's chain `samples`
    (B, S + 1, K, D) non-finite: x_{k+1} is step k's Euler (or SDE) step from x_k and v_k. One
    check of the whole chain (a host sync the rollout makes anyway when it takes the actions)."""
    finite = torch.isfinite(samples).flatten(2).all(-1)  # (B, S + 1)
    if bool(finite.all()):
        return
    column = int((~finite).any(0).nonzero()[0])
    row = int((~finite[:, column]).nonzero()[0])
    sample = samples[row, column].flatten()
    value = float(sample[~torch.isfinite(sample)][0])
    steps = samples.shape[1] - 1
    key = "the start noise x_0" if column == 0 else f"denoising step {column - 1} of {steps}"
    raise NonFiniteError(
        "flow velocity", key, value, f"acting, observation {row} of the batch: x_{column} is not finite"
    )


class FlowVLAPolicy(ContinuousVLA):
    """`model.action_head: flow` (module docstring)."""

    imitation_loss = "flow_matching"

    def __init__(
        self,
        network: VLANetwork,
        prompts: Prompts,
        actions: ContinuousActions,
        state: tuple[str, int] | None,
        chain: FlowChain,
    ):
        super().__init__(network, prompts, actions, state)
        self.chain = chain
        self.record_shape = (chain.steps + 1, actions.chunk, actions.dim)

    @classmethod
    def from_config(cls, config: HfModelConfig, observation_space: gym.Space, action_space: gym.Space):
        network, prompts = load_network(config, observation_space)
        actions = ContinuousActions(action_space, config.action_chunk, config.action_stats, "flow")
        state = proprioception(observation_space, config.state_key)
        flow = config.flow_chain
        network.head = ActionExpert(
            actions.dim, actions.chunk, network.hidden_size, state and state[1], flow.width, flow.layers, flow.heads
        )
        policy = cls(network, prompts, actions, state, FlowChain(flow.steps, flow.noise, flow.noise_level))
        policy.load_head(config)
        if config.lora is not None:
            keep_trainable_state(policy)
        return policy

    @property
    def expert(self) -> ActionExpert:
        return self.network.head

    def to_env(self, records: torch.Tensor) -> torch.Tensor:
        return self.actions.to_env(records[:, -1])

    def export_meaning(self, config: HfModelConfig) -> dict:
        return {"flow": dataclasses.asdict(config.flow_chain), "time": "openpi's: x_t = t·noise + (1 − t)·action"}

    @torch.no_grad()
    def act(self, obs, deterministic: bool = False):
        """(the chains (B, S + 1, K, D), their log-probabilities (B, *logprob_shape), values (B,))."""
        with phase("denoise"):
            prefix, mask = self.prefix(obs)
            state = self.state(obs)

            def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                return self.expert(x, t, prefix, mask, state)

            noise = torch.randn(prefix.shape[0], self.actions.chunk, self.actions.dim, device=self.device)
            samples, logprob = denoise(self.chain, velocity, noise, deterministic)
        check_chain(samples)
        return samples, self.per_action(logprob), self.value_of(prefix[:, -1])

    def scored(self, obs, records: torch.Tensor) -> LossOutputs:
        prefix, mask = self.prefix(obs)
        batch, steps = records.shape[0], self.chain.steps
        with phase("denoise"):
            times = self.chain.times()[:-1].to(dtype=torch.float32, device=self.device).repeat(batch)
            x = records[:, :-1].flatten(0, 1)
            v = self.expert(x, times, prefix, mask, self.state(obs), repeats=steps).unflatten(0, (batch, steps))
        logprob = chain_log_prob(self.chain, records, v)
        entropy = self.chain.entropy(batch, self.actions.chunk, self.actions.dim).to(self.device)
        return LossOutputs(self.per_action(logprob), self.per_action(entropy), self.value_of(prefix[:, -1]), None)

    def imitation(self, obs, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        prefix, mask = self.prefix(obs)
        t = training_times(actions.shape[0], device=self.device)
        x, target = noisy_actions(actions, torch.randn_like(actions), t)
        velocity = self.expert(x, t, prefix, mask, self.state(obs))
        return flow_matching_error(velocity, target), self.value_of(prefix[:, -1])

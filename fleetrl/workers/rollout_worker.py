"""The rollout component: a copy of the policy, inference only, that records what it serves.

A rollout worker serves one or more *lanes* — one pipeline stage of one env worker each. For
every lane it keeps a `TrajectoryBuffer`; `act(lane, t, step)` records the env's answer to step
t-1, then the policy's outputs for step t. The actor receives the finished trajectories.

When rollout and actor share a process (the inline backend) the rollout worker holds the actor's
own `Policy` object, so there is nothing to sync.

`rollout.dtype` bfloat16 acts under autocast: the weights stay what the actor trains (float32), so
the same object serves both; where the device supports it, `auto` picks bfloat16 on a GPU.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import gymnasium as gym
import numpy as np
import torch

from fleetrl.config.schema import Config
from fleetrl.models.policy import Policy
from fleetrl.non_finite import NonFiniteError, all_finite, first_non_finite
from fleetrl.observations import Observation, map_obs
from fleetrl.parallel import seeds
from fleetrl.parallel.changed_values import apply_changes
from fleetrl.parallel.seeds import ROLLOUT_NOISE, rank_seed
from fleetrl.parallel.sync_group import SyncMember
from fleetrl.parallel.sync_payload import Header, decode
from fleetrl.parallel.weight_sync import load_patch
from fleetrl.step_result import StepResult
from fleetrl.trajectory import Trajectory, TrajectoryBuffer


def rollout_seed(seed: int, rank: int) -> int:
    """The action-noise seed of rollout rank `rank`: distinct per rank, and following runner.seed."""
    return rank_seed(seed, rank, ROLLOUT_NOISE)


def process_rollout_rank() -> int:
    """This process's rollout rank (FLEETRL_RANK, set by the Ray backend); 0 elsewhere."""
    return int(os.environ.get("FLEETRL_RANK", "0"))


def rollout_dtype(config: Config) -> torch.dtype:
    """`rollout.dtype` as a torch dtype; `auto`: bfloat16 on a CUDA device that supports it, and
    wherever the weights are bfloat16 already (`model.dtype`)."""
    if config.rollout.dtype == "auto" and getattr(config.model, "dtype", "float32") == "bfloat16":
        return torch.bfloat16
    if config.rollout.dtype == "auto":
        device = torch.device(config.rollout.device)
        bf16 = device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return getattr(torch, config.rollout.dtype)


def check_finite(what: str, array: np.ndarray, lane: int, t: int, of: str) -> None:
    """`NonFiniteError` naming the env and step of the policy's first non-finite `what` in
    `array` (one per env of the lane, or per token / chunk action): the policy's outputs are
    checked before they are recorded, so a NaN log-probability or value never trains."""
    if all_finite(array):
        return
    index, value = first_non_finite(array)
    element = f", element {list(index[1:])}" if len(index) > 1 else ""
    where = f"lane {lane}, env {index[0]} of the lane{element}, rollout step {t}{' ' + of if of else ''}"
    raise NonFiniteError(f"policy {what}", what, value, where)


class RolloutWorker(SyncMember):
    """Every rollout worker is a member of the weight-sync group where the run has one
    (`SyncMember`, parallel/sync_group.py)."""

    # Subclasses for off-policy algorithms set this: the lanes then also record each step's true
    # next observation (Trajectory.next_obs).
    record_next_obs = False

    def __init__(self, policy: Policy, *, dtype: torch.dtype = torch.float32):
        self.policy = policy
        self.device = next(policy.parameters()).device  # the actor's, when they share the policy
        self.dtype = dtype
        self.lanes: list[TrajectoryBuffer] = []
        self.finished: list[Trajectory | None] = []
        # The policy version its weights are: the updates the actor had applied when it sent
        # them (the actor's own version with a shared policy). Every decision recorded carries it.
        self.version = 0

    @classmethod
    def from_config(cls, config: Config, observation_space: gym.Space, action_space: gym.Space):
        """A rollout worker in its own process, with its own copy of the policy (the weights come
        with the first sync). Actions draw from this process's torch generator, seeded here per
        rank: left alone, every new process starts from torch's one fixed default seed, which
        would give every rollout rank, in every run whatever runner.seed, the same noise."""
        policy = Policy.from_config(config.model, observation_space, action_space).requires_grad_(False)
        torch.manual_seed(rollout_seed(config.runner.seed, process_rollout_rank()))
        return cls(policy, dtype=rollout_dtype(config))

    def precision(self):
        """Autocast to `self.dtype` where it is not float32 (see the module docstring)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def infer(self, obs: np.ndarray, deterministic: bool = False):
        """(actions, log-probs, values) CPU tensors for a batch of observations. The actions are the
        policy's record of them (what its loss path scores: a flow head's whole chain), which
        `env_actions` turns into the env's."""
        with self.precision():
            actions, logprobs, values = self.policy.act(self.tensor(obs), deterministic)
        return actions.cpu(), logprobs.float().cpu(), values.float().cpu()

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """`infer`'s actions as the env takes them: the policy's `to_env`, which every policy a
        rollout worker acts with has (the identity where the record is the action; the continuous
        heads of `model.id: hf` record normalised actions or a whole chain, a squashed actor its
        [-1, 1]^d)."""
        return self.policy.to_env(actions)

    def values(self, obs: np.ndarray) -> torch.Tensor:
        with self.precision():
            return self.policy.value(self.tensor(obs)).float().cpu()

    def tensor(self, obs: Observation) -> Observation:
        """Observations as tensors on the policy's device, a dict of them for Dict spaces."""
        return map_obs(self.leaf_tensor, obs)

    def leaf_tensor(self, obs: np.ndarray) -> torch.Tensor:
        if obs.flags.writeable:
            return torch.from_numpy(obs).to(self.device)
        # Arrays that arrive through Ray are read-only views of its object store; the policy
        # only reads them, so torch's warning about non-writable arrays does not apply.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(obs).to(self.device)

    def configure_lanes(
        self, lane_sizes: list[int], steps: int, observation_space: gym.Space, action_space: gym.Space
    ) -> None:
        continuous = isinstance(action_space, gym.spaces.Box)
        chunk = getattr(self.policy, "action_chunk", 1)  # a chunk policy's actions: (K, *one action's shape)
        action_shape = ((chunk,) if chunk > 1 else ()) + (action_space.shape if continuous else ())
        self.lanes = [
            TrajectoryBuffer(
                steps,
                size,
                observation_space,
                getattr(self.policy, "record_shape", action_shape),  # what the policy records of an action
                np.float32 if continuous else np.int64,
                getattr(self.policy, "logprob_shape", ()),  # per action of a chunk, per token
                record_next_obs=self.record_next_obs,
                record_steps=chunk > 1,
            )
            for size in lane_sizes
        ]
        self.finished = [None] * len(lane_sizes)

    def act(self, lane: int, t: int, step: StepResult) -> np.ndarray | None:
        """Record the outcome of step t-1 (t > 0) and answer step t; at t == T close the lane."""
        buffer = self.lanes[lane]
        if t > 0:
            final_values = self.values(step.final_obs).numpy() if len(step.truncated_index) else None
            if final_values is not None:
                check_finite("value", final_values, lane, t, "of a truncated episode's final observation")
            buffer.record_outcome(t - 1, step, final_values)
        if t == buffer.steps:
            last_values = self.values(step.obs).numpy()
            check_finite("value", last_values, lane, t, "bootstrapped from at the rollout's end")
            self.finished[lane] = buffer.finish(last_values)
            return None
        actions, logprobs, values = self.infer(step.obs)
        logprobs, values = logprobs.numpy(), values.numpy()
        check_finite("log-probability", logprobs, lane, t, "of the action it drew")
        check_finite("value", values, lane, t, "")
        buffer.record_policy(t, step.obs, actions.numpy(), logprobs, values, self.version)
        return self.env_actions(actions).numpy()

    def trajectory(self) -> Trajectory:
        """This worker's finished lanes joined along the env axis, in lane order."""
        return Trajectory.concatenate(self.finished)

    def random_state(self) -> dict:
        """This worker's process's random state (its action noise), for the checkpoint."""
        return seeds.random_state()

    def load_random_state(self, state: dict) -> None:
        seeds.set_random_state(state)

    def set_version(self, version: int) -> None:
        """The policy version of the weights it acts with from now on (sent after each load, or
        with a shared policy the actor's current version: controller/policy_versions.py)."""
        self.version = version

    def load_weights(self, state_dict: dict) -> None:
        self.policy.load_state_dict(state_dict)

    def load_changed(self, payload: dict) -> None:
        """`runner.weight_sync: changed`: {"full": weights} the first time, then {"patch": the
        changed values} (`fleetrl.parallel.changed_values`), written into this copy."""
        if "full" in payload:
            self.load_weights(payload["full"])
        else:
            apply_changes(self.policy, payload["patch"])

    def load_patch(self, patch: dict) -> None:
        """Some of the policy's tensors (the trainable ones: `runner.weight_sync: trainable`);
        the others keep what the last full sync gave."""
        load_patch(self.policy, patch)

    def receive_weights(self, header: Header) -> None:
        """`runner.weight_sync_transport: collective`: receive actor rank 0's broadcast (collective
        with its `send_weights`) and load it as the Ray path would have (`SYNC_LOADS[header.kind]`)."""
        if self.sync_group is None:
            raise RuntimeError("receive_weights needs the weight-sync group (it was not formed)")
        buffer = self.sync_group.broadcast(None, header.size)
        getattr(self, SYNC_LOADS[header.kind].__name__)(decode(header, buffer))

    def policy_state(self) -> dict:
        """The weights this worker acts with (CPU copies), to compare with what was sent
        (benchmarks/costs/weight_sync.py checks that both transports deliver the same bits)."""
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in self.policy.state_dict().items()}


# How the rollout loads each `runner.weight_sync` kind, whichever transport carries it (what the actor
# gathers for each: actor_base.SYNC_GATHERS). Called by name: a subclass's override runs.
SYNC_LOADS = {
    "full": RolloutWorker.load_weights,
    "trainable": RolloutWorker.load_patch,
    "changed": RolloutWorker.load_changed,
}

"""An off-policy algorithm's replay buffer: one actor rank's shard, preallocated, plain state.

It is a plain Python object holding NumPy arrays (with zero-copy torch views for sampling) — never
an `nn.Module` and never a module buffer, so DDP cannot try to broadcast or synchronise it (the
seeds' first DDP failure). Each actor rank keeps its own shard: the env columns it trains on.

Layout. The shard holds `num_envs` (E) env columns, each a ring of `capacity` (C) transitions
written in lock-step (one iteration appends T steps to every column). Transition (slot s, env e)
lives at flat row s·E + e of `actions`, `rewards`, `not_terminated` and of the first C·E rows of
`obs`. Observations are stored once: a transition's next observation is found through
`next_index`, a row of `obs`:

- normally the next slot's row (the observation the env returned is the next step's input);
- for the newest transition of each env: a *pending* row (rows C·E .. C·E+E-1), the observation the
  next iteration starts from. When the next iteration's first observation is a different one (a
  resume that reset the envs), the pending row is kept as a final observation instead;
- on truncation (a time limit): a *final observation* row (after the pending rows), because the
  next slot holds the reset observation of the next episode. Final observations are few (one per
  episode); they are kept in a ring that grows when needed and whose entries die, oldest first,
  with the transitions they belong to;
- on termination the next observation is irrelevant (the bootstrap is multiplied by
  `not_terminated` = 0); the pointer goes to the next slot like any other.
"""

from __future__ import annotations

import numpy as np
import torch


class ReplayBuffer:
    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: tuple,
        action_shape: tuple,
        final_capacity: int | None = None,
        obs_dtype: np.dtype = np.float32,  # uint8 for images: a replay buffer of pixels is mostly pixels
    ):
        if capacity < 2 or num_envs < 1:
            raise ValueError(f"a replay buffer needs capacity >= 2 per env and >= 1 env, got {capacity} and {num_envs}")
        C, E = capacity, num_envs
        self.capacity, self.num_envs = C, E
        self.obs_shape, self.action_shape = tuple(obs_shape), tuple(action_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        self.pending_base = C * E
        self.final_base = C * E + E
        self.final_capacity = final_capacity or max(E, min(C * E, 1024))
        # np.zeros maps untouched pages lazily: a large, mostly empty buffer costs what it holds.
        self.obs = np.zeros((self.final_base + self.final_capacity, *self.obs_shape), self.obs_dtype)
        self.actions = np.zeros((C * E, *self.action_shape), np.float32)
        self.rewards = np.zeros(C * E, np.float32)
        self.not_terminated = np.zeros(C * E, np.float32)
        self.next_index = np.zeros(C * E, np.int64)
        self.final_owner = np.zeros(self.final_capacity, np.int64)  # transition row of each final obs
        self.final_start = 0  # ring position of the oldest live final observation
        self.final_count = 0
        self.head = 0  # the next slot to write
        self.slots = 0  # slots holding transitions (<= capacity)
        self._views()

    def _views(self) -> None:
        self.t_obs = torch.from_numpy(self.obs)
        self.t_actions = torch.from_numpy(self.actions)
        self.t_rewards = torch.from_numpy(self.rewards)
        self.t_not_terminated = torch.from_numpy(self.not_terminated)
        self.t_next_index = torch.from_numpy(self.next_index)

    def __len__(self) -> int:
        """Transitions held (all env columns)."""
        return self.slots * self.num_envs

    # ------------------------------------------------------------------------------------ writing

    def add(self, obs, actions, rewards, terminated, truncated, next_obs) -> None:
        """Append T steps of every env column: (T, E, ...) arrays or CPU tensors, in step order.
        `next_obs[t]` is the true next observation of step t (the final one on truncation)."""
        obs, actions, rewards, terminated, truncated, next_obs = (
            np.asarray(x) for x in (obs, actions, rewards, terminated, truncated, next_obs)
        )
        n, E, C = len(obs), self.num_envs, self.capacity
        if obs.shape[1] != E:
            raise ValueError(f"expected {E} env columns, got {obs.shape[1]}")
        if n >= C:
            raise ValueError(f"{n} steps per add need a capacity above {n} per env, it is {C}")
        envs = np.arange(E)
        slots = (self.head + np.arange(n)) % C
        rows = slots[:, None] * E + envs  # (T, E)
        # 1. The final observations of the transitions about to be overwritten die; they are the
        #    oldest live ones (entries are created and overwritten in the same order).
        overwritten = min(n, max(0, self.slots + n - C))
        if overwritten:
            dying = int((self.next_index[rows[n - overwritten :]] >= self.final_base).sum())
            self.final_start = (self.final_start + dying) % self.final_capacity
            self.final_count -= dying
        # 2. The previous newest transitions point at the pending rows: at this add's first
        #    observations if they continue from there, else keep the pending ones as final.
        if self.slots:
            previous = ((self.head - 1) % C) * E + envs
            pointing = self.next_index[previous] == self.pending_base + envs
            if pointing.any():
                pending = self.obs[self.pending_base : self.final_base]
                same = (pending == obs[0]).reshape(E, -1).all(axis=1)
                self.next_index[previous[pointing & same]] = rows[0][pointing & same]
                broken = np.flatnonzero(pointing & ~same)
                if len(broken):
                    self._append_final(previous[broken], pending[broken].copy())
        # 3. The transitions, pointing at the next slot, the newest at the pending rows.
        self.obs[rows] = obs
        self.actions[rows] = actions
        self.rewards[rows] = rewards
        self.not_terminated[rows] = ~terminated.astype(bool)
        self.next_index[rows[:-1]] = rows[1:]
        self.next_index[rows[-1]] = self.pending_base + envs
        self.obs[self.pending_base : self.final_base] = next_obs[-1]
        self.head = (self.head + n) % C
        self.slots = min(C, self.slots + n)
        # 4. Truncated steps point at their final observation (t-major order: oldest first).
        steps, columns = np.nonzero(truncated)
        if len(steps):
            self._append_final(rows[steps, columns], next_obs[steps, columns])

    def _append_final(self, owners: np.ndarray, values: np.ndarray) -> None:
        count = len(owners)
        if self.final_count + count > self.final_capacity:
            self._grow_final(self.final_count + count)
        positions = (self.final_start + self.final_count + np.arange(count)) % self.final_capacity
        self.obs[self.final_base + positions] = values
        self.final_owner[positions] = owners
        self.next_index[owners] = self.final_base + positions
        self.final_count += count

    def _grow_final(self, needed: int) -> None:
        """Reallocate with room for at least `needed` final observations, the live ones first."""
        capacity = max(2 * self.final_capacity, needed)
        live = (self.final_start + np.arange(self.final_count)) % self.final_capacity
        obs = np.zeros((self.final_base + capacity, *self.obs_shape), self.obs_dtype)
        used = self.slots * self.num_envs
        obs[:used] = self.obs[:used]
        obs[self.pending_base : self.final_base] = self.obs[self.pending_base : self.final_base]
        obs[self.final_base : self.final_base + len(live)] = self.obs[self.final_base + live]
        owner = np.zeros(capacity, np.int64)
        owner[: len(live)] = self.final_owner[live]
        self.next_index[owner[: len(live)]] = self.final_base + np.arange(len(live))
        self.obs, self.final_owner, self.final_capacity, self.final_start = obs, owner, capacity, 0
        self._views()

    # ----------------------------------------------------------------------------------- sampling

    def gather(self, index: torch.Tensor):
        """(obs, actions, rewards, not_terminated, next_obs) of the transitions at `index` (any
        shape): plain tensors, copies."""
        return (
            self.t_obs[index],
            self.t_actions[index],
            self.t_rewards[index],
            self.t_not_terminated[index],
            self.t_obs[self.t_next_index[index]],
        )

    # ------------------------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict:
        """The filled part only, with the final observations in age order."""
        used = self.slots * self.num_envs
        live = (self.final_start + np.arange(self.final_count)) % self.final_capacity
        next_index = self.next_index[:used].copy()
        final = next_index >= self.final_base
        next_index[final] = (
            self.final_base + (next_index[final] - self.final_base - self.final_start) % self.final_capacity
        )
        tensor = lambda array: torch.from_numpy(np.ascontiguousarray(array))  # noqa: E731
        return {
            "capacity": self.capacity,
            "num_envs": self.num_envs,
            "head": self.head,
            "slots": self.slots,
            "obs": tensor(self.obs[:used].copy()),
            "pending_obs": tensor(self.obs[self.pending_base : self.final_base].copy()),
            "final_obs": tensor(self.obs[self.final_base + live]),
            "final_owner": tensor(self.final_owner[live]),
            "actions": tensor(self.actions[:used].copy()),
            "rewards": tensor(self.rewards[:used].copy()),
            "not_terminated": tensor(self.not_terminated[:used].copy()),
            "next_index": tensor(next_index),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state saved by a buffer of the same capacity, env count and shapes."""
        saved = (state["capacity"], state["num_envs"], tuple(state["obs"].shape[1:]), tuple(state["actions"].shape[1:]))
        mine = (self.capacity, self.num_envs, self.obs_shape, self.action_shape)
        if saved != mine:
            raise ValueError(
                f"the saved replay buffer has (capacity per env, envs, obs shape, action "
                f"shape) {saved}, this one {mine}"
            )
        count = len(state["final_owner"])
        if count > self.final_capacity:
            self._grow_final(count)
        used = state["slots"] * self.num_envs
        self.obs[:used] = state["obs"].numpy()
        self.obs[self.pending_base : self.final_base] = state["pending_obs"].numpy()
        self.obs[self.final_base : self.final_base + count] = state["final_obs"].numpy()
        self.final_owner[:count] = state["final_owner"].numpy()
        self.final_start, self.final_count = 0, count
        self.actions[:used] = state["actions"].numpy()
        self.rewards[:used] = state["rewards"].numpy()
        self.not_terminated[:used] = state["not_terminated"].numpy()
        self.next_index[:used] = state["next_index"].numpy()
        self.head, self.slots = state["head"], state["slots"]

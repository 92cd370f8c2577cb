"""What a simulator promised at construction, held to: its observations keep the shape and a
dtype of the observation space it declared, its action space stays the one the policy was built
for, and — where its answers cross a process boundary (`env.vectorization: async`) — its `info`
can be pickled.

A simulator that broke one of these mid-run used to surface as a traceback from deep inside
Gymnasium's batcher (`could not broadcast input array from shape (5,) into shape (4,)`), or, in an
async env's subprocess, as a pickling error from its pipe — neither naming the env, the key or what
was expected. Now it raises `BadSimulatorData` naming the env's index within its worker, the key,
what was expected and what came (the incident's summary puts the env worker's rank in front).

A dtype is wrong when the batcher would have to cast it unsafely (numpy's `same_kind` rule):
float64 values in a float32 space are fine (most simulators return them), floats in an integer
space, or strings, are not.

Where it is checked, so that a healthy step pays next to nothing:

- async: `SimulatorContract` wraps each simulator in its own subprocess and checks every answer
  (the subprocess pays, beside its pickling; the env worker's thread does not);
- sync (the simulators run in the env worker's process, where a wrapper's ~1.4 µs a simulator step
  would be most of the checks' budget): `SyncContract` checks each simulator's answer at every
  reset and at every episode's end (its final observation, the next episode's first one, its
  action space), and, when Gymnasium's batcher fails on a step, finds the simulator that broke it.
  A dtype the batcher casts without failing, or an action space that changes mid-episode, is
  found at that episode's end.

benchmarks/costs/non_finite_checks.py measures both beside the non-finite checks.
"""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np

Broken = tuple[str, str, str]  # (key, expected, received)


class BadSimulatorData(RuntimeError):
    """A simulator's step or reset broke what it declared. One argument, the message, so that an
    async vector env's subprocess error comes back whole (Gymnasium re-raises `type(error)(error)`)."""

    def __init__(self, message):
        super().__init__(str(message))


def bad_data(index: int, call: str, broken: Broken) -> BadSimulatorData:
    key, expected, received = broken
    return BadSimulatorData(
        f"env {index} of this worker answered {call} with bad data: {key}: expected {expected}, received {received}"
    )


class Spaces:
    """The spaces a simulator declared, and what breaks them."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.action_space = action_space
        if isinstance(observation_space, gym.spaces.Dict):
            self.leaves = {key: (leaf.shape, np.dtype(leaf.dtype)) for key, leaf in observation_space.spaces.items()}
        else:
            self.leaves = (observation_space.shape, np.dtype(observation_space.dtype))

    def broken(self, obs, action_space: gym.Space) -> Broken | None:
        """What of (an observation, the simulator's action space now) breaks the declaration."""
        if action_space is not self.action_space and action_space != self.action_space:
            return "action_space", str(self.action_space), str(action_space)
        if not isinstance(self.leaves, dict):
            if type(obs) is np.ndarray and (obs.shape, obs.dtype) == self.leaves:
                return None  # the answer nearly every simulator gives: nothing to look into
            return broken_leaf(obs, *self.leaves, "observation")
        if not isinstance(obs, dict) or obs.keys() != self.leaves.keys():
            received = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            return "observation keys", str(sorted(self.leaves)), str(received)
        for key, (shape, dtype) in self.leaves.items():
            found = broken_leaf(obs[key], shape, dtype, f"observation[{key!r}]")
            if found is not None:
                return found
        return None


def broken_leaf(value, shape: tuple, dtype: np.dtype, key: str) -> Broken | None:
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.shape != shape:
        return key, f"shape {shape}", f"shape {array.shape}"
    if array.dtype != dtype and not np.can_cast(array.dtype, dtype, "same_kind"):
        return key, f"dtype {dtype} (or one that casts to it)", f"dtype {array.dtype}"
    return None


class SimulatorContract(gym.Wrapper):
    """Every answer of env `index` (of its worker's envs) held to the spaces it had when built, in
    the async vector env's subprocess that runs it; its info must pickle (it crosses the pipe)."""

    def __init__(self, env: gym.Env, index: int):
        super().__init__(env)
        self.index, self.declared = index, Spaces(env.observation_space, env.action_space)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.check(obs, info, "step")
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.check(obs, info, "reset")
        return obs, info

    def check(self, obs, info: dict, call: str) -> None:
        found = self.declared.broken(obs, self.env.action_space)
        if found is None and (why := pickling_error(info)) is not None:
            found = f"info[{unpicklable_key(info)!r}]", "a value that pickles", why
        if found is not None:
            raise bad_data(self.index, call, found)


class SyncContract:
    """The declaration of a sync vector env's simulators, envs `first`… of their worker, checked at
    resets, episode ends and failed steps (module docstring). Reads each simulator's last
    observation where `SyncVectorEnv` keeps it (`_env_obs`: gymnasium is pinned)."""

    def __init__(self, vector: gym.vector.SyncVectorEnv, first: int):
        self.first = first
        self.declared = Spaces(vector.single_observation_space, vector.single_action_space)

    def check(self, vector: gym.vector.SyncVectorEnv, envs, call: str, final_obs=None) -> None:
        """The answers of `envs` (indices in the vector) and, for those that ended an episode,
        `final_obs` (the vector's info['final_obs'])."""
        for i in envs:
            action_space = vector.envs[i].action_space  # read through the simulator's wrappers: once
            found = self.declared.broken(vector._env_obs[i], action_space)
            if found is None and final_obs is not None:
                found = self.declared.broken(final_obs[i], action_space)
            if found is not None:
                raise bad_data(self.first + int(i), call, found)

    def diagnose(self, vector: gym.vector.SyncVectorEnv, error: Exception, call: str) -> None:
        """After the vector env raised `error` in `call`: `BadSimulatorData` naming the simulator
        whose answer broke the batch, if one did; otherwise `error` is the simulator's own."""
        try:
            self.check(vector, range(len(vector.envs)), call)
        except BadSimulatorData as bad:
            raise bad from error


def pickling_error(value) -> str | None:
    """Why `value` does not pickle, or None when it does."""
    try:
        pickle.dumps(value)
    except Exception as error:  # whatever pickling raises: TypeError, PicklingError, AttributeError
        return f"{type(error).__name__}: {error}"
    return None


def unpicklable_key(info: dict) -> str:
    """The first key of `info` whose value does not pickle (the whole info where none alone fails)."""
    return next((str(key) for key, value in info.items() if pickling_error(value) is not None), "<info>")

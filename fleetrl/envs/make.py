"""Build vectorised simulators from `env.id`: a Gymnasium id or a `module:attr` entry point.

Vector envs always use Gymnasium's SAME_STEP auto-reset: when a sub-env ends an episode, `step`
returns the first observation of the next episode and puts the last one in `info['final_obs']`.
That is what bootstrapping truncated episodes needs, and it wastes no step on resets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from fleetrl.config.schema import EnvConfig
from fleetrl.entry_points import check_keyword_arguments, resolve_entry_point
from fleetrl.errors import ConfigError, nearest


def env_factory(config: EnvConfig) -> Callable[[], gym.Env]:
    """A zero-argument function that builds one simulator (checked now, built later)."""
    if config.action_chunk > 1:
        inner = env_factory(replace(config, action_chunk=1))
        return lambda: ActionChunk(inner(), config.action_chunk)
    if ":" in config.id:
        entry = resolve_entry_point("env.id", config.id)
        check_keyword_arguments("env.kwargs", entry, config.kwargs)

        def make_custom() -> gym.Env:
            env = entry(**config.kwargs)
            if isinstance(env, gym.vector.VectorEnv) or not isinstance(env, gym.Env):
                raise ConfigError(
                    "env.id", config.id, "an entry point returning one gymnasium.Env (fleetrl vectorises it)"
                )
            if config.max_episode_steps is not None:
                env = gym.wrappers.TimeLimit(env, config.max_episode_steps)
            return env

        return make_custom
    if config.id not in gym.envs.registry:
        raise ConfigError(
            "env.id",
            config.id,
            "a registered Gymnasium id or 'module:attr'",
            nearest(config.id, gym.envs.registry.keys()),
        )
    spec = gym.spec(config.id)
    if isinstance(spec.entry_point, str):
        check_keyword_arguments(
            "env.kwargs",
            gym.envs.registration.load_env_creator(spec.entry_point),
            config.kwargs,
            allowed=("render_mode",),
        )
    extra = {} if config.max_episode_steps is None else {"max_episode_steps": config.max_episode_steps}
    return lambda: gym.make(config.id, disable_env_checker=True, **extra, **config.kwargs)


class ActionChunk(gym.Wrapper):
    """`env.action_chunk` = C: one step takes C consecutive actions of a 1-D Box env (a Box of
    C·d values, action 0 first) and executes them in order, stopping early when the episode
    ends; the reward is their sum, the observation the last one. The time limit
    (`env.max_episode_steps`) still counts the simulator's own steps; fleetrl's env-step and
    episode-length counters count chunks."""

    def __init__(self, env: gym.Env, chunk: int):
        super().__init__(env)
        space = env.action_space
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
            raise ConfigError(
                "env.action_chunk", chunk, "1 unless the action space is a 1-D Box", f"the action space is {space}"
            )
        self.chunk, self.dim = chunk, space.shape[0]
        self.action_space = gym.spaces.Box(np.tile(space.low, chunk), np.tile(space.high, chunk), dtype=space.dtype)

    def step(self, action):
        total = 0.0
        for single in np.asarray(action).reshape(self.chunk, self.dim):
            obs, reward, terminated, truncated, info = self.env.step(single)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def make_vector_env(config: EnvConfig, num_envs: int | None = None) -> gym.vector.VectorEnv:
    factory = env_factory(config)
    count = config.num_envs if num_envs is None else num_envs
    if config.vectorization == "sync":
        return SyncVectorEnv([factory] * count, autoreset_mode=AutoresetMode.SAME_STEP)
    # Spawned, never forked: a fork after torch has started its threads can deadlock the child.
    return AsyncVectorEnv([factory] * count, autoreset_mode=AutoresetMode.SAME_STEP, context="spawn")

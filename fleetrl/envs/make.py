"""Build vectorised simulators from `env.id`: a Gymnasium id or a `module:attr` entry point.

Vector envs always use Gymnasium's SAME_STEP auto-reset: when a sub-env ends an episode, `step`
returns the first observation of the next episode and puts the last one in `info['final_obs']`.
That is what bootstrapping truncated episodes needs, and it wastes no step on resets.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import replace

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from fleetrl.config.schema import EnvConfig
from fleetrl.entry_points import check_keyword_arguments, resolve_entry_point
from fleetrl.envs.atari import atari_wrappers
from fleetrl.envs.text import ArrayObservations, needs_conversion
from fleetrl.errors import ConfigError, nearest


def env_factory(config: EnvConfig) -> Callable[[], gym.Env]:
    """A zero-argument function that builds one simulator (checked now, built later), its
    observations made arrays (`ArrayObservations`) when they are not a Box already."""
    simulator = simulator_factory(config)

    def make() -> gym.Env:
        env = simulator()
        if config.wrappers == "atari":
            env = atari_wrappers(env, config.id)
        return ArrayObservations(env, config.id) if needs_conversion(env.observation_space) else env

    return make


def simulator_factory(config: EnvConfig) -> Callable[[], gym.Env]:
    if config.action_chunk > 1:
        inner = simulator_factory(replace(config, action_chunk=1))
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
    register_env_package(config.id)
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

    def make_registered() -> gym.Env:
        register_env_package(config.id)  # again: an async vector env builds it in a fresh process
        return gym.make(config.id, disable_env_checker=True, **extra, **config.kwargs)

    return make_registered


# Packages that register their Gymnasium ids when imported (none of them does it through an
# entry point), by id pattern: importing one is what `gym.make("MiniGrid-...")` needs first.
# Pattern → (package, fleetrl's extra that installs it).
ENV_PACKAGES = {
    r"(MiniGrid|BabyAI)-": ("minigrid", "minigrid"),
    r"ALE/|\w+NoFrameskip-v4$": ("ale_py", "atari"),  # ale-py's ALE/Pong-v5 and PongNoFrameskip-v4
    r"fleetrl/": ("fleetrl.envs.burn", "test"),  # fleetrl's own stand-ins: always installed
}


def register_env_package(env_id: str) -> None:
    """Import the package that registers `env_id`, when it is one of `ENV_PACKAGES`' and installed."""
    for pattern, (package, extra) in ENV_PACKAGES.items():
        if re.match(pattern, env_id) and env_id not in gym.envs.registry:
            try:
                importlib.import_module(package)
            except ImportError as error:
                raise ConfigError(
                    "env.id", env_id, f"an installed env package: pip install 'fleetrl[{extra}]'", str(error)
                ) from None


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

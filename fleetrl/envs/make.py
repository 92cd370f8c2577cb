"""Build vectorised simulators from `env.id`: a Gymnasium id or a `module:attr` entry point.

Vector envs always use Gymnasium's SAME_STEP auto-reset: when a sub-env ends an episode, `step`
returns the first observation of the next episode and puts the last one in `info['final_obs']`.
That is what bootstrapping truncated episodes needs, and it wastes no step on resets.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from fleetrl.config.schema import EnvConfig
from fleetrl.entry_points import check_keyword_arguments, resolve_entry_point
from fleetrl.envs.atari import atari_wrappers
from fleetrl.envs.contract import SimulatorContract
from fleetrl.envs.text import ArrayObservations, needs_conversion
from fleetrl.errors import ConfigError, nearest


def env_factory(config: EnvConfig, chunk: int = 1, gamma: float = 1.0) -> Callable[..., gym.Env]:
    """A function that builds one simulator (checked now, built later), its observations made
    arrays (`ArrayObservations`) when they are not a Box already; with `chunk` > 1 each step
    executes an action chunk (`ActionChunk`, discounting within it by `gamma`). Called with
    `contract_index`, each answer is checked against the spaces it declared (`SimulatorContract`,
    for a simulator in a subprocess of its own), as env `contract_index` of its worker."""
    simulator = simulator_factory(config)

    def make(contract_index: int | None = None) -> gym.Env:
        env = simulator()
        if config.wrappers == "atari":
            env = atari_wrappers(env, config.id)
        env = ArrayObservations(env, config.id) if needs_conversion(env.observation_space) else env
        env = SimulatorContract(env, contract_index) if contract_index is not None else env
        return ActionChunk(env, chunk, gamma) if chunk > 1 else env

    return make


def simulator_factory(config: EnvConfig) -> Callable[[], gym.Env]:
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
    """`model.action_chunk` = K: one step takes K consecutive actions (a Box of shape (K, d), or
    a MultiDiscrete of K values for a Discrete env) and executes them in order, stopping at the
    episode's end: the rest of the chunk is dropped and the vector env auto-resets as after any
    step. The reward is Σ_j γ^j r_j over the k executed steps (what the learner bootstraps from
    with γ^k); `info` carries `chunk_steps` = k and `chunk_return` = Σ_j r_j (undiscounted: the
    episode's return). The time limit (`env.max_episode_steps`) counts the simulator's steps."""

    def __init__(self, env: gym.Env, chunk: int, gamma: float):
        super().__init__(env)
        space = env.action_space
        self.chunk, self.gamma = chunk, gamma
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            low, high = (np.broadcast_to(bound, (chunk, *space.shape)) for bound in (space.low, space.high))
            self.action_space = gym.spaces.Box(low, high, dtype=space.dtype)
        elif isinstance(space, gym.spaces.Discrete):
            self.action_space = gym.spaces.MultiDiscrete([space.n] * chunk, start=[space.start] * chunk)
        else:
            raise ConfigError(
                "model.action_chunk", chunk, "1 unless the action space is Discrete or a 1-D Box", f"it is {space}"
            )

    def step(self, action):
        discounted, total, weight, executed = 0.0, 0.0, 1.0, 0
        for single in action:
            obs, reward, terminated, truncated, info = self.env.step(single)
            discounted += weight * float(reward)
            total += float(reward)
            weight *= self.gamma
            executed += 1
            if terminated or truncated:
                break
        return obs, discounted, terminated, truncated, {**info, "chunk_steps": executed, "chunk_return": total}


def step_action_space(space: gym.Space, chunk: int) -> gym.Space:
    """The action space of one env step, from a vector env's single (chunk) action space."""
    if chunk == 1:
        return space
    if isinstance(space, gym.spaces.MultiDiscrete):
        return gym.spaces.Discrete(int(space.nvec[0]), start=int(space.start[0]))
    return gym.spaces.Box(space.low[0], space.high[0], dtype=space.dtype)


def make_vector_env(
    config: EnvConfig, num_envs: int | None = None, chunk: int = 1, gamma: float = 1.0, first: int = 0
) -> gym.vector.VectorEnv:
    """`num_envs` simulators (default env.num_envs) as one vector env; with `env.vectorization:
    async` each is held to the spaces it declared in its subprocess (`SimulatorContract`), as env
    `first + i` of its worker (a sync one's are checked by the env worker: `SyncContract`)."""
    count = config.num_envs if num_envs is None else num_envs
    factory = env_factory(config, chunk, gamma)
    if config.vectorization == "sync":
        return SyncVectorEnv([factory] * count, autoreset_mode=AutoresetMode.SAME_STEP)
    factories = [functools.partial(factory, first + i) for i in range(count)]
    # Spawned, never forked: a fork after torch has started its threads can deadlock the child.
    return AsyncVectorEnv(factories, autoreset_mode=AutoresetMode.SAME_STEP, context="spawn")

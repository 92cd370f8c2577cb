"""Run CleanRL's `ppo_atari.py` (cleanrl 1.2.0, installed by `setup_venvs.sh atari`) as it is,
on the emulator fleetrl uses: ale-py 0.12's Atari games behind gym 0.23's API.

cleanrl 1.2.0's script makes its envs with `gym.make(env_id)` (gym 0.23.1: `reset()` returns the
observation, `step()` four values, `seed()`), which ale-py 0.7.4 registered through gym's plugin
hook. ale-py 0.7.4 has no Python 3.11 wheel and its ROMs were fetched at install time, so this
launcher registers the id with gym instead, as `GymAtari`: the ale-py 0.12 game of the same
Gymnasium id (same ROM, frame skip, sticky-action probability and frame limit), seen through the old
API. Everything above it — SB3's Atari wrappers, gym's resize/grayscale/frame stack, the agent,
the PPO loop — is CleanRL's own, unmodified.

    benchmarks/.venvs/cleanrl/bin/python benchmarks/compare/jobs/cleanrl_atari.py PATH/TO/ppo_atari.py [its flags]

Not part of fleetrl.
"""

from __future__ import annotations

import argparse
import runpy
import sys

import ale_py
import gym
import gymnasium


class GymAtari(gym.Env):
    """One ale-py 0.12 game (a Gymnasium env) with gym 0.23's `reset`/`step`/`seed`."""

    metadata = {"render_modes": []}

    def __init__(self, gymnasium_id: str):
        self.game = gymnasium.make(gymnasium_id, disable_env_checker=True).unwrapped
        self.ale = self.game.ale  # SB3's EpisodicLifeEnv reads the lives here
        self.observation_space = gym.spaces.Box(
            0, 255, self.game.observation_space.shape, self.game.observation_space.dtype
        )
        self.action_space = gym.spaces.Discrete(int(self.game.action_space.n))
        self.next_seed: int | None = None

    def get_action_meanings(self) -> list[str]:
        return self.game.get_action_meanings()

    def seed(self, seed: int | None = None) -> list[int | None]:
        super().reset(seed=seed)  # gym's own np_random (SB3's NoopResetEnv draws from it)
        self.next_seed = seed  # the emulator's: applied at the next reset
        return [seed]

    def reset(self, *, seed: int | None = None, return_info: bool = False, options: dict | None = None):
        seed = seed if seed is not None else self.next_seed
        self.next_seed = None
        obs, info = self.game.reset(seed=seed)
        return (obs, info) if return_info else obs

    def step(self, action):
        obs, reward, terminated, truncated, info = self.game.step(int(action))
        return obs, reward, terminated or truncated, info


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("script")
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")  # ppo_atari.py's default
    known, _ = parser.parse_known_args()
    gymnasium.register_envs(ale_py)
    gym.envs.registration.register(id=known.env_id, entry_point=GymAtari, kwargs={"gymnasium_id": known.env_id})
    sys.argv = [known.script, *sys.argv[2:]]
    runpy.run_path(known.script, run_name="__main__")


if __name__ == "__main__":
    main()

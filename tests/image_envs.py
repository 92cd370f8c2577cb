"""A deterministic simulator with image and Dict observations for the tests
(`tests.image_envs:CountingImages`), and a real Breakout whose raw rewards the tests can read
(`tests.image_envs:RecordedBreakout`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from tests.envs import CountingEnv

MISSIONS = ("go left", "go right")  # sub-env i's instruction: MISSIONS[i % 2]


class CountingImages(CountingEnv):
    """CountingEnv's episodes (they last `length` steps and terminate; the k-th step's reward is k),
    shown in pixels and words. Sub-env i (the seed of its first reset):

    - the image (uint8, `size`×`size`×3, or 3×`size`×`size` when not `channels_last`) holds
      [i, episode, t] in its three channels, every pixel alike (`image`);
    - with `dict_obs` the observation is a Dict: that image, `mission` (a Text, MISSIONS[i % 2])
      and `direction` (a Discrete(4), t % 4);
    - actions are Discrete(2), or a Box of 2 in [-1, 1] when `continuous`; they are ignored.
    """

    def __init__(
        self,
        length: int = 3,
        size: int = 7,
        channels_last: bool = True,
        dict_obs: bool = False,
        continuous: bool = False,
    ):
        self.size, self.channels_last, self.dict_obs = size, channels_last, dict_obs
        shape = (size, size, 3) if channels_last else (3, size, size)
        image = gym.spaces.Box(0, 255, shape, np.uint8)
        if dict_obs:
            mission = gym.spaces.Text(12, charset="abcdefghijklmnopqrstuvwxyz ")
            observation_space = gym.spaces.Dict(image=image, mission=mission, direction=gym.spaces.Discrete(4))
        else:
            observation_space = image
        action_space = gym.spaces.Box(-1, 1, (2,), np.float32) if continuous else gym.spaces.Discrete(2)
        super().__init__(lengths=(length,), terminal=(True,))
        self.observation_space, self.action_space = observation_space, action_space

    def _obs(self):
        image = expected_image(self.index, self.episode, self.t, self.size, self.channels_last)
        if not self.dict_obs:
            return image
        return {"image": image, "mission": MISSIONS[self.index % 2], "direction": self.t % 4}


def expected_image(index: int, episode: int, t: int, size: int = 7, channels_last: bool = True) -> np.ndarray:
    """The image CountingImages shows sub-env `index` at step `t` of episode `episode`."""
    pixel = np.array([index, episode, t], np.uint8)
    image = np.broadcast_to(pixel, (size, size, 3))
    return np.ascontiguousarray(image if channels_last else image.transpose(2, 0, 1))


class RecordedBreakout(gym.Wrapper):
    """ale-py's BreakoutNoFrameskip-v4 as it is, keeping every reward it returns, one list per
    game (`games`, a new one at each reset): what a whole game scored, seen below every wrapper."""

    def __init__(self):
        import ale_py

        gym.register_envs(ale_py)
        super().__init__(gym.make("BreakoutNoFrameskip-v4"))
        self.games: list[list[float]] = []

    def reset(self, **kwargs):
        self.games.append([])
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.games[-1].append(float(reward))
        return obs, reward, terminated, truncated, info

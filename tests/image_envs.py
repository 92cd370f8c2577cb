"""A deterministic simulator with image and Dict observations for the tests
(`tests.image_envs:CountingImages`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

MISSIONS = ("go left", "go right")  # sub-env i's instruction: MISSIONS[i % 2]


class CountingImages(gym.Env):
    """CountingEnv's bookkeeping in pixels and words. Sub-env i (the seed of its first reset):

    - episodes last `length` steps and terminate; the k-th step's reward is k;
    - the image (uint8, `size`×`size`×3, or 3×`size`×`size` when not `channels_last`) holds
      [i, episode, t] in its three channels, every pixel alike (`image`);
    - with `dict_obs` the observation is a Dict: that image, `mission` (a Text, MISSIONS[i % 2])
      and `direction` (a Discrete(4), t % 4);
    - actions are Discrete(2), or a Box of 2 in [-1, 1] when `continuous`; they are ignored.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        length: int = 3,
        size: int = 7,
        channels_last: bool = True,
        dict_obs: bool = False,
        continuous: bool = False,
    ):
        self.length, self.size, self.channels_last, self.dict_obs = length, size, channels_last, dict_obs
        shape = (size, size, 3) if channels_last else (3, size, size)
        image = gym.spaces.Box(0, 255, shape, np.uint8)
        if dict_obs:
            mission = gym.spaces.Text(12, charset="abcdefghijklmnopqrstuvwxyz ")
            self.observation_space = gym.spaces.Dict(image=image, mission=mission, direction=gym.spaces.Discrete(4))
        else:
            self.observation_space = image
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32) if continuous else gym.spaces.Discrete(2)
        self.index, self.episode, self.t = 0, -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.index, self.episode = seed, -1
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(self.t), self.t >= self.length, False, {}

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

"""`env.wrappers: atari`: the standard Atari preprocessing, as CleanRL's Atari agents apply it.

From the inside out, on an ALE simulator that skips no frames itself (`BreakoutNoFrameskip-v4`,
or an `ALE/...-v5` id with `env.kwargs: {frameskip: 1}`):

1. Gymnasium's `AtariPreprocessing`: up to 30 no-op actions after each reset, each action
   repeated 4 frames with the last two max-pooled, the frame resized to 84×84 grayscale (uint8);
2. `EpisodicLife`: losing a life ends the episode for the learner (no bootstrap past it), but
   the game goes on: the next "reset" only steps a no-op unless the game is really over;
3. `FireReset`: games that wait for FIRE (Breakout) get FIRE, then action 2, after each reset;
4. rewards clipped to their sign (−1, 0, 1);
5. Gymnasium's `FrameStackObservation`: the last 4 frames, (4, 84, 84) uint8, channels first.

The same order as CleanRL's wrappers (NoopReset, MaxAndSkip, EpisodicLife, FireReset, ClipReward,
Resize, GrayScale, FrameStack); the one difference is inside the first step: Gymnasium
max-pools grayscale frames and then resizes, CleanRL max-pools RGB frames, resizes, then turns
them gray — a pixel's value may differ by rounding, not what the frame shows.

An episode in fleetrl's counters (`episode_return_*`, `episode_length_*`) is therefore one life,
its return the clipped one: what the agent optimises. The game's score, what CleanRL and SB3
report (their RecordEpisodeStatistics/Monitor sits inside EpisodicLife and the clipping), is
counted by `GameScore` right around step 1: every raw reward of a whole game, the preset's own
no-op and FIRE steps included; the step that ends the game carries it in `info["game_return"]`,
which the env worker reports and the trainer logs as `game_return_mean` (and `games`).
A game whose last life is lost inside the preset's reset steps (the no-op after a lost life, or
FIRE) is not reported: its info is not the one handed on (in Breakout neither step can lose a
life: the ball is not in play).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TransformReward

from fleetrl.errors import ConfigError

NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
FRAME_STACK = 4


def atari_wrappers(env: gym.Env, env_id: str) -> gym.Env:
    """`env` (one ALE simulator) wrapped as the module docstring says."""
    if not hasattr(env.unwrapped, "ale"):
        raise ConfigError(
            "env.wrappers",
            "atari",
            "an ALE env.id (ale-py: BreakoutNoFrameskip-v4, ALE/Pong-v5, ...)",
            f"env.id {env_id!r} is no Atari game",
        )
    frameskip = getattr(env.unwrapped, "_frameskip", 1)
    if frameskip != 1:
        raise ConfigError(
            "env.wrappers",
            "atari",
            f"an env that skips no frames itself: a *NoFrameskip-v4 id, or env.kwargs {{frameskip: 1}} for {env_id!r}",
            f"its frameskip is {frameskip}; the preset skips {FRAME_SKIP} and max-pools",
        )
    try:
        env = AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE)
    except gym.error.DependencyNotInstalled as missing:  # its resize needs OpenCV
        raise ConfigError(
            "env.wrappers", "atari", "installed Atari dependencies: pip install 'fleetrl[atari]'", str(missing)
        ) from None
    env = EpisodicLife(GameScore(env))
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    env = TransformReward(env, np.sign)
    return FrameStackObservation(env, FRAME_STACK)


class GameScore(gym.Wrapper):
    """Sums the raw rewards of a whole game (until the simulator itself ends it); the step that
    ends it reports the sum in `info["game_return"]`."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.score = 0.0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        if terminated or truncated:
            info = {**info, "game_return": self.score}
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        self.score = 0.0
        return self.env.reset(**kwargs)


class EpisodicLife(gym.Wrapper):
    """A lost life terminates the episode; the game is reset only when it is over, or when the
    reset is seeded: a seeded reset asks for a new, reproducible start (an evaluation's, a
    resumed run's), never for the rest of a game some earlier play left behind."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
        else:  # a life was lost: go on from where it was lost
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game after all
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE (then action 2) after each reset, for games that wait for it to start."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                self.env.reset(**kwargs)
        return obs, info

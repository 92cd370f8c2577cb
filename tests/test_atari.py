"""Atari (issue 13): `env.wrappers: atari` builds CleanRL's preprocessing around a real ALE game
(4 stacked 84×84 uint8 frames, sign-clipped rewards, FIRE on reset, a lost life ends the episode
while the game goes on), the model of configs/ppo_atari.yaml is CleanRL's Atari agent, the
config trains, and a preset fleetrl does not know, or one that does not fit the env, is a
config error naming the key."""

from __future__ import annotations

import numpy as np
import pytest

from fleetrl.cli import main
from fleetrl.config.loader import load_config
from fleetrl.config.schema import EnvConfig
from fleetrl.envs.make import make_vector_env
from fleetrl.models.policy import Policy
from fleetrl.workers.env_worker import EnvWorker
from tests.support import REPO, train

pytest.importorskip("ale_py")

CONFIG = REPO / "configs" / "ppo_atari.yaml"
BREAKOUT = EnvConfig(id="BreakoutNoFrameskip-v4", wrappers="atari", num_envs=1)
BREAKOUT_LIVES = 5
# CleanRL ppo_atari.py's Agent on Breakout (4 actions): three convolutions, 3136 → 512, the two heads.
CLEANRL_AGENT_PARAMETERS = (
    (4 * 32 * 64 + 32) + (32 * 64 * 16 + 64) + (64 * 64 * 9 + 64) + (3136 * 512 + 512) + 4 * 513 + 513
)


def test_the_atari_preset_stacks_84x84_frames_fires_and_ends_an_episode_per_life_not_per_game():
    vector = make_vector_env(BREAKOUT)
    game = vector.envs[0].unwrapped
    try:
        assert vector.single_observation_space.shape == (4, 84, 84)
        obs, _ = vector.reset(seed=0)
        assert obs.dtype == np.uint8 and obs.shape == (1, 4, 84, 84)
        assert all(np.array_equal(obs[0, k], obs[0, 0]) for k in range(4)), "a reset fills the stack with its frame"
        # Only NOOPs from here: Breakout launches no ball until FIRE, so a life is lost only because
        # the preset pressed FIRE at the start and again after the first lost life.
        rewards, episode_ends, steps = [], [], 0
        while len(episode_ends) < 2:
            obs, reward, terminated, truncated, _ = vector.step(np.zeros(1, np.int64))
            rewards.append(float(reward[0]))
            steps += 1
            assert not truncated[0] and steps < 2000, f"no life lost in {steps} steps: no FIRE?"
            if terminated[0]:
                episode_ends.append(game.ale.lives())
        # each episode ended with one life, and the game went on: no new game (5 lives) in between
        assert episode_ends == [BREAKOUT_LIVES - 1, BREAKOUT_LIVES - 2] and not game.ale.game_over()
        assert set(rewards) <= {0.0, 1.0} and obs.dtype == np.uint8  # Breakout's 1, 4 and 7 are clipped to 1
    finally:
        vector.close()


def test_the_atari_config_s_model_is_cleanrl_s_agent():
    config = load_config(CONFIG, [])
    env = EnvWorker(config.env, 0.99, seed=0, num_envs=1)
    try:
        policy = Policy.from_config(config.model, *env.spaces())
    finally:
        env.close()
    network = policy.network
    assert sum(p.numel() for p in policy.parameters()) == CLEANRL_AGENT_PARAMETERS
    assert len(network.trunk) == 0 and network.policy_head.in_features == 512  # heads on the CNN's features
    for conv in (m for m in network.encoder.modules() if m.__class__.__name__ == "Conv2d"):
        rows = conv.weight.flatten(1)  # orthogonal, gain √2: rows·rowsᵀ = 2·I (fewer rows than columns)
        assert np.allclose((rows @ rows.T).detach().numpy(), 2 * np.eye(len(rows)), atol=1e-4)


def test_the_atari_config_trains(tmp_path):
    small = ["env.num_envs=2", "algorithm.num_steps=16", "algorithm.minibatch_size=16", "runner.tensorboard=false"]
    result = train(CONFIG, *small, "runner.total_env_steps=64", runs=tmp_path / "runs").succeeded()
    assert [r["global_step"] for r in result.metrics] == [32, 64]
    assert all(np.isfinite(r["policy_loss"]) and np.isfinite(r["value_loss"]) for r in result.metrics)
    assert all(r["grad_steps"] == 4 * 2 for r in result.metrics)  # 4 epochs of 32 / 16 minibatches


@pytest.mark.parametrize(
    "override, expected",
    [
        ("env.wrappers=atri", "got 'atri'; expected one of ['none', 'atari']. did you mean 'atari'?"),
        ("env.id=CartPole-v1", "got 'atari'; expected an ALE env.id"),
    ],
    ids=["unknown-preset", "not-an-atari-game"],
)
def test_a_preset_fleetrl_does_not_know_or_that_does_not_fit_the_env_is_a_config_error(
    override, expected, tmp_path, capfd
):
    code = main(["train", str(CONFIG), override, f"runner.run_dir={tmp_path}", "--skip-doctor"])
    message = capfd.readouterr().err
    assert code == 2, message[-3000:]
    assert f"config error at 'env.wrappers': {expected}" in message
    assert "Traceback" not in message

"""Atari (issue 13): `env.wrappers: atari` builds CleanRL's preprocessing around a real ALE game
(4 stacked 84×84 uint8 frames, sign-clipped rewards, FIRE on reset, a lost life ends the episode
while the game goes on), the game's score is reported beside the per-life clipped returns (the
raw sum over the whole game, what CleanRL and SB3 report), the model of configs/ppo_atari.yaml
is CleanRL's Atari agent, the config trains and logs whole games and `fleetrl eval` plays whole
games, and a preset fleetrl does not
know, or one that does not fit the env, is a config error naming the key."""

from __future__ import annotations

from dataclasses import replace

import ale_py  # noqa: F401 (the `atari` extra, in `test`: registers the games; a broken install fails here)
import numpy as np
import pytest

from fleetrl.algos.registry import algorithm_spec
from fleetrl.checkpoint import load_latest
from fleetrl.cli import main
from fleetrl.config.schema import EnvConfig
from fleetrl.envs.make import make_vector_env
from fleetrl.evaluate import evaluate
from fleetrl.models.policy import Policy
from fleetrl.plan.load import load_config
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.eval_worker import play
from tests.image_envs import RecordedBreakout
from tests.support import REPO, train

CONFIG = REPO / "configs" / "ppo_atari.yaml"
BREAKOUT = EnvConfig(id="BreakoutNoFrameskip-v4", wrappers="atari", num_envs=1)
BREAKOUT_LIVES = 5
PPO_ROLLOUT = algorithm_spec("ppo").rollout_class()
RIGHT, LEFT = 2, 3  # Breakout's actions: NOOP, FIRE, RIGHT, LEFT
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


def test_the_reported_game_return_is_the_whole_game_s_raw_score_beside_per_life_clipped_returns():
    """One game of a real Breakout, played by following the ball (so that it hits the 4-point
    bricks); `RecordedBreakout` keeps the rewards the simulator itself returned."""
    worker = EnvWorker(replace(BREAKOUT, id="tests.image_envs:RecordedBreakout"), 0.99, seed=0)
    try:
        breakout = worker.stages[0].envs[0]
        while not isinstance(breakout, RecordedBreakout):
            breakout = breakout.env
        ram = breakout.unwrapped.ale.getRAM
        worker.reset()
        returns, games, steps = [], [], 0
        while not games:
            paddle_x, ball_x = int(ram()[72]), int(ram()[99])  # Breakout's RAM
            worker.step(np.array([RIGHT if ball_x > paddle_x + 8 else LEFT]))
            report = worker.report()
            returns, games, steps = returns + report["returns"], games + report["game_returns"], steps + 1
            assert steps < 5000, "the game never ended"
        raw = breakout.games[0]  # the first game, every frame of it, the preset's own steps included
        assert max(raw) > 1, "no brick above the bottom rows was hit: raw and clipped would agree"
        assert games == [sum(raw)]
        assert len(returns) == BREAKOUT_LIVES  # one episode per life, each return clipped
        assert sum(returns) == sum(1 for reward in raw if reward) < sum(raw)
    finally:
        worker.close()


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


def test_the_atari_config_trains_and_logs_whole_games(tmp_path):
    """512 steps per env: an untrained agent's game of Breakout lasts 110 to 290 of them (25 seeds
    of random play), so whole games end and are logged, each one game of 5 lives (episodes)."""
    small = ["env.num_envs=2", "algorithm.num_steps=256", "algorithm.update_epochs=1", "runner.tensorboard=false"]
    result = train(CONFIG, *small, "runner.total_env_steps=1024", runs=tmp_path / "runs").succeeded()
    assert [r["global_step"] for r in result.metrics] == [512, 1024]
    assert all(np.isfinite(r["policy_loss"]) and np.isfinite(r["value_loss"]) for r in result.metrics)
    assert all(r["grad_steps"] == 1 * 2 for r in result.metrics)  # 1 epoch of 512 / 256 minibatches
    games = sum(r.get("games", 0) for r in result.metrics)
    assert games >= 2 and result.metrics[-1]["episodes"] >= BREAKOUT_LIVES * games  # a game: 5 lives

    # `fleetrl eval` plays whole games: one game = the same play as its 5 lives, its raw score at
    # least their clipped returns (a brick is worth 1, 4 or 7 in Breakout, clipped to 1)
    config = load_config(result.run_dir / "config.yaml")
    env = EnvWorker(config.env, config.algorithm.gamma, seed=7, num_envs=1, training=False)
    rollout = PPO_ROLLOUT.from_config(config, env.observation_space, env.action_space)
    rollout.load_weights(load_latest(result.run_dir)["actor"]["policy"])
    try:
        lives = play(env, rollout, BREAKOUT_LIVES, True, False)
        game = play(env, rollout, 1, True, False, whole_games=True)
    finally:
        env.close()
    (score,), (length,) = game.returns, game.lengths
    assert length == sum(lives.lengths) and score >= sum(lives.returns)
    evaluation = evaluate(result.run_dir, episodes=2)
    assert (evaluation["unit"], evaluation["episodes"]) == ("game", 2)


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

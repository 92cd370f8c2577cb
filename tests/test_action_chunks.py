"""Action chunks (`model.action_chunk`): one inference, K env steps, stopped at an episode's end.

On `tests.envs.CountingEnv` (the k-th step of an episode rewards k; episode lengths written
down in advance) with γ = 0.5 and λ = 0.5, so every expected value below is exact in binary and
computed by hand in the comments.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.algos.common.gae import compute_gae
from fleetrl.algos.common.logprobs import combine
from fleetrl.algos.ppo.update import PPOBatch, ppo_loss
from fleetrl.cluster.exchange.collect import Collector
from fleetrl.cluster.groups import InlineGroup
from fleetrl.config.model_sections import MlpModelConfig
from fleetrl.config.schema import EnvConfig
from fleetrl.controller.loop import Trainer
from fleetrl.errors import ConfigError
from fleetrl.models.policy import Policy
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.probe import flight_recorder
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker
from tests.envs import obs

ENTRY = "tests.envs:CountingEnv"
GAMMA = 0.5


def chunk_env(lengths, terminal=(True,), num_envs=2, chunk=3, max_episode_steps=None) -> EnvWorker:
    config = EnvConfig(
        id=ENTRY,
        kwargs={"lengths": list(lengths), "terminal": list(terminal)},
        num_envs=num_envs,
        max_episode_steps=max_episode_steps,
    )
    return EnvWorker(config, gamma=GAMMA, seed=0, chunk=chunk)


def test_a_chunk_stops_at_the_episode_end_and_counts_executed_steps():
    env = chunk_env(lengths=[5, 100])  # env 0 terminates after 5 steps, env 1 runs on
    try:
        assert env.action_space.n == 2  # the space of one env step, not of the chunk
        env.reset()
        first = env.step(np.zeros((2, 3), np.int64))
        # both run steps 1, 2, 3: 1 + 0.5·2 + 0.25·3 = 2.75
        np.testing.assert_array_equal(first.reward, [2.75, 2.75])
        np.testing.assert_array_equal(first.steps, [3, 3])
        second = env.step(np.zeros((2, 3), np.int64))
        # env 0 runs steps 4, 5 and terminates: 4 + 0.5·5 = 6.5, its third action dropped;
        # env 1 runs 4, 5, 6: 4 + 0.5·5 + 0.25·6 = 8
        np.testing.assert_array_equal(second.reward, [6.5, 8.0])
        np.testing.assert_array_equal(second.steps, [2, 3])
        np.testing.assert_array_equal(second.terminated, [True, False])
        np.testing.assert_array_equal(second.obs, [obs(0, 1, 0), obs(1, 0, 6)])  # env 0 reset, not stepped on
        report = env.report()
        assert report["env_steps"] == 11 and report["episodes"] == 1
        assert report["returns"] == [15.0] and report["lengths"] == [5]  # 1+2+3+4+5, undiscounted
    finally:
        env.close()


def test_a_truncation_inside_a_chunk_keeps_its_final_observation():
    env = chunk_env(lengths=[1], terminal=[False], max_episode_steps=4)
    try:
        env.reset()
        env.step(np.zeros((2, 3), np.int64))
        result = env.step(np.zeros((2, 3), np.int64))  # step 4 hits the time limit: 1 step of 3 ran
        np.testing.assert_array_equal(result.steps, [1, 1])
        np.testing.assert_array_equal(result.truncated, [True, True])
        np.testing.assert_array_equal(result.reward, [4.0, 4.0])
        np.testing.assert_array_equal(result.final_obs, [obs(0, 0, 4), obs(1, 0, 4)])
        assert env.report()["env_steps"] == 8
    finally:
        env.close()


def test_the_collector_records_one_decision_per_chunk_with_its_steps():
    env = chunk_env(lengths=[5, 100])
    policy = Policy.from_config(
        MlpModelConfig(hidden_sizes=[8], action_chunk=3), env.observation_space, env.action_space
    )
    rollout = RolloutWorker(policy)
    rollout.configure_lanes([2], 3, env.observation_space, env.action_space)
    collector = Collector(InlineGroup([], [env]), InlineGroup([], [rollout]), stages=1, steps=3)
    try:
        collector.start(0)
        trajectory = collector.collect()
    finally:
        env.close()
    assert trajectory.actions.shape == (3, 2, 3) and trajectory.logprobs.shape == (3, 2, 3)
    np.testing.assert_array_equal(trajectory.steps, [[3, 3], [2, 3], [3, 3]])
    # env 0's second episode: steps 1, 2, 3 again
    np.testing.assert_array_equal(trajectory.rewards, [[2.75, 2.75], [6.5, 8.0], [2.75, 7 + 4 + 2.25]])
    np.testing.assert_array_equal(trajectory.terminated, [[False, False], [True, False], [False, False]])


def test_gae_discounts_each_decision_by_the_steps_it_executed():
    # one env, three decisions: a full chunk (3 steps), one cut short by termination (2 steps),
    # a full one; and a second env whose middle chunk is truncated after 1 step.
    rewards = torch.tensor([[2.75, 1.0], [6.5, 4.0], [1.0, 1.0]])
    values = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    next_values = torch.tensor([[2.0, 2.0], [3.0, 8.0], [4.0, 4.0]])  # env 1: V(final obs) = 8
    terminated = torch.tensor([[False, False], [True, False], [False, False]])
    dones = torch.tensor([[False, False], [True, True], [False, False]])
    steps = torch.tensor([[3, 3], [2, 1], [3, 3]])
    advantages, returns = compute_gae(rewards, values, next_values, terminated, dones, GAMMA, 0.5, steps)
    # env 0: Γ = 0.5^k = [0.125, 0.25, 0.125]
    #   A2 = 1 + 0.125·4 − 3 = −1.5;  A1 = 6.5 − 2 = 4.5 (terminated: no bootstrap, no flow back)
    #   A0 = (2.75 + 0.125·2 − 1) + 0.125·0.5·4.5 = 2 + 0.28125 = 2.28125
    # env 1: A2 = −1.5;  A1 = 4 + 0.5·8 − 2 = 6 (truncated after 1 step: bootstrap by γ¹, no flow back)
    #   A0 = (1 + 0.125·2 − 1) + 0.125·0.5·6 = 0.25 + 0.375 = 0.625
    assert torch.equal(advantages, torch.tensor([[2.28125, 0.625], [4.5, 6.0], [-1.5, -1.5]]))
    assert torch.equal(returns, advantages + values)


def test_log_probs_combine_over_the_executed_actions_only():
    logprobs = torch.tensor([[-1.0, -2.0, -4.0], [-1.0, -2.0, -4.0]])  # (B=2, K=3) per action
    entropy = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    steps = torch.tensor([3, 1])  # the second chunk was cut after its first action
    new, old, ent, weights = combine(logprobs, logprobs - 0.5, entropy, steps, "chunk_level", "chunk_level")
    assert torch.equal(new, torch.tensor([-7.0, -1.0])) and torch.equal(old, torch.tensor([-8.5, -1.5]))
    assert torch.equal(ent, torch.tensor([6.0, 1.0])) and weights is None
    new, _, ent, weights = combine(logprobs, logprobs, entropy, steps, "action_level", "action_level")
    assert torch.equal(weights, torch.tensor([[1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]]))
    assert torch.equal(ent, torch.tensor([2.0, 1.0]))  # the mean over executed actions
    tokens = logprobs.unsqueeze(-1).expand(2, 3, 2)  # (B, K, D=2) per token
    new, _, _, weights = combine(
        tokens, tokens, entropy.unsqueeze(-1).expand(2, 3, 2), steps, "token_level", "token_level"
    )
    assert new.shape == (2, 6) and torch.equal(weights[1], torch.tensor([0.5, 0.5, 0, 0, 0, 0]))


@pytest.mark.parametrize("level", ["chunk_level", "action_level", "token_level"])
def test_actions_that_never_ran_take_no_part_in_the_loss(level):
    """A chunk cut after its first action: the logits of actions 2 and 3 get no gradient, and
    other values there leave the loss as it is."""
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = Policy.from_config(
        MlpModelConfig(hidden_sizes=[], action_chunk=3, action_bins=5), gym.spaces.Box(-1, 1, (3,)), space
    )
    config = load_config(None, [f"algorithm.logprob_type={level}", "model.action_bins=5"]).algorithm
    observations = torch.randn(1, 3)
    actions, logprobs, values = policy.act(observations)
    assert actions.shape == (1, 3, 2) and logprobs.shape == (1, 3, 2)
    outputs = []
    policy.network.register_forward_hook(lambda module, args, output: outputs.append(output[0]))

    def loss(chunk_actions: torch.Tensor) -> torch.Tensor:
        batch = PPOBatch(observations, chunk_actions, logprobs - 0.02, values, torch.ones(1), values, torch.tensor([1]))
        return ppo_loss(policy, batch, batch.advantages, config, 0.2)[0]

    first = loss(actions)
    (grad,) = torch.autograd.grad(first, outputs[-1])
    per_action = grad.unflatten(-1, (3, -1)).abs().sum(-1)[0]  # (3,): |∂loss/∂logits| of each chunk action
    assert per_action[0] > 0 and per_action[1] == 0 and per_action[2] == 0
    changed = actions.clone()
    changed[0, 1:] = -changed[0, 1:]
    assert torch.equal(loss(changed), first)


def run(tmp_path, *overrides: str) -> dict:
    config = load_config(None, ["runner.tensorboard=false", f"runner.run_dir={tmp_path}", *overrides])
    return Trainer(resolve(config), live_progress=False).train()


@pytest.mark.usefixtures("quiet_fleetrl_logging")
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_training_with_chunks_counts_every_executed_env_step(tmp_path, model):
    # episodes of 4 steps, chunks of 3: each episode is a full chunk and one cut after 1 step,
    # so 4 decisions per env and iteration execute 8 env steps and end 2 episodes
    summary = run(
        tmp_path,
        f"env.id={ENTRY}",
        "env.kwargs={lengths: [4]}",
        "env.num_envs=2",
        f"model.id={model}",
        "model.action_chunk=3",
        "algorithm.num_steps=4",
        "algorithm.minibatch_size=4",
        "runner.total_env_steps=32",
    )
    assert (summary["iterations"], summary["global_step"], summary["episodes"]) == (2, 32, 8)
    assert summary["episode_return_last100"] == 10.0  # 1 + 2 + 3 + 4, every episode


def test_chunk_config_errors():
    cases = {
        ("model.action_chunk=0",): "model.action_chunk",
        ("algorithm.name=ppg", "model.action_chunk=2"): "model.action_chunk",
        ("algorithm.name=sac", "env.id=Pendulum-v1", "model.action_chunk=2"): "model.action_chunk",
    }
    for overrides, key in cases.items():
        with pytest.raises(ConfigError) as caught:
            load_config(None, ["env.num_envs=8", *overrides])
        assert caught.value.key == key


def test_a_chunk_runs_in_a_watched_phase_of_its_own(monkeypatch):
    recorder = flight_recorder.Recorder("env", 0, 0)
    monkeypatch.setattr(flight_recorder, "_recorder", recorder)
    env = chunk_env(lengths=[5])
    try:
        env.reset()
        with recorder.in_phase("env.step"):  # what a worker host's recorded call does
            env.step(np.zeros((2, 3), np.int64))
    finally:
        env.close()
    assert recorder.phases["env.execute_chunk"].longest_s is not None
    assert recorder.phase is None  # back outside every phase

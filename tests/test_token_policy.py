"""Token-level action policies (model.action_bins), logprob_type / entropy_type, action chunks
and GRPO advantages: the definitions on hand-made cases, two DDP ranks equal to one process,
and short training runs end to end."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.algos.common.logprobs import combine
from fleetrl.algos.ppo.grpo import grpo_advantages
from fleetrl.algos.ppo.update import PPOBatch, policy_objective, ppo_loss
from fleetrl.controller.loop import Trainer
from fleetrl.errors import ConfigError, UserError
from fleetrl.evaluate import evaluate
from fleetrl.models.distributions import ActionTokens
from fleetrl.models.policy import Policy
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.tracking.jsonl import read_metrics
from fleetrl.workers.env_worker import EnvWorker
from tests import ppg_support
from tests.compare import assert_close_metrics, max_difference
from tests.ppg_support import train_reference
from tests.ranks import each_scenario, spawn_ranks

BOX = gym.spaces.Box(np.array([-2.0, 0.0, -1.0], np.float32), np.array([2.0, 1.0, 3.0], np.float32))
DISTRIBUTED = ["ppo_tokens_token_level", "ppo_tokens_action_level", "ppo_grpo", "fsdp_tokens_token_level"]


def test_discretisation_round_trip():
    tokens = ActionTokens(BOX, 5)
    every = torch.arange(5).repeat(3, 1).T  # (5, 3): each token value in each dimension
    values = tokens.decode(every)
    assert torch.equal(tokens.encode(values), every)  # tokens → values → the same tokens
    assert torch.allclose(values[0], torch.tensor([-2.0, 0.0, -1.0]))  # both bounds are values
    assert torch.allclose(values[-1], torch.tensor([2.0, 1.0, 3.0]))
    assert torch.allclose(values[:, 0], torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0]))
    actions = torch.rand(1000, 3) * torch.tensor([5.0, 1.4, 5.0]) + torch.tensor([-2.5, -0.2, -1.5])
    nearest = tokens.decode(tokens.encode(actions))  # out of bounds clamps to the end values
    step = torch.tensor([1.0, 0.25, 1.0])
    inside = (actions >= tokens.low) & (actions <= tokens.low + 4 * step)
    assert ((nearest - actions).abs()[inside] <= step.expand_as(actions)[inside] / 2 + 1e-6).all()
    with pytest.raises(ConfigError, match="model.action_bins"):
        ActionTokens(gym.spaces.Box(-np.inf, np.inf, (2,)), 5)
    with pytest.raises(ConfigError, match="model.action_bins"):
        ActionTokens(gym.spaces.Discrete(3), 5)


def token_policy(bins: int = 4) -> Policy:
    config = load_config(None, [f"model.action_bins={bins}", "model.hidden_sizes=[8]"])
    torch.manual_seed(0)
    policy = Policy.from_config(config.model, gym.spaces.Box(-1, 1, (5,), np.float32), BOX)
    with torch.no_grad():  # visibly non-uniform token distributions
        policy.network.policy_head.weight.normal_(0, 1.0)
    return policy


def test_token_policy_acts_in_action_values_with_per_token_log_probs():
    policy = token_policy()
    obs = torch.randn(6, 5)
    actions, logprobs, _ = policy.act(obs)
    assert actions.shape == (6, 3) and logprobs.shape == (6, 3) and policy.logprob_shape == (3,)
    tokens = policy.tokens.encode(actions)
    assert torch.allclose(policy.tokens.decode(tokens), actions)
    logits = policy.network(obs)[0].view(6, 3, 4)
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    assert torch.allclose(logprobs, expected, atol=1e-6)
    new_logprobs, entropy, _, _ = policy(obs, actions)
    assert torch.allclose(new_logprobs, logprobs, atol=1e-6) and entropy.shape == (6, 3)


def test_the_expected_readout_acts_with_each_dimension_s_probability_weighted_value():
    policy = token_policy()
    obs = torch.randn(6, 5)
    mode_actions, mode_logprobs, values = policy.act(obs, deterministic=True)
    policy.token_readout = "expected"
    actions, logprobs, expected_values = policy.act(obs, deterministic=True)
    probabilities = torch.softmax(policy.network(obs)[0].view(6, 3, 4), -1)
    bin_values = torch.stack([torch.linspace(-2, 2, 4), torch.linspace(0, 1, 4), torch.linspace(-1, 3, 4)])  # (3, 4)
    assert torch.allclose(actions, (probabilities * bin_values).sum(-1), atol=1e-6)
    assert (policy.tokens.decode(policy.tokens.encode(actions)) != actions).any()  # between bins
    assert torch.equal(logprobs, mode_logprobs) and torch.equal(values, expected_values)  # the mode tokens'
    sampled, _, _ = policy.act(obs)  # sampling reads no readout: actions on the bins
    assert torch.equal(policy.tokens.decode(policy.tokens.encode(sampled)), sampled)
    assert torch.equal(policy.tokens.decode(policy.tokens.encode(mode_actions)), mode_actions)


def test_logprob_and_entropy_types():
    policy = token_policy()
    obs = torch.randn(6, 5)
    actions = policy.act(obs)[0]
    logprobs, entropy, _, _ = policy(obs, actions)
    probabilities = torch.softmax(policy.network(obs)[0].view(6, 3, 4), -1)
    joint = probabilities.gather(-1, policy.tokens.encode(actions)[..., None]).squeeze(-1).prod(-1)
    token_entropy = -(probabilities * probabilities.log()).sum(-1)  # (6, 3)

    action = load_config(None, ["model.action_bins=4"]).algorithm  # action_level (default)
    lp, old, ent, _ = combine(
        logprobs, logprobs.detach() - 0.1, entropy, None, action.logprob_type, action.entropy_type
    )
    assert lp.shape == (6,) and torch.allclose(lp, joint.log(), atol=1e-5)  # log of the joint probability
    assert torch.allclose(old, lp.detach() - 0.3, atol=1e-5)  # 3 tokens × 0.1
    assert torch.allclose(ent, token_entropy.sum(-1), atol=1e-5)  # entropy of the whole action

    token = load_config(
        None, ["model.action_bins=4", "algorithm.logprob_type=token_level", "algorithm.entropy_type=token_level"]
    ).algorithm
    lp, old, ent, _ = combine(logprobs, logprobs.detach(), entropy, None, token.logprob_type, token.entropy_type)
    assert lp.shape == (6, 3) and torch.equal(lp, logprobs)
    assert torch.allclose(ent, token_entropy.mean(-1), atol=1e-5)

    # token_level: every token's ratio is clipped on its own, the sample's loss is their mean
    log_ratio = torch.log(torch.tensor([[1.5, 1.0, 0.9], [0.5, 1.1, 1.3]]))
    advantages = torch.tensor([1.0, -2.0])
    loss = policy_objective(log_ratio, advantages, 0.2)
    assert torch.allclose(loss, torch.tensor([-(1.2 + 1.0 + 0.9) / 3, 2 * (0.8 + 1.1 + 1.3) / 3]))
    # action_level: one ratio per sample, exp(Σ log-ratios) = 1.35 → clipped at 1.2
    joint_ratio = policy_objective(log_ratio.sum(-1), advantages, 0.2)
    assert torch.allclose(joint_ratio, torch.tensor([-1.2, 2 * 0.8]))


def test_token_level_loss_is_the_per_token_ppo_loss():
    policy = token_policy()
    obs = torch.randn(8, 5)
    actions, logprobs, values = policy.act(obs)
    batch = PPOBatch(obs, actions, logprobs - 0.05 * torch.arange(3), values, torch.randn(8), torch.randn(8))
    config = load_config(
        None,
        [
            "model.action_bins=4",
            "algorithm.logprob_type=token_level",
            "algorithm.norm_adv=false",
            "algorithm.ent_coef=0.0",
        ],
    ).algorithm
    _, parts, ratios = ppo_loss(policy, batch, batch.advantages, config, 0.2)
    log_ratio = ratios.log_ratio
    assert log_ratio.shape == (8, 3) and ratios.weights is None
    ratio = log_ratio.exp()
    expected = torch.max(-batch.advantages[:, None] * ratio, -batch.advantages[:, None] * ratio.clamp(0.8, 1.2)).mean()
    assert torch.isclose(parts[0], expected)


def test_grpo_advantages_on_a_hand_made_case():
    # 6 envs in groups of 3, 6 steps; rewards 1 per step except where noted
    rewards = torch.ones(6, 6)
    rewards[0, 1] = 4.0
    dones = torch.zeros(6, 6, dtype=torch.bool)
    dones[1, 0] = dones[3, 0] = True  # env 0: episodes of 2 and 2 steps, then an open one
    dones[2, 1] = True  # env 1: one episode of 3 steps (return 6), then an open one
    dones[5, 2] = True  # env 2: one episode of 6 steps
    dones[0, 3] = dones[5, 3] = True  # group 2: env 3 episodes of 1 and 5; env 4: 6; env 5 never ends
    dones[5, 4] = True
    advantages = grpo_advantages(rewards, dones, 3)
    # group 0, episode 0: returns 2, 6, 6 → mean 14/3, unbiased std √(16/3)
    mean, std = 14 / 3, math.sqrt(((2 - 14 / 3) ** 2 + 2 * (6 - 14 / 3) ** 2) / 2)
    first = torch.tensor([(2 - mean) / std, (6 - mean) / std, (6 - mean) / std])
    assert torch.allclose(advantages[0, :3], first, atol=1e-5)
    assert torch.allclose(advantages[1, :2], first[:2], atol=1e-5)  # every step of the episode
    assert torch.allclose(advantages[5, 2], first[2], atol=1e-5)
    # env 0's episode 1 has no counterpart in its group (env 1's second episode is open): 0
    assert advantages[2:4, 0].abs().max() == 0
    # open episodes at the end of the window: 0
    assert advantages[4:, 0].abs().max() == 0 and advantages[3:, 1].abs().max() == 0
    # group 1: episode 0 of env 3 (return 1) and env 4 (return 6); env 5's never ended
    pair = torch.tensor([(1 - 3.5) / math.sqrt(12.5), (6 - 3.5) / math.sqrt(12.5)])
    assert torch.allclose(advantages[0, 3], pair[0], atol=1e-5)
    assert torch.allclose(advantages[:, 4], pair[1].expand(6), atol=1e-5)
    assert advantages[1:, 3].abs().max() == 0  # its episode 1 has no counterpart
    assert advantages[:, 5].abs().max() == 0
    # a group whose members all return the same: 0, not a division by zero
    same = grpo_advantages(torch.ones(3, 2), torch.ones(3, 2, dtype=torch.bool), 2)
    assert torch.equal(same, torch.zeros(3, 2))


def test_grpo_groups_start_from_one_state():
    config = load_config(None, ["env.id=CartPole-v1", "env.num_envs=8"])
    env = EnvWorker(config.env, 0.99, seed=5, reset_group_size=4, stages=2)
    try:
        for epoch in (0, 3):
            obs = env.reset(epoch)
            assert all(np.array_equal(obs[i], obs[i - i % 4]) for i in range(8))
            assert not np.array_equal(obs[0], obs[4])  # different groups, different states
    finally:
        env.close()


def test_token_and_grpo_config_errors():
    cases = {
        ("algorithm.logprob_type=token_level",): "algorithm.logprob_type",
        ("algorithm.entropy_type=token_level",): "algorithm.entropy_type",
        ("model.action_bins=1",): "model.action_bins",
        ("algorithm.adv_type=grpo", "algorithm.norm_adv=false", "algorithm.group_size=3"): "algorithm.group_size",
        ("algorithm.adv_type=grpo",): "algorithm.norm_adv",
        ("algorithm.adv_type=gpro",): "algorithm.adv_type",
        ("model.action_chunk=0",): "model.action_chunk",
        ("model.token_readout=expected",): "model.token_readout",  # no bins to weigh
        ("model.action_bins=5", "model.token_readout=median"): "model.token_readout",
        ("model.id=hf", "model.path=/models/x", "model.token_readout=expected"): "model.token_readout",
    }
    for overrides, key in cases.items():
        with pytest.raises(ConfigError) as caught:
            load_config(None, ["env.num_envs=8", *overrides])
        assert caught.value.key == key


@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(each_scenario, ppg_support.train_scenario, DISTRIBUTED, timeout_s=180)


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_two_ddp_ranks_equal_one_process(ranks, name):
    torch.set_num_threads(1)
    reference = train_reference(name)
    for run in ranks:
        result = run[name]
        assert result["divergence"] == {}
        for actual, expected in zip(result["metrics"], reference["metrics"], strict=True):
            assert_close_metrics(actual, expected)
        if result["weights"]:  # under FSDP the full weights are gathered on rank 0 only
            assert max_difference(result["weights"], reference["weights"]) <= 1e-5
    assert ranks[0][name]["weights"]


def run(tmp_path, *overrides: str) -> tuple[dict, list[dict]]:
    config = load_config(None, ["runner.tensorboard=false", f"runner.run_dir={tmp_path}", *overrides])
    summary = Trainer(resolve(config), live_progress=False).train()
    return summary, read_metrics(summary["run_dir"])


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_token_policy_with_action_chunks_trains_and_evaluates(tmp_path):
    summary, records = run(
        tmp_path,
        "env.id=Pendulum-v1",
        "env.num_envs=4",
        "model.action_chunk=2",
        "model.action_bins=9",
        "algorithm.logprob_type=token_level",
        "algorithm.entropy_type=token_level",
        "algorithm.num_steps=32",
        "algorithm.minibatch_size=64",
        "runner.total_env_steps=512",
    )
    assert summary["iterations"] == 2  # 4 envs x 32 chunks x 2 env steps (Pendulum never ends early)
    assert all(math.isfinite(r["policy_loss"]) and math.isfinite(r["approx_kl"]) for r in records)
    # 9 values per token: the entropy starts near log 9 per token (token_level: a token's mean)
    assert abs(records[0]["entropy"] - math.log(9)) < 0.05
    result = evaluate(summary["run_dir"], episodes=2)
    assert result["episodes"] == 2 and math.isfinite(result["mean"])
    # the same weights and episodes, acting with the expected values: other actions, other returns
    expected = evaluate(summary["run_dir"], episodes=2, overrides=["model.token_readout=expected"])
    assert expected["written"].endswith("seed10000_episodes2_token_readout-expected.json")
    assert expected["overrides"] == ["model.token_readout=expected"]
    assert [e["return"] for e in expected["per_episode"]] != [e["return"] for e in result["per_episode"]]
    with pytest.raises(UserError, match="--stochastic samples"):
        evaluate(summary["run_dir"], episodes=2, deterministic=False, overrides=["model.token_readout=expected"])


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_grpo_trains_on_group_seeded_episodes(tmp_path):
    summary, records = run(
        tmp_path,
        "env.id=CartPole-v1",
        "env.num_envs=8",
        "env.max_episode_steps=64",
        "algorithm.adv_type=grpo",
        "algorithm.group_size=4",
        "algorithm.norm_adv=false",
        "algorithm.num_steps=64",
        "algorithm.minibatch_size=128",
        "runner.total_env_steps=2048",
    )
    assert summary["iterations"] == 4
    assert all(math.isfinite(r["policy_loss"]) for r in records)
    assert records[-1]["episodes"] >= 8 * 4  # every env ends at least one episode per iteration
    summary_file = json.loads((tmp_path.glob("*/summary.json").__next__()).read_text())
    assert summary_file["iterations"] == 4

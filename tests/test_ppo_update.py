"""The PPO update's one path gives the same result for a minibatch that lies whole on this rank
(one piece, normalised with its own mean and std) as for the same minibatch in pieces (gradient
accumulation: the float64 statistics of the all-reduce, gradients accumulated over the pieces),
and fleetrl's gradient clipping is torch's `clip_grad_norm_` bit for bit — on the RL-Zoo CartPole
shapes and a real policy."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker, policy_optimizer
from fleetrl.algos.ppo.update import PPOBatch, ppo_update
from fleetrl.models.policy import Policy
from fleetrl.parallel.sharding import EnvShard, Minibatches
from fleetrl.parallel.wrap import clip_grad_norm_, local_loss_path
from fleetrl.plan.load import load_config
from tests.support import REPO

STEPS, ENVS = 32, 8  # RL-Zoo's CartPole set: one minibatch of 256 = the whole batch, 20 epochs


def cartpole_learner(overrides: list[str] = ()):
    config = load_config(REPO / "benchmarks/compare/configs/ppo_cartpole_rlzoo.yaml", list(overrides))
    env = gym.make("CartPole-v1")
    torch.manual_seed(3)
    policy = Policy.from_config(config.model, env.observation_space, env.action_space)
    return config, policy


def sample_batch(policy: Policy) -> PPOBatch:
    generator = torch.Generator().manual_seed(5)
    obs = torch.randn(STEPS * ENVS, 4, generator=generator)
    with torch.no_grad():
        actions, logprobs, values = policy.act(obs)
    advantages = torch.randn(STEPS * ENVS, generator=generator) * 3 + 1  # mean and std far from 0, 1
    return PPOBatch(obs, actions, logprobs, values, advantages, values + advantages)


def update(config, policy: Policy, batch: PPOBatch, micro_batch_size: int | None, train_policy: bool = True) -> dict:
    algo = config.algorithm
    minibatches = Minibatches(
        EnvShard(STEPS, ENVS), algo.minibatch_size, micro_batch_size, torch.Generator().manual_seed(0)
    )
    optimizer = policy_optimizer(config, policy)
    return ppo_update(
        local_loss_path(policy), optimizer, batch, algo, algo.clip_coef, minibatches, lambda t: t, train_policy
    )


@pytest.mark.parametrize("target_kl", [None, 0.002])
def test_a_whole_minibatch_trains_as_the_same_minibatch_in_pieces(target_kl):
    config, policy = cartpole_learner([f"algorithm.target_kl={'null' if target_kl is None else target_kl}"])
    batch = sample_batch(policy)
    other = copy.deepcopy(policy)
    whole = update(config, policy, batch, None)  # whole: one piece
    split = update(config, other, batch, config.algorithm.minibatch_size)  # in pieces: one micro-batch
    assert whole["grad_steps"] == split["grad_steps"]
    assert whole["epochs"] == split["epochs"]
    if target_kl is None:
        assert whole["epochs"] == config.algorithm.update_epochs
    else:  # the per-epoch KL is read and stops the update early, on both paths alike
        assert 1 <= whole["epochs"] < config.algorithm.update_epochs
    for (name, a), b in zip(policy.named_parameters(), other.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    start = cartpole_learner()[1]
    assert any(not torch.equal(a, b) for a, b in zip(policy.parameters(), start.parameters()))  # it trained
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        assert whole[key] == pytest.approx(split[key], rel=1e-4, abs=1e-7), key
    assert whole["approx_kl"] > 0


def test_clip_grad_norm_is_torchs_bitwise():
    _, policy = cartpole_learner()
    batch = sample_batch(policy)
    policy.network.aux_value_head = torch.nn.Linear(64, 1)  # a parameter without a gradient
    other = copy.deepcopy(policy)
    for module in (policy, other):
        logprobs, _, values, _ = module(batch.obs, batch.actions)
        (logprobs.sum() * 50 + values.pow(2).sum()).backward()  # a norm far above max_norm
    params, other_params = list(policy.parameters()), list(other.parameters())
    ours = clip_grad_norm_(params, 0.5)
    theirs = torch.nn.utils.clip_grad_norm_(other_params, 0.5, foreach=True)
    assert float(ours) > 5
    assert torch.equal(ours, theirs)
    for a, b in zip(params, other_params):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
    assert float(clipped) == pytest.approx(0.5, rel=1e-4)


@pytest.mark.parametrize("micro_batch_size", [None, 64])
def test_critic_warmup_trains_the_value_function_alone(micro_batch_size):
    """`algorithm.critic_warmup_steps`: with separate policy and value trunks (the MLP) the policy's
    outputs stay exactly as they were — the policy loss and entropy bonus weigh 0 (their gradients
    are zeros, and Adam moves nothing on zeros) — while the value function learns; afterwards both do."""
    config, policy = cartpole_learner(["algorithm.ent_coef=0.01"])
    batch = sample_batch(policy)
    with torch.no_grad():
        logits, values = policy.network(batch.obs)
    warmup = update(config, policy, batch, micro_batch_size, train_policy=False)
    with torch.no_grad():
        logits_after, values_after = policy.network(batch.obs)
    assert torch.equal(logits_after, logits)
    assert not torch.equal(values_after, values)
    assert warmup["approx_kl"] == pytest.approx(0.0, abs=1e-9)  # the policy did not move
    assert warmup["grad_steps"] == config.algorithm.update_epochs
    update(config, policy, batch, micro_batch_size)
    with torch.no_grad():
        assert not torch.equal(policy.network(batch.obs)[0], logits)


def test_critic_warmup_spans_the_configured_env_steps():
    """Warm-up iterations are those that start before `critic_warmup_steps` env steps: derived
    from the run's progress, so a resumed run knows where it is."""
    env = gym.make("CartPole-v1")
    config = load_config(
        REPO / "benchmarks/compare/configs/ppo_cartpole_rlzoo.yaml",
        ["algorithm.critic_warmup_steps=512", "runner.total_env_steps=1024"],
    )
    actor = ActorWorker(config, env.observation_space, env.action_space)
    assert [actor.critic_warmup(step / 1024) for step in (0, 256, 511, 512, 768)] == [True, True, True, False, False]


def test_a_negative_entropy_coefficient_sharpens_the_policy_and_a_positive_one_broadens_it():
    """`algorithm.ent_coef` below 0 is an entropy penalty: with no advantage to follow (all zeros), an
    update lowers the policy's entropy; above 0 the bonus raises it."""

    def entropy(policy: Policy, batch: PPOBatch) -> float:
        with torch.no_grad():
            return policy(batch.obs, batch.actions).entropy.mean().item()

    change = {}
    for coef in (-0.1, 0.1):
        config, policy = cartpole_learner([f"algorithm.ent_coef={coef}"])
        batch = sample_batch(policy)
        batch.advantages.zero_()
        before = entropy(policy, batch)
        update(config, policy, batch, None)
        change[coef] = entropy(policy, batch) - before
    assert change[-0.1] < 0 < change[0.1]

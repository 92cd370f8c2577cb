"""`compute_gae` against hand-worked cases of the GAE recursion.

    delta_t = r_t + gamma * (1 - terminated_t) * next_value_t - value_t
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}        (A_T = 0)
    return_t = A_t + value_t

Numbers are chosen as binary fractions, so the hand results are exact.
"""

from __future__ import annotations

import torch

from fleetrl.algos.common.gae import compute_gae

F, T_ = False, True


def tensors(*columns):
    """Columns are per-env lists over time; returns a (T, N) tensor."""
    return torch.tensor(list(zip(*columns)), dtype=torch.float32)


def flags(*columns):
    return torch.tensor(list(zip(*columns)), dtype=torch.bool)


def test_hand_computed_termination_and_truncation():
    gamma, lam = 0.5, 0.5  # gamma * lam = 0.25
    # env 0: terminates at t=1. next_values[1] (8.0, V of the reset obs) must not be used.
    # env 1: truncated at t=2. next_values[2] = 2.0 is V(final obs), and it must be used, while
    #        the advantage must not flow back from t=3 (a new episode, value 4.0).
    rewards = tensors([1, 1, 1, 1], [0, 2, 1, 0])
    values = tensors([0.5, 0.25, 1.0, 0.5], [1.0, 0.5, 0.25, 4.0])
    next_values = tensors([0.25, 8.0, 0.5, 2.0], [0.5, 0.25, 2.0, 1.0])
    terminated = flags([F, T_, F, F], [F, F, F, F])
    dones = flags([F, T_, F, F], [F, F, T_, F])

    advantages, returns = compute_gae(rewards, values, next_values, terminated, dones, gamma, lam)

    # env 0 deltas: t0 = 1 + .5*.25 - .5 = .625   t1 = 1 + 0 - .25 = .75 (terminated)
    #               t2 = 1 + .5*.5 - 1 = .25       t3 = 1 + .5*2 - .5 = 1.5
    # advantages:   t3 = 1.5;  t2 = .25 + .25*1.5 = .625;  t1 = .75 (done: cut)
    #               t0 = .625 + .25*.75 = .8125
    # env 1 deltas: t0 = 0 + .5*.5 - 1 = -.75     t1 = 2 + .5*.25 - .5 = 1.625
    #               t2 = 1 + .5*2 - .25 = 1.75 (bootstrap from the final obs)   t3 = 0 + .5*1 - 4 = -3.5
    # advantages:   t3 = -3.5;  t2 = 1.75 (done: cut);  t1 = 1.625 + .25*1.75 = 2.0625
    #               t0 = -.75 + .25*2.0625 = -.234375
    expected_adv = tensors([0.8125, 0.75, 0.625, 1.5], [-0.234375, 2.0625, 1.75, -3.5])
    expected_ret = tensors([1.3125, 1.0, 1.625, 2.0], [0.765625, 2.5625, 2.0, 0.5])
    torch.testing.assert_close(advantages, expected_adv, rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, expected_ret, rtol=0, atol=1e-6)
    assert advantages.shape == returns.shape == (4, 2)


def test_termination_ignores_next_value_and_truncation_uses_it():
    rewards = torch.tensor([[1.0, 1.0]])
    values = torch.tensor([[0.0, 0.0]])
    next_values = torch.tensor([[100.0, 100.0]])
    terminated = torch.tensor([[True, False]])
    dones = torch.tensor([[True, True]])  # env 0 terminated, env 1 truncated
    advantages, _ = compute_gae(rewards, values, next_values, terminated, dones, 0.9, 0.95)
    torch.testing.assert_close(advantages, torch.tensor([[1.0, 1.0 + 0.9 * 100.0]]))


def test_lambda_zero_is_one_step_td():
    torch.manual_seed(0)
    steps, envs, gamma = 6, 3, 0.9
    rewards, values, next_values = torch.randn(3, steps, envs).unbind(0)
    terminated = torch.rand(steps, envs) < 0.2
    dones = terminated | (torch.rand(steps, envs) < 0.2)
    advantages, returns = compute_gae(rewards, values, next_values, terminated, dones, gamma, 0.0)
    td_target = rewards + gamma * next_values * (~terminated).float()
    torch.testing.assert_close(advantages, td_target - values)
    torch.testing.assert_close(returns, td_target)


def test_lambda_one_without_dones_is_discounted_return_minus_value():
    torch.manual_seed(1)
    steps, envs, gamma = 5, 2, 0.8
    rewards = torch.randn(steps, envs)
    values = torch.randn(steps, envs)
    bootstrap = torch.randn(envs)  # V of the observation after the last step
    next_values = torch.cat([values[1:], bootstrap[None]])
    no = torch.zeros(steps, envs, dtype=torch.bool)
    advantages, returns = compute_gae(rewards, values, next_values, no, no, gamma, 1.0)
    for t in range(steps):
        discounted = sum(gamma**k * rewards[t + k] for k in range(steps - t))
        discounted = discounted + gamma ** (steps - t) * bootstrap
        torch.testing.assert_close(returns[t], discounted)
        torch.testing.assert_close(advantages[t], discounted - values[t])


def test_gamma_zero_is_reward_minus_value():
    torch.manual_seed(2)
    rewards, values, next_values = torch.randn(3, 4, 2).unbind(0)
    no = torch.zeros(4, 2, dtype=torch.bool)
    advantages, returns = compute_gae(rewards, values, next_values, no, no, 0.0, 0.95)
    torch.testing.assert_close(advantages, rewards - values)
    torch.testing.assert_close(returns, rewards)


def test_envs_are_independent():
    """Each column is its own recursion: computing envs one at a time gives the same result."""
    torch.manual_seed(3)
    rewards, values, next_values = torch.randn(3, 7, 4).unbind(0)
    terminated = torch.rand(7, 4) < 0.15
    dones = terminated | (torch.rand(7, 4) < 0.15)
    together, _ = compute_gae(rewards, values, next_values, terminated, dones, 0.99, 0.9)
    for env in range(4):
        alone, _ = compute_gae(
            rewards[:, env : env + 1],
            values[:, env : env + 1],
            next_values[:, env : env + 1],
            terminated[:, env : env + 1],
            dones[:, env : env + 1],
            0.99,
            0.9,
        )
        torch.testing.assert_close(together[:, env : env + 1], alone)

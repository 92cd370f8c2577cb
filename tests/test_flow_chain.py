"""The flow-matching chain (fleetrl/models/hf/flow.py) and the action expert, checked against
values worked out by hand: π0's time sampling, the noisy chunk and its velocity, the SDE's
schedule, step means and log-densities of a 2-step chain, the ODE landing on the action, the
SDE keeping the ODE's marginals, the expert reading only the prefix's real tokens, and OFT's L1
head."""

from __future__ import annotations

import math

import pytest
import torch

from fleetrl.models.hf.action_expert import ActionExpert
from fleetrl.models.hf.flow import (
    FlowChain,
    chain_log_prob,
    denoise,
    flow_matching_error,
    gaussian_log_density,
    noisy_actions,
    training_times,
)
from fleetrl.models.hf.l1_head import L1Head, l1_error


def test_training_times_follow_pi0_s_beta():
    t = training_times(200_000, torch.Generator().manual_seed(0))
    assert 0.001 <= t.min() and t.max() <= 1.0
    # E[Beta(1.5, 1)] = 1.5 / 2.5 = 0.6: E[t] = 0.001 + 0.999 × 0.6 = 0.6004 (std of the mean 6e-4)
    assert t.mean().item() == pytest.approx(0.6004, abs=3e-3)
    # P(Beta(1.5, 1) ≤ 0.25) = 0.25^1.5 = 0.125
    assert (t <= 0.001 + 0.999 * 0.25).float().mean().item() == pytest.approx(0.125, abs=3e-3)


def test_noisy_actions_and_their_velocity():
    actions, noise = torch.tensor([[[0.5, -1.0]]]), torch.tensor([[[-1.0, 1.0]]])
    x, u = noisy_actions(actions, noise, torch.tensor([0.25]))
    # x = 0.25 ε + 0.75 a; u = ε − a
    assert torch.allclose(x, torch.tensor([[[0.125, -0.5]]]))
    assert torch.allclose(u, torch.tensor([[[-1.5, 2.0]]]))
    assert torch.allclose(flow_matching_error(u + torch.tensor([0.5, -1.5]), u), torch.tensor([[1.25]]))


def test_a_two_step_sde_schedule_its_means_and_log_density_by_hand():
    chain = FlowChain(steps=2, noise="sde", noise_level=0.5)
    assert chain.times().tolist() == [1.0, 0.5, 0.0]
    # σ_0 = 0.5·√(1 / (1 − t_1)) = 0.5·√2 (the pole at t = 1 moved); σ_1 = 0.5·√(0.5 / 0.5) = 0.5
    assert torch.allclose(chain.sigmas(), torch.tensor([0.5 * math.sqrt(2), 0.5], dtype=torch.float64))
    # s_k = σ_k·√Δ, Δ = 0.5
    assert torch.allclose(chain.step_stds(), torch.tensor([0.5, 0.5 * math.sqrt(0.5)], dtype=torch.float64))
    # step 0 at t = 1: x = 1, v = 2: Euler 1 − 0.5·2 = 0; correction σ²/(2t) = 0.25 times
    # (x + (1 − t) v) = 1, scaled by Δ: μ = 0 − 0.5·0.25 = −0.125
    assert chain.step_mean(torch.tensor([[[1.0]]]), torch.tensor([[[2.0]]]), 0).item() == pytest.approx(-0.125)
    # step 1 at t = 0.5: x = 1, v = 0: Euler 1; correction 0.25/1 × (1 + 0) × 0.5: μ = 0.875
    assert chain.step_mean(torch.tensor([[[1.0]]]), torch.tensor([[[0.0]]]), 1).item() == pytest.approx(0.875)
    # its ODE twin takes the Euler step alone
    assert FlowChain(2, "ode").step_mean(torch.tensor([[[1.0]]]), torch.tensor([[[2.0]]]), 0).item() == 0.0
    # the chain x = (1, 0.375, 0.453125) with velocities (2, 0): μ_0 = −0.125 (above), μ_1 = 0.375 −
    # 0.5·0.25·0.375 = 0.328125, so log N(0.375; −0.125, 0.5²) + log N(0.453125; 0.328125, 0.3536²)
    samples = torch.tensor([1.0, 0.375, 0.453125]).view(1, 3, 1, 1)
    velocities = torch.tensor([2.0, 0.0]).view(1, 2, 1, 1)
    by_hand = (-0.5 * 1.0**2 - math.log(0.5) - 0.5 * math.log(2 * math.pi)) + (
        -0.5 * (0.125 / (0.5 * math.sqrt(0.5))) ** 2 - math.log(0.5 * math.sqrt(0.5)) - 0.5 * math.log(2 * math.pi)
    )
    assert chain_log_prob(chain, samples, velocities).item() == pytest.approx(by_hand, abs=1e-6)
    # the entropy stand-in: D Σ_k (log s_k + ½ log 2πe), here D = 3
    entropy = chain.entropy(batch=2, chunk=4, dim=3)
    expected = 3 * sum(math.log(s) + 0.5 + 0.5 * math.log(2 * math.pi) for s in (0.5, 0.5 * math.sqrt(0.5)))
    assert entropy.shape == (2, 4) and entropy[0, 0].item() == pytest.approx(expected)


def test_the_ode_lands_on_the_action_of_a_point_mass_and_the_sde_keeps_the_ode_s_marginals():
    target = torch.tensor([0.3, -0.7])
    point_mass = lambda x, t: (x - target) / t.view(-1, 1, 1)  # noqa: E731  E[ε − a | x_t] for a = target
    samples, logprob = denoise(FlowChain(3, "ode"), point_mass, torch.randn(5, 2, 2))
    assert torch.allclose(samples[:, -1], target.expand(5, 2, 2), atol=1e-6) and (logprob == 0).all()

    # data a ~ N(0, 1), noise ε ~ N(0, 1): x_t ~ N(0, V), V = t² + (1 − t)², and the exact
    # velocity E[ε − a | x] = (2t − 1)·x / V. Without the drift's correction the SDE's noise would
    # add Σ_k s_k² ≈ 1.1 to the final variance; with it the chain ends at variance 1 (Euler's error aside).
    gaussian = lambda x, t: ((2 * t - 1) / (t**2 + (1 - t) ** 2)).view(-1, 1, 1) * x  # noqa: E731
    torch.manual_seed(0)
    chain = FlowChain(50, "sde", noise_level=0.5)
    samples, _ = denoise(chain, gaussian, torch.randn(20_000, 2, 2))
    final = samples[:, -1]
    assert final.mean().item() == pytest.approx(0.0, abs=0.02)
    assert final.var().item() == pytest.approx(1.0, abs=0.05)
    assert chain.step_stds().pow(2).sum().item() > 1.0


def test_the_log_probability_of_a_stored_chain_is_the_one_it_was_drawn_with():
    torch.manual_seed(1)
    field = torch.nn.Linear(3, 3)
    velocity = lambda x, t: torch.tanh(field(x)) * t.view(-1, 1, 1)  # noqa: E731
    chain = FlowChain(10, "sde", noise_level=0.5)
    with torch.no_grad():
        samples, drawn = denoise(chain, velocity, torch.randn(6, 4, 3))
        times = chain.times()[:-1].float()
        batched = velocity(samples[:, :-1].flatten(0, 1), times.repeat(6)).unflatten(0, (6, 10))
        again = chain_log_prob(chain, samples, batched)
    assert drawn.shape == (6, 4) and torch.allclose(again, drawn, atol=1e-5, rtol=0)
    # each step's term is a Gaussian log-density: the chain's steps are its 10 transitions
    first = gaussian_log_density(
        samples[:, 1], chain.step_mean(samples[:, 0], batched[:, 0], 0), chain.step_stds()[0].float()
    ).sum(-1)
    assert first.shape == (6, 4) and torch.isfinite(first).all()


def test_the_expert_reads_the_prefix_s_real_tokens_only_and_each_sample_alone():
    torch.manual_seed(0)
    expert = ActionExpert(action_dim=4, chunk=3, prefix_width=10, state_dim=5, width=16, layers=2, heads=2)
    x, t, state = torch.randn(2, 3, 4), torch.tensor([0.9, 0.2]), torch.randn(2, 5)
    prefix, mask = torch.randn(2, 7, 10), torch.ones(2, 7, dtype=torch.bool)
    mask[0, :3] = False  # sample 0 is left-padded by 3
    v = expert(x, t, prefix, mask, state)
    assert v.shape == (2, 3, 4) and v.dtype == torch.float32
    padded = prefix.clone()
    padded[0, :3] = 100.0
    assert torch.allclose(expert(x, t, padded, mask, state), v, atol=1e-6)  # padding unseen
    other = prefix.clone()
    other[1] += 1.0
    moved = expert(x, t, other, mask, state)
    assert torch.allclose(moved[0], v[0], atol=1e-6) and not torch.allclose(moved[1], v[1])  # rows apart
    assert not torch.allclose(expert(x, torch.tensor([0.5, 0.2]), prefix, mask, state)[0], v[0])  # time read
    assert not torch.allclose(expert(x, t, prefix, mask, state + 1)[0], v[0])  # state read
    stateless = ActionExpert(action_dim=4, chunk=3, prefix_width=10, state_dim=None, width=16, layers=1, heads=2)
    assert stateless(x, t, prefix, mask).shape == (2, 3, 4)


def test_the_expert_serves_repeated_rows_of_one_prefix_as_the_prefix_repeated():
    torch.manual_seed(0)
    expert = ActionExpert(action_dim=2, chunk=3, prefix_width=6, state_dim=4, width=8, layers=2, heads=2)
    prefix, mask, state = torch.randn(2, 5, 6), torch.ones(2, 5, dtype=torch.bool), torch.randn(2, 4)
    mask[1, :2] = False
    x, t = torch.randn(6, 3, 2), torch.tensor([1.0, 0.5, 0.1, 0.9, 0.4, 0.2])  # 3 steps of each sample
    once = expert(x, t, prefix, mask, state, repeats=3)
    spelled = expert(x, t, prefix.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), state.repeat_interleave(3, 0))
    assert torch.allclose(once, spelled, atol=1e-6)


def test_the_l1_head_regresses_each_action_from_its_d_positions_and_carries_its_log_std():
    head = L1Head(hidden_size=2, action_dim=2, chunk=2, width=3, init_log_std=-0.5)
    with torch.no_grad():
        for layer in (head.mlp[0], head.mlp[2], head.mlp[4]):
            layer.weight.zero_(), layer.bias.zero_()
        head.mlp[4].bias.copy_(torch.tensor([0.25, -0.75]))
    hidden = torch.randn(3, 4, 2)  # K·D = 4 action positions of width 2
    mean, log_std = head(hidden)
    # a zero MLP answers its last bias for every action, whatever the hidden states
    assert torch.equal(mean, torch.tensor([0.25, -0.75]).expand(3, 2, 2))
    assert log_std.shape == (3, 2, 2) and (log_std == -0.5).all()
    with torch.no_grad():
        head.mlp[0].weight.zero_()
        head.mlp[0].weight[0, 2] = 1.0  # unit 0 reads action j's second position, first feature
        head.mlp[2].weight[0, 0] = 1.0
        head.mlp[4].weight[0, 0] = 1.0
    hidden = torch.zeros(1, 4, 2)
    hidden[0, 1, 0], hidden[0, 3, 0] = 2.0, -1.0  # action 0's and action 1's second positions
    mean, _ = head(hidden)
    gelu = torch.nn.functional.gelu
    assert mean[0, 0, 0].item() == pytest.approx(0.25 + gelu(gelu(torch.tensor(2.0))).item(), abs=1e-6)
    assert mean[0, 1, 0].item() == pytest.approx(0.25 + gelu(gelu(torch.tensor(-1.0))).item(), abs=1e-6)
    # the L1 distance per chunk action, averaged over D: |0.5 − 0| and |−1| → 0.75; |0| and |0.5| → 0.25
    distance = l1_error(torch.tensor([[[0.5, -1.0], [0.0, 0.5]]]), torch.zeros(1, 2, 2))
    assert torch.allclose(distance, torch.tensor([[0.75, 0.25]]))

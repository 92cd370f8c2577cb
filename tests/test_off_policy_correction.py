"""The corrections for samples an older policy version acted, checked by hand on a two-version
batch: V-trace's targets and advantages (`algorithm.adv_type: vtrace`), the decoupled objective's
truncated importance weights and its per-sample loss (`algorithm.off_policy_correction`), the
same with the proximal log-probs interpolated by age instead of a forward pass
(`algorithm.proximal_logprob: loglinear`) — its loss and gradient, per token, action or decision — and what they reduce to
on-policy (GAE(λ)'s returns; PPO's update)."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import pytest
import torch

from fleetrl.algos.common.gae import compute_gae
from fleetrl.algos.common.vtrace import compute_vtrace
from fleetrl.algos.ppo.correction import Proximal, importance_weights, interpolation_weights
from fleetrl.algos.ppo.update import PPOBatch, policy_objective, ppo_loss
from fleetrl.models.policy import Policy
from fleetrl.non_finite import NonFiniteError
from fleetrl.plan.load import load_config
from fleetrl.trajectory import Trajectory
from tests.ppo_support import acted_trajectory, cartpole_actor

GAMMA = 0.9
LOGLINEAR = ["runner.asynchronous=true", "algorithm.proximal_logprob=loglinear"]

# A batch of 3 steps × 2 envs. Env 0 was acted by version v-1: the proximal policy (version v)
# finds its actions 2, 0.5 and 0.25 times as likely as the acting policy did. Env 1 was acted
# by version v itself (ratios 1) and its episode terminated at step 1.
REWARDS = [[1.0, 1.0], [0.0, 1.0], [2.0, 1.0]]
VALUES = [[0.5, 2.0], [1.0, 1.0], [1.5, 3.0]]  # the proximal critic's V(x_t)
NEXT_VALUES = [[1.0, 1.0], [1.5, 7.0], [2.0, 2.0]]  # V(x_{t+1}); 7.0 follows a termination: unused
TERMINATED = [[False, False], [False, True], [False, False]]
RATIOS = [[2.0, 1.0], [0.5, 1.0], [0.25, 1.0]]  # π_proximal / π_acting


def tensor(rows, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype)


def two_version_vtrace(lam: float = 1.0):
    terminated = tensor(TERMINATED, torch.bool)
    return compute_vtrace(
        tensor(REWARDS),
        tensor(VALUES),
        tensor(NEXT_VALUES),
        terminated,
        terminated,
        tensor(RATIOS).log(),
        GAMMA,
        lam,
        rho_bar=1.0,
        c_bar=1.0,
    )


def test_vtrace_on_a_two_version_batch_matches_the_hand_computation():
    """Env 0, ρ = c = [1, 0.5, 0.25]: δ = ρ(r + γV' − V) = [1.4, 0.175, 0.575], then
    v − V = δ_t + γ c_t (v − V)_{t+1} = [1.790375, 0.43375, 0.575] and the advantage
    r_t + γ v_{t+1} − V_t = [1.790375, 0.8675, 2.3]. Env 1 (on-policy, terminated at step 1):
    δ = [−0.1, 0, −0.2], no correction across the termination: v − V = [−0.1, 0, −0.2]."""
    advantages, targets = two_version_vtrace()
    expected_targets = [[0.5 + 1.790375, 2.0 - 0.1], [1.0 + 0.43375, 1.0], [1.5 + 0.575, 3.0 - 0.2]]
    expected_advantages = [[1.790375, -0.1], [0.8675, 0.0], [2.3, -0.2]]
    torch.testing.assert_close(targets, tensor(expected_targets))
    torch.testing.assert_close(advantages, tensor(expected_advantages))


def test_vtrace_with_lambda_cuts_the_traces():
    """λ = 0.5 halves every c: env 0's v − V = [1.4 + 0.45·(0.175 + 0.225·0.575), ...]."""
    _, targets = two_version_vtrace(lam=0.5)
    step_1 = 0.175 + GAMMA * 0.5 * 0.5 * 0.575
    step_0 = 1.4 + GAMMA * 0.5 * 1.0 * step_1
    torch.testing.assert_close(targets[:, 0], tensor([0.5 + step_0, 1.0 + step_1, 1.5 + 0.575]))


def test_a_truncation_bootstraps_from_the_final_value_and_stops_the_correction():
    """Env 0 truncated at step 0 (not terminated): its bootstrap is V(final obs) = next_values[0]
    and step 1's correction does not flow back to it."""
    terminated = torch.zeros(3, 1, dtype=torch.bool)
    dones = tensor([[True], [False], [False]], torch.bool)
    advantages, targets = compute_vtrace(
        tensor([[1.0], [0.0], [2.0]]),
        tensor([[0.5], [1.0], [1.5]]),
        tensor([[4.0], [1.5], [2.0]]),
        terminated,
        dones,
        tensor([[0.0], [math.log(0.5)], [0.0]]),
        GAMMA,
        1.0,
        1.0,
        1.0,
    )
    assert targets[0, 0].item() == pytest.approx(0.5 + 1 + GAMMA * 4.0 - 0.5)
    assert advantages[0, 0].item() == pytest.approx(1 + GAMMA * 4.0 - 0.5)


def test_on_policy_vtrace_targets_are_gae_returns():
    """π = μ, ρ̄ = c̄ = 1: V-trace's targets are GAE(λ)'s returns, episode ends included."""
    generator = torch.Generator().manual_seed(0)
    rewards, values, next_values = (torch.randn(16, 4, generator=generator) for _ in range(3))
    terminated = torch.rand(16, 4, generator=generator) < 0.1
    dones = terminated | (torch.rand(16, 4, generator=generator) < 0.1)
    _, returns = compute_gae(rewards, values, next_values, terminated, dones, 0.99, 0.95)
    _, targets = compute_vtrace(
        rewards, values, next_values, terminated, dones, torch.zeros(16, 4), 0.99, 0.95, 1.0, 1.0
    )
    torch.testing.assert_close(targets, returns)


def test_the_decoupled_objective_of_a_two_version_batch_matches_the_hand_computation():
    """Samples 0, 1 were acted by version v−1 (π_prox/μ = 2 and 0.5: weights min(1, ·) = 1, 0.5),
    samples 2, 3 by version v (weights 1). With r = π_θ/π_prox = [1.3, 0.7, 1.1, 0.9], A = [1, −1,
    2, −2] and ε = 0.2 the per-sample loss −w·min(rA, clip(r)A) is [−1.2, 0.4, −2.2, 1.8]."""
    prox = tensor([[-1.0, -1.0], [-2.0, -2.0]])  # (T=2, N=2): sample i = (t, n) in step-major order
    acting = prox - tensor([[math.log(2.0), math.log(0.5)], [0.0, 0.0]])
    trajectory = Trajectory(
        obs=torch.zeros(2, 2, 1),
        actions=torch.zeros(2, 2, dtype=torch.long),
        logprobs=acting,
        values=torch.zeros(2, 2),
        rewards=torch.zeros(2, 2),
        terminated=torch.zeros(2, 2, dtype=torch.bool),
        dones=torch.zeros(2, 2, dtype=torch.bool),
        next_values=torch.zeros(2, 2),
    )
    weights = importance_weights(Proximal(prox, torch.zeros(2, 2)), trajectory, "action_level", cap=1.0)
    torch.testing.assert_close(weights, tensor([[1.0, 0.5], [1.0, 1.0]]))
    log_ratio = tensor([1.3, 0.7, 1.1, 0.9]).log()
    loss = policy_objective(log_ratio, tensor([1.0, -1.0, 2.0, -2.0]), 0.2, importance=weights.flatten())
    torch.testing.assert_close(loss, tensor([-1.2, 0.4, -2.2, 1.8]))


class Recording(torch.nn.Module):
    """`policy`, keeping the log-probs of its last forward pass for their gradient."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy, self.logprobs = policy, None

    def forward(self, obs, actions):
        outputs = self.policy(obs, actions)
        outputs.logprobs.retain_grad()
        self.logprobs = outputs.logprobs
        return outputs


def test_the_interpolated_proximal_policy_of_a_two_version_batch_matches_the_hand_computation():
    """Samples 0, 1 and 3 were acted by version v−1, sample 2 by version v, the actor's at the
    update's start: ages [1, 1, 0, 1], α = a / (a + 1) = [½, ½, 0, ½]. The policy being trained
    finds the actions [4, 1.21, 1.1, 0.25] times as likely as the acting policy did, so the
    interpolated π_prox / μ = (π_θ / μ)^α = [2, 1.1, 1, 0.5]: weights min(1, ·) = [1, 1, 1, 0.5], and
    the clipped ratio π_θ / π_prox = [2, 1.1, 1.1, 0.5]. With A = [1, −1, 2, −2] and ε = 0.2 the
    per-sample loss −w·min(rA, clip(r)A) is [−1.2, 1.1, −2.2, 0.8], mean −0.375. π_θ enters the
    interpolation without gradient: d loss / d log π_θ = −w·r·A / 4 where the ratio is not clipped
    = [0, 0.275, −0.55, 0] (sample 1's would be halved, (1 − α)·0.275, were it differentiated)."""
    torch.testing.assert_close(interpolation_weights(torch.tensor([0, 1, 2, 3])), tensor([0.0, 0.5, 2 / 3, 0.75]))
    actor = cartpole_actor()
    policy = Recording(actor.policy)
    obs = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        actions, logprobs, values = actor.policy.act(obs)
    acting = logprobs - tensor([4.0, 1.21, 1.1, 0.25]).log()
    advantages = tensor([1.0, -1.0, 2.0, -2.0])
    alpha = interpolation_weights(torch.tensor([1, 1, 0, 1]))
    batch = PPOBatch(obs, actions, acting, values, advantages, values, interpolation=alpha)
    loss, parts, ratios = ppo_loss(policy, batch, advantages, actor.config.algorithm, 0.2)
    assert parts[0].item() == pytest.approx(-0.375, abs=1e-5)
    torch.testing.assert_close(ratios.log_ratio.exp(), tensor([2.0, 1.1, 1.1, 0.5]))
    torch.testing.assert_close(ratios.proximal.exp(), tensor([2.0, 1.1, 1.0, 0.5]))
    loss.backward()
    torch.testing.assert_close(policy.logprobs.grad, tensor([0.0, 0.275, -0.55, 0.0]))


@pytest.mark.parametrize("level", ["token_level", "action_level", "chunk_level"])
def test_a_token_policy_interpolates_every_piece_of_a_decision_alike(level):
    """A token policy (3 tokens an action) whose trained policy finds each token e^0.1 times as
    likely as the acting one did, ages [0, 1, 2] (α = [0, ½, ⅔]): per token the clipped ratio is
    e^{0.1 (1 − α)}, per action or decision (3 tokens) e^{0.3 (1 − α)}, and at every level a
    decision's interpolated π_prox / μ — what the importance metrics average — is e^{0.3 α}."""
    keys = ["model.action_bins=4", "model.hidden_sizes=[8]", f"algorithm.logprob_type={level}", *LOGLINEAR]
    config = load_config(None, keys)
    torch.manual_seed(0)
    policy = Policy.from_config(config.model, gym.spaces.Box(-1, 1, (5,)), gym.spaces.Box(-1, 1, (3,)))
    obs = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        actions, logprobs, values = policy.act(obs)
    alpha = interpolation_weights(torch.tensor([0, 1, 2]))
    batch = PPOBatch(obs, actions, logprobs - 0.1, values, tensor([1.0, -0.5, 0.3]), values, interpolation=alpha)
    _, _, ratios = ppo_loss(policy, batch, batch.advantages, config.algorithm, 0.2)
    per_token = level == "token_level"
    expected = (1 - alpha).unsqueeze(-1).expand(3, 3) * 0.1 if per_token else (1 - alpha) * 0.3
    torch.testing.assert_close(ratios.log_ratio, expected)
    torch.testing.assert_close(ratios.proximal, alpha * 0.3)


def test_on_policy_the_decoupled_objective_trains_as_ppo_does():
    """Samples the actor's own weights acted: every importance weight is 1, the proximal policy
    is the acting one, and the update ends where PPO's does (to float rounding: the proximal
    log-probs are recomputed)."""
    ppo, decoupled = cartpole_actor(), cartpole_actor("algorithm.off_policy_correction=decoupled")
    trajectory = acted_trajectory(ppo)
    plain = ppo.train(copy.deepcopy(trajectory), 0.0)
    corrected = decoupled.train(copy.deepcopy(trajectory), 0.0)
    assert corrected["importance_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert corrected["importance_truncated"] == 0.0
    assert "importance_weight_mean" not in plain  # no proximal pass without a correction
    for mine, theirs in zip(decoupled.policy.parameters(), ppo.policy.parameters()):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_on_policy_the_interpolated_objective_trains_as_ppo_does_bit_for_bit():
    """Samples 0 versions old: α = 0, the interpolated proximal policy is the acting one exactly
    (no forward pass recomputes it), every weight 1 — the update is PPO's to the last bit. A
    trajectory that carries no ages is refused by name."""
    ppo, interpolated = cartpole_actor(), cartpole_actor(*LOGLINEAR)
    trajectory = acted_trajectory(ppo)
    plain = ppo.train(copy.deepcopy(trajectory), 0.0)
    with pytest.raises(ValueError, match=r"Trajectory\.ages"):
        interpolated.train(copy.deepcopy(trajectory), 0.0)
    aged = copy.deepcopy(trajectory)
    aged.ages = torch.zeros(8, 4, dtype=torch.int64)
    corrected = interpolated.train(aged, 0.0)
    assert (corrected["importance_weight_mean"], corrected["importance_truncated"]) == (1.0, 0.0)
    for key in ("policy_loss", "value_loss", "approx_kl", "clip_fraction"):
        assert corrected[key] == plain[key], key
    for mine, theirs in zip(interpolated.policy.parameters(), ppo.policy.parameters()):
        assert torch.equal(mine, theirs)


def test_stale_samples_are_weighed_by_how_far_the_acting_policy_lags():
    """Samples acted by the version before the actor's: the update's importance metrics are
    π_proximal / μ of the actor's weights at the update's start against the acting policy's
    recorded log-probs, averaged, and the share of them above the cap."""
    actor = cartpole_actor("algorithm.off_policy_correction=decoupled", "algorithm.update_epochs=1")
    trajectory = acted_trajectory(actor)
    old = copy.deepcopy(trajectory)
    actor.train(trajectory, 0.0)  # the actor moves on: `old` is now one version behind
    with torch.no_grad():
        proximal = actor.policy(old.obs.flatten(0, 1), old.actions.flatten(0, 1)).logprobs
    ratio = (proximal - old.logprobs.flatten()).double().exp()
    metrics = actor.train(old, 0.0)
    assert metrics["importance_weight_mean"] == pytest.approx(ratio.mean().item(), rel=1e-5)
    assert metrics["importance_truncated"] == pytest.approx((ratio > 1.001).double().mean().item())
    assert metrics["importance_weight_mean"] != pytest.approx(1.0, abs=1e-4)


def test_one_version_old_samples_are_weighed_halfway_without_a_proximal_pass():
    """`loglinear`, samples acted by the version before the actor's (ages 1, α = ½), one minibatch
    and one epoch: the one piece is trained at the update's start, where π_θ is the actor's
    weights, so its interpolated weights are (π_actor / μ)^½ — the square roots of the weights the
    forward pass would give — and that is what the update reports."""
    actor = cartpole_actor(*LOGLINEAR, "algorithm.update_epochs=1", "algorithm.minibatch_size=32")
    trajectory = acted_trajectory(actor)
    old = copy.deepcopy(trajectory)
    trajectory.ages = torch.zeros(8, 4, dtype=torch.int64)
    actor.train(trajectory, 0.0)  # the actor moves on: `old` is now one version behind
    with torch.no_grad():
        current = actor.policy(old.obs.flatten(0, 1), old.actions.flatten(0, 1)).logprobs
    weights = ((current - old.logprobs.flatten()).double() / 2).exp()
    old.ages = torch.ones(8, 4, dtype=torch.int64)
    metrics = actor.train(old, 0.0)
    assert metrics["importance_weight_mean"] == pytest.approx(weights.mean().item(), rel=1e-5)
    assert metrics["importance_truncated"] == pytest.approx((weights > 1.001).double().mean().item())
    assert metrics["importance_weight_mean"] != pytest.approx(1.0, abs=1e-4)


def test_a_non_finite_proximal_log_probability_is_named_before_the_update_trains_on_it():
    """The proximal pass (a forward of the actor's weights over the batch, whose log-probs the
    decoupled objective's ratios and weights are taken to) is checked as the rollout's outputs
    are: a log-prob that comes out NaN from finite weights and observations — here the policy
    head's output for step 3, env 1 — stops the update before any step, named where it is,
    rather than as the NaN loss it would make."""
    actor = cartpole_actor("algorithm.off_policy_correction=decoupled")
    trajectory = acted_trajectory(actor)
    before = [parameter.detach().clone() for parameter in actor.policy.parameters()]

    def spoil(module, inputs, output):
        output = output.clone()
        output[3 * 4 + 1] = float("nan")  # rows are (step, env) flattened, 4 envs
        return output

    actor.policy.network.policy_head.register_forward_hook(spoil)
    with pytest.raises(
        NonFiniteError,
        match=r"non-finite proximal policy log-probability: log-probability is nan \(step 3, env 1 of this rank's batch, in the proximal pass\)",
    ):
        actor.train(trajectory, 0.0)
    for mine, theirs in zip(actor.policy.parameters(), before):
        assert torch.equal(mine, theirs)  # nothing trained

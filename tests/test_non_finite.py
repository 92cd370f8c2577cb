"""A NaN or infinity stops the run as `non_finite`, naming where it came from, and leaves the
newest finite checkpoint to resume from: rewards and observations (checked before normalisation,
with `env.nan_policy`), the policy's log-probabilities and values, the loss, the gradients before
clipping, the parameters, and every checkpoint's state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fleetrl.checkpoint import list_checkpoints, load_latest, non_finite_entry, save_checkpoint
from fleetrl.config.model_sections import MlpModelConfig
from fleetrl.config.schema import EnvConfig
from fleetrl.models.policy import Policy
from fleetrl.non_finite import NonFiniteError
from fleetrl.parallel.wrap import clip_grad_norm_
from fleetrl.step_result import StepResult
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker
from tests.incidents import SMALL, fault
from tests.support import TWO_ACTOR_RANKS_ON_RAY, train


def nan_env(policy: str, what: str = "reward", index: int = 1, at: int = 3, always: bool = False, **env) -> EnvWorker:
    config = EnvConfig(
        id="tests.envs:NonFiniteAt",
        kwargs={"index": index, "at": at, "what": what, "always": always},
        num_envs=4,
        nan_policy=policy,
        **env,
    )
    worker = EnvWorker(config, gamma=0.99, seed=0)
    worker.reset()
    return worker


def steps(worker: EnvWorker, count: int) -> list[StepResult]:
    return [worker.step(np.zeros(worker.num_envs, np.int64)) for _ in range(count)]


@pytest.mark.parametrize(
    "what, key, value",
    [("reward", "reward", "nan"), ("obs", "observation[2]", "nan"), ("inf_obs", "observation[2]", "inf")],
)
def test_a_non_finite_env_value_is_named_with_its_env_key_and_step(what, key, value):
    worker = nan_env("error", what, normalize_obs=True, normalize_reward=True)
    steps(worker, 2)
    statistics = (worker.obs_norm.state_dict(), worker.reward_norm.stats.state_dict())
    with pytest.raises(NonFiniteError) as raised:
        steps(worker, 1)
    kind = "reward" if what == "reward" else "observation"
    assert str(raised.value) == (
        f"non-finite env {kind}: {key} is {value} (env 1 of this worker (stage 0), step 3 of its episode, "
        "after 8 env steps of this worker)"
    )
    # checked before the normalisers: their statistics never saw it
    assert non_finite_entry([worker.obs_norm.state_dict(), worker.reward_norm.stats.state_dict()]) is None
    assert worker.obs_norm.stats.count == statistics[0]["count"]
    worker.close()


def test_nan_policy_zero_replaces_each_value_by_0_and_counts_it():
    worker = nan_env("zero", "obs", normalize_obs=True)
    results = steps(worker, 4)
    assert all(np.isfinite(result.obs).all() for result in results)
    assert worker.report()["non_finite_replaced"] == 1
    assert non_finite_entry(worker.state_dict()) is None
    worker.close()


def test_nan_policy_skip_episode_ends_that_episode_uncounted_and_resets_the_env():
    worker = nan_env("skip_episode", "reward")
    results = steps(worker, 3)
    third = results[2]
    assert third.terminated.tolist() == [False, True, False, False]  # no bootstrap from a broken step
    assert third.reward[1] == 0.0 and np.isfinite(third.reward).all()
    assert worker.episode_length[1] == 0  # the env starts a fresh episode
    report = worker.report()
    assert report["non_finite_skipped"] == 1 and report["episodes"] == 0 and report["returns"] == []
    worker.close()


def test_skip_episode_on_a_simulator_that_only_gives_nan_is_an_error():
    worker = nan_env("skip_episode", "obs", at=2, always=True)
    with pytest.raises(NonFiniteError, match="after a skip_episode reset"):
        steps(worker, 3)
    worker.close()


def test_the_policys_non_finite_log_probabilities_are_named_before_they_are_recorded():
    worker = EnvWorker(EnvConfig(num_envs=2), gamma=0.99, seed=0)
    policy = Policy.from_config(MlpModelConfig(), worker.observation_space, worker.action_space)
    rollout = RolloutWorker(policy)
    rollout.configure_lanes([2], 4, worker.observation_space, worker.action_space)
    first = StepResult(worker.reset(), *([None] * 7))
    rollout.act(0, 0, first)
    with torch.no_grad():
        next(policy.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=r"non-finite policy log-probability: .* \(lane 0, env 0 of the lane"):
        rollout.act(0, 1, worker.step(np.zeros(2, np.int64)))
    worker.close()


def test_a_vla_s_non_finite_values_are_named_before_they_are_recorded(tiny_paligemma):
    """The Hugging Face VLA's rollout (the tiny PaliGemma): a NaN in its value head is named at the
    step that produced it, its lane and env."""
    from tests.vla_support import MINIGRID, vla

    worker = EnvWorker(MINIGRID, gamma=0.99, seed=0)
    policy = vla(tiny_paligemma, worker.observation_space, worker.action_space)
    rollout = RolloutWorker(policy.requires_grad_(False))
    rollout.configure_lanes([4], 4, worker.observation_space, worker.action_space)
    rollout.act(0, 0, StepResult(worker.reset(), *([None] * 7)))
    value_head = next(module for name, module in policy.named_modules() if name.endswith("value_head"))
    with torch.no_grad():
        value_head[-1].bias.fill_(float("nan"))
    with pytest.raises(
        NonFiniteError, match=r"non-finite policy value: value is nan \(lane 0, env 0 of the lane, rollout step 1"
    ):
        rollout.act(0, 1, worker.step(np.zeros(4, np.int64)))
    worker.close()


def ppo_update_of(max_grad_norm: float, spoil) -> None:
    """One PPO update of a CartPole MLP policy on random data, `spoil(policy)` applied first."""
    import gymnasium as gym

    from fleetrl.algos.ppo.actor import policy_optimizer
    from fleetrl.algos.ppo.config import PPOConfig
    from fleetrl.algos.ppo.update import PPOBatch, ppo_update
    from fleetrl.config.schema import Config
    from fleetrl.parallel.sharding import EnvShard, Minibatches
    from fleetrl.parallel.wrap import local_loss_path

    env = gym.make("CartPole-v1")
    config = Config(model=MlpModelConfig(), algorithm=PPOConfig(max_grad_norm=max_grad_norm, update_epochs=2))
    policy = Policy.from_config(config.model, env.observation_space, env.action_space)
    optimizer = policy_optimizer(config, policy)
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(64, 4, generator=generator)
    with torch.no_grad():
        actions, logprobs, values = policy.act(obs)
    batch = PPOBatch(obs, actions, logprobs, values, torch.randn(64, generator=generator), values + 1)
    spoil(policy)
    minibatches = Minibatches(EnvShard(16, 4), 32, None, generator)
    ppo_update(local_loss_path(policy), optimizer, batch, config.algorithm, 0.2, minibatches, lambda t: t)


def value_nan(policy) -> None:
    policy.register_forward_hook(lambda module, inputs, outputs: outputs._replace(value=outputs.value * float("nan")))


def first_gradient_inf(policy) -> None:
    next(policy.parameters()).register_hook(lambda grad: torch.full_like(grad, float("inf")))


def last_gradient_inf(policy) -> None:
    """The 4th and last gradient step's first gradient infinite: without clipping no step's loss
    shows it, only the parameters Adam made NaN from it."""
    backwards = iter(range(1, 5))
    next(policy.parameters()).register_hook(
        lambda grad: torch.full_like(grad, float("inf")) if next(backwards) == 4 else grad
    )


@pytest.mark.parametrize(
    "max_grad_norm, spoil, said",
    [
        (0.5, value_nan, "non-finite loss: value loss is nan (gradient step 1 of the PPO update)"),
        (
            0.5,
            first_gradient_inf,
            "non-finite gradient: network.trunk.0.weight is inf (its norm, at gradient step 1 of the PPO update, "
            "before clipping)",
        ),
        # without clipping the gradients are not checked step by step: the next step's loss shows it, and says so
        (0.0, first_gradient_inf, "non-finite loss: policy loss is nan (gradient step 2 of the PPO update; without"),
        (
            0.0,
            last_gradient_inf,
            "non-finite parameter: network.trunk.0.weight is nan (its norm, after gradient step 4",
        ),
    ],
)
def test_an_update_names_its_first_non_finite_loss_term_gradient_or_parameter(max_grad_norm, spoil, said):
    with pytest.raises(NonFiniteError) as raised:
        ppo_update_of(max_grad_norm, spoil)
    assert str(raised.value).startswith(said), str(raised.value)


def test_finite_values_too_large_to_sum_are_no_incident_and_a_nan_beside_them_is_named():
    """`verify` sums every value in float64 and looks closer only where the sum is not finite:
    finite float64 terms whose sum overflows are finite, a NaN among them is still named."""
    from fleetrl.algos.common.finite import UpdateChecks

    checks = UpdateChecks(torch.nn.Linear(2, 1), ("first", "second"), "the test update")
    for step in (1, 2):
        checks.loss(torch.tensor([1e308, 1e308], dtype=torch.float64), step)
    checks.verify()
    checks.loss(torch.tensor([1e308, float("nan")], dtype=torch.float64), 3)
    with pytest.raises(NonFiniteError, match=r"^non-finite loss: second is nan \(gradient step 3 of the test update"):
        checks.verify()


def test_clipping_with_the_checked_norms_is_torchs_clipping_bit_for_bit():
    torch.manual_seed(0)
    ours, theirs = [torch.randn(7, 5, requires_grad=True) for _ in range(2)], []
    for p in ours:
        p.grad = torch.randn_like(p) * 10
        theirs.append(torch.nn.Parameter(p.detach().clone()))
        theirs[-1].grad = p.grad.clone()
    grads = [p.grad for p in ours]
    norms = torch.stack(torch._foreach_norm(grads))
    total = clip_grad_norm_(ours, 0.5, (grads, norms))
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5, foreach=True)
    assert torch.equal(total, expected)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, theirs))


def test_a_checkpoint_is_never_written_from_non_finite_state_and_never_resumed_from(tmp_path):
    good = {"actor": {"policy": {"w": torch.ones(3)}}, "env": [{"obs_norm": {"mean": np.zeros(2)}}]}
    save_checkpoint(tmp_path, 1, good, keep=1)
    broken = {"actor": {"policy": {"w": torch.tensor([1.0, float("nan"), 2.0])}}}
    with pytest.raises(NonFiniteError, match=r"checkpoint state: actor.policy.w is nan"):
        save_checkpoint(tmp_path, 2, broken, keep=1)
    assert [path.name for path in list_checkpoints(tmp_path)] == ["ckpt_00000001.pt"]  # kept, not rotated away
    # one written without the check (an older fleetrl): skipped like a damaged one
    torch.save(
        {"env": [{"obs_norm": {"mean": np.array([0.0, np.inf])}}]}, tmp_path / "checkpoints" / "ckpt_00000003.pt"
    )
    assert torch.equal(load_latest(tmp_path)["actor"]["policy"]["w"], torch.ones(3))


# A NaN reward and a NaN observation at env rank 0's 40th step (its third iteration, after two
# checkpoints), a NaN loss and an exploding gradient on the actor's third train: each stops the
# run as non_finite, naming what held it.
NON_FINITE_CELLS = {
    "nan_reward": (
        ("env", 40),
        "env rank {rank} raised NonFiniteError in env.step: non-finite env reward: reward is nan",
    ),
    "nan_obs": (("env", 40), "raised NonFiniteError in env.step: non-finite env observation: observation[0] is nan"),
    "nan_loss": (("actor", 3), "raised NonFiniteError in actor.train: non-finite loss: value loss is nan"),
    "inf_grad": (
        ("actor", 3),
        "raised NonFiniteError in actor.train: non-finite gradient: network.trunk.0.weight is inf",
    ),
}


def run_non_finite(tmp_path, kind: str, rank: int, *overrides: str):
    (component, call), said = NON_FINITE_CELLS[kind]
    result = train("configs/ppo_cartpole.yaml", *SMALL, fault(kind, component, rank, call), *overrides, runs=tmp_path)
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert report["cause"] == "non_finite", report["summary"]
    assert said.format(rank=rank) in report["summary"], report["summary"]
    newest = list_checkpoints(result.run_dir)[-1]
    assert report["newest_checkpoint"] == str(newest)
    assert non_finite_entry(load_latest(result.run_dir)) is None  # the newest is finite and loads
    return result


@pytest.mark.parametrize("kind", ["nan_reward", "nan_obs", "nan_loss", "inf_grad"])
def test_a_non_finite_value_stops_an_inline_run_and_keeps_the_newest_finite_checkpoint(tmp_path, kind):
    result = run_non_finite(tmp_path, kind, 0, "runner.max_restarts=1")
    assert "not restarting: non_finite is not in runner.restart_on" in result.stderr  # it would recur
    if kind == "nan_reward":  # resumable: runner.resume=auto continues from the named checkpoint, fault gone
        saved = load_latest(result.run_dir)
        resumed = train(
            "configs/ppo_cartpole.yaml",
            *SMALL,
            "runner.resume=auto",
            f"runner.total_env_steps={saved['global_step'] + 64}",
            runs=tmp_path,
        )
        assert resumed.code == 0, resumed.stderr[-3000:]
        assert resumed.summary["iterations"] == saved["iteration"] + 1


# slow: over this share of CI time (~25-70 s each on a loaded host); the env checks are
# inline's and a NonFiniteError crosses Ray as in nan_loss, the reduction is nan_loss's
SLOW_ON_RAY = pytest.mark.slow


@pytest.mark.parametrize(
    "kind, rank",
    [
        pytest.param("nan_reward", 1, marks=SLOW_ON_RAY),
        pytest.param("nan_obs", 0, marks=SLOW_ON_RAY),
        ("nan_loss", 1),
        pytest.param("inf_grad", 1, marks=SLOW_ON_RAY),
    ],
)
def test_a_non_finite_value_stops_a_ray_run_and_keeps_the_newest_finite_checkpoint(tmp_path, kind, rank):
    """Two DDP actor ranks: a NaN loss on rank 1 reaches rank 0's gradients through the reduction,
    yet rank 1, whose loss it was, is named."""
    placement = "cluster.component_placement={actor: 0-1, rollout: 0, env: 0-1}"
    result = run_non_finite(tmp_path, kind, rank, *TWO_ACTOR_RANKS_ON_RAY[:-1], placement)
    if kind == "nan_loss":
        assert result.hang_report["culprit"] == ["actor", 1], result.hang_report["summary"]

"""PPG: the auxiliary phase's schedule, which parameters each phase trains, and two DDP ranks
(Gloo on 127.0.0.1, one DDP wrapper per phase) equal to one process — policy and auxiliary
phases, Gaussian and token policies, gradient accumulation, a resume from a mid-phase
checkpoint — plus many iterations without a stall and a parameter no phase trains named at once.
"""

from __future__ import annotations

import math

import pytest
import torch

from fleetrl.algos.ppg.update import is_aux_iteration
from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_config
from tests import ppg_support
from tests.compare import assert_close_metrics, assert_close_state, max_difference
from tests.ppg_support import MANY, RESUME, build_worker, make_trajectory, train_reference
from tests.ranks import each_scenario, spawn_ranks
from tests.support import TWO_ACTOR_RANKS_ON_RAY, train

EXACT = 1e-5
DISTRIBUTED = ["ppg", "ppg_continuous_accumulation", "ppg_tokens", "ppg_resume"]
AUX_HEAD = {"network.aux_value_head.weight", "network.aux_value_head.bias"}


@pytest.fixture(scope="module")
def ranks():
    """One spawned 2-rank process group for every scenario (spawning costs seconds each)."""
    return spawn_ranks(
        each_scenario, ppg_support.train_scenario, [*DISTRIBUTED, "ppg_many", "dead_parameter"], timeout_s=240
    )


@pytest.fixture(scope="module")
def references():
    torch.set_num_threads(1)
    return {name: train_reference(name) for name in DISTRIBUTED}


def test_aux_phase_follows_every_n_pi_th_iteration():
    assert [i for i in range(1, 10) if is_aux_iteration(i, 3)] == [3, 6, 9]
    assert [i for i in range(0, 4) if is_aux_iteration(i, 1)] == [1, 2, 3]
    config, worker = build_worker("ppg", extra=["algorithm.n_pi=3"])
    ran = []
    for iteration in range(7):
        metrics = worker.train(make_trajectory(config, "ppg", iteration), 0.0)
        ran.append("aux_kl" in metrics)
        assert len(worker.stored_obs) == (iteration + 1) % 3  # cleared after each auxiliary phase
    assert ran == [False, False, True, False, False, True, False]
    assert metrics["ppg_policy_iterations"] == 7 and worker.aux_phases == 2


def test_aux_head_gets_a_gradient_only_in_the_aux_phase():
    config, worker = build_worker("ppg")
    calls = {name: 0 for name, _ in worker.policy.named_parameters()}
    for name, parameter in worker.policy.named_parameters():
        parameter.register_post_accumulate_grad_hook(lambda p, name=name: calls.__setitem__(name, calls[name] + 1))
    before = {k: v.clone() for k, v in worker.policy.state_dict().items()}
    metrics = worker.train(make_trajectory(config, "ppg", 0), 0.0)  # policy phase only
    assert "aux_kl" not in metrics
    assert all(calls[name] == 0 for name in AUX_HEAD)
    assert all(calls[name] == metrics["grad_steps"] for name in calls if name not in AUX_HEAD)
    after_policy = {k: v.clone() for k, v in worker.policy.state_dict().items()}
    assert all(torch.equal(before[name], after_policy[name]) for name in AUX_HEAD)
    assert not torch.equal(before["network.policy_head.weight"], after_policy["network.policy_head.weight"])
    calls.update({name: 0 for name in calls})
    metrics = worker.train(make_trajectory(config, "ppg", 1), 0.0)  # policy phase, then aux phase
    assert metrics["aux_grad_steps"] == 2 * 4  # 2 epochs × (2 iterations × 128 samples / 64)
    assert all(calls[name] == metrics["aux_grad_steps"] for name in AUX_HEAD)
    assert all(
        calls[name] == metrics["grad_steps"] + metrics["aux_grad_steps"] for name in calls if name not in AUX_HEAD
    )
    assert not any(torch.equal(after_policy[name], worker.policy.state_dict()[name]) for name in AUX_HEAD)
    assert metrics["aux_kl"] > 0 and math.isfinite(metrics["aux_head_loss"])


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_two_ddp_ranks_equal_one_process(ranks, references, name):
    reference = references[name]
    skip = 1 if name in RESUME else 0
    for rank, run in enumerate(ranks):
        result = run[name]
        assert result["divergence"] == {}, f"rank {rank}: replicas differ: {result['divergence']}"
        for actual, expected in zip(result["metrics"], reference["metrics"][skip:], strict=True):
            assert_close_metrics(actual, expected)
        assert max_difference(result["weights"], reference["weights"]) <= EXACT
    assert any("aux_kl" in m for m in ranks[0][name]["metrics"])  # the auxiliary phase ran, too
    # full states after the iterations both saved (policy, Adam moments, generator, PPG data)
    for actual, expected in zip(ranks[0][name]["states"], reference["states"][skip:]):
        assert_close_state(actual, expected, EXACT)
        assert actual["ppg"]["policy_iterations"] == expected["ppg"]["policy_iterations"]
        stored, stored_expected = actual["ppg"]["stored"], expected["ppg"]["stored"]
        assert (stored is None) == (stored_expected is None)
        if stored is not None:  # gathered from both ranks into the single-process layout, exactly
            assert stored["iterations"] == stored_expected["iterations"]
            assert torch.equal(stored["obs"], stored_expected["obs"])
            assert torch.equal(stored["returns"], stored_expected["returns"])


def test_each_phase_has_its_own_ddp_wrapper(ranks):
    wrapped = ranks[0]["ppg"]["wrapped"]
    assert set(wrapped["unused"]["policy"]) == AUX_HEAD and wrapped["unused"]["aux"] == []
    names = {name.removeprefix("policy.") for name in wrapped["aux"]}
    assert AUX_HEAD <= names  # the auxiliary phase's wrapper reduces every parameter
    assert set(wrapped["policy"]) == {f"policy.{n}" for n in names - AUX_HEAD}  # the policy phase's: all but the head


def test_many_iterations_with_two_ranks_finish_without_a_stall(ranks):
    for _rank, run in enumerate(ranks):
        result = run["ppg_many"]
        assert len(result["metrics"]) == MANY
        assert sum("aux_kl" in m for m in result["metrics"]) == MANY // 3
        assert result["divergence"] == {}
        assert all(math.isfinite(m["aux_kl"]) for m in result["metrics"] if "aux_kl" in m)
    assert ranks[0]["ppg_many"]["metrics"] == ranks[1]["ppg_many"]["metrics"] or all(
        {k: v for k, v in a.items() if k != "aux_s"} == {k: v for k, v in b.items() if k != "aux_s"}
        for a, b in zip(ranks[0]["ppg_many"]["metrics"], ranks[1]["ppg_many"]["metrics"])
    )


def test_a_parameter_no_phase_trains_is_named_not_waited_for(ranks):
    for run in ranks:
        result = run["dead_parameter"]
        assert result["outcome"].startswith("RuntimeError") and "network.dead" in result["outcome"], result
        assert result["seconds"] < 10  # named at construction, before any collective


def test_ppg_config_errors():
    base = ["algorithm.name=ppg", "env.num_envs=8", "algorithm.num_steps=16", "algorithm.minibatch_size=32"]
    cases = {
        "model.id": ["model.id=transformer"],  # no policy features for the auxiliary head
        "actor.strategy": ["actor.strategy=fsdp"],
        "algorithm.aux_minibatch_size": ["algorithm.n_pi=1", "algorithm.aux_minibatch_size=100"],
        "algorithm.n_pi": ["algorithm.n_pi=0"],
    }
    for key, overrides in cases.items():
        with pytest.raises(ConfigError) as caught:
            load_config(None, base + overrides)
        assert caught.value.key == key


def test_stored_data_are_copies_of_the_trajectory():
    """Trajectories can be views of the rollout buffer, which the next collect overwrites."""
    config, worker = build_worker("ppg", extra=["algorithm.n_pi=4"])
    trajectory = make_trajectory(config, "ppg", 0)
    worker.train(trajectory, 0.0)
    kept = worker.stored_obs[0].clone()
    trajectory.obs.add_(1.0)
    assert torch.equal(worker.stored_obs[0], kept)


def test_ppg_on_ray_with_two_ddp_ranks_runs_many_iterations(tmp_path):
    """The real runtime: 2 DDP actor ranks as Ray workers under the watchdog, 40 iterations with
    an auxiliary phase every 4th, replicas checked every 5th — finishes, no incident."""
    run = train(
        "configs/ppg_cartpole.yaml",
        *TWO_ACTOR_RANKS_ON_RAY,
        "env.num_envs=4",
        "algorithm.num_steps=16",
        "algorithm.minibatch_size=32",
        "algorithm.update_epochs=2",
        "algorithm.n_pi=4",
        "algorithm.aux_epochs=2",
        "algorithm.aux_minibatch_size=64",
        "runner.param_check_interval=5",
        "runner.checkpoint_interval=10",
        "runner.total_env_steps=2560",
        runs=tmp_path,
    ).succeeded()
    records = run.metrics
    assert len(records) == 40
    assert [r["iteration"] for r in records if "aux_kl" in r] == list(range(4, 41, 4))
    assert run.summary["iterations"] == 40

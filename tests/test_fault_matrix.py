"""A representative few cells of the fault matrix (benchmarks/diagnosis/fault_matrix.py runs them all), from
the same cell table (tests/fault_cells.py): each a real `fleetrl train` with the fault injected,
whose report must name the cell's cause and culprit within a bound derived from the watchdog's
thresholds, and leave no process behind (`Fleetrl.finish` fails the test otherwise). The last
two are cells of the Hugging Face VLA's table (`hf_cells`): an actor rank's fault inside the
model's forward, and the rollout's."""

from __future__ import annotations

import pytest

from tests.fault_cells import METHOD, WHEN, Cell, assert_named, make_cell
from tests.support import train

FIRST_CALL_BOUND_S = 5.0  # shorter than the default 15 s, to keep the run short; the mechanism is the same


def run_cell(tmp_path, cell: Cell):
    return train(cell.config, *cell.overrides, runs=tmp_path, timeout=240)


def test_an_exception_in_the_first_env_reset_inline_is_named_at_once(tmp_path):
    """Start-up, inline: the env's first reset raises, before the training loop has begun."""
    cell = make_cell("exception", "env", "startup", "inline")
    result = run_cell(tmp_path, cell)
    assert_named(result, cell)
    assert "InjectedFault in env.reset" in result.hang_report["summary"]
    # the culprit is a worker of the report, in the one process that hosts every inline worker
    workers = {(w["component"], w["rank"]): w for w in result.hang_report["workers"]}
    assert list(workers) == [("inline", 0), ("env", 0)]
    assert (workers[("env", 0)]["culprit"], workers[("inline", 0)]["culprit"]) == (True, False)
    assert workers[("env", 0)]["host"] == ["inline", 0]
    assert workers[("env", 0)]["pid"] == workers[("inline", 0)]["pid"] is not None
    text = (result.run_dir / "hang_report.txt").read_text()
    assert "> env rank 0" in text and "runs in inline rank 0" in text


@pytest.mark.slow  # ~45 s: a Ray cluster's start-up
def test_a_first_call_hang_of_an_env_rank_on_ray_is_a_blocked_phase_timeout(tmp_path):
    cell = make_cell("hang", "env", "first_call", "ray", first_call_bound_s=FIRST_CALL_BOUND_S)
    result = run_cell(tmp_path, cell)
    assert_named(result, cell)
    assert result.hang_report["state"] == "blocked", result.hang_report["summary"]


@pytest.mark.slow  # ~45 s: a Ray cluster's start-up
def test_a_fused_rank_killed_in_steady_state_is_named_within_the_poll(tmp_path):
    cell = make_cell("kill", "actor", "steady", "fused")
    result = run_cell(tmp_path, cell)
    assert_named(result, cell)


def test_a_hang_before_the_process_group_join_on_ray_names_the_rank_that_never_joined(tmp_path):
    """Start-up, Ray: actor rank 1 hangs in init_distributed before its join, rank 0 waits in the
    rendezvous (the join, recorded as collective #1 of group `join`): rank 1 is named, not rank 0,
    which entered its start-up step first."""
    allowance_s = 10.0  # the default 60 s, shortened to keep the run short; the rule is the same
    cell = make_cell("hang", "actor", "startup", "ray", startup_step_allowance_s=allowance_s)
    result = run_cell(tmp_path, cell)
    assert_named(result, cell)
    assert "; actor rank 0 waits in join (gloo rendezvous at tcp://" in result.hang_report["summary"]


@pytest.mark.parametrize("when", WHEN)
def test_an_exception_in_the_rollout_is_named_at_every_moment_inline(tmp_path, when):
    """The rollout component, fault-injected at start-up (its lanes' configuration), on its first
    `act` and in steady state (its 40th): each is the rollout's own `worker_exception`, named
    within the cell's bound, its method in the summary."""
    cell = make_cell("exception", "rollout", when, "inline")
    assert not cell.infeasible, cell.infeasible
    result = run_cell(tmp_path, cell)
    assert_named(result, cell)
    method, _ = METHOD["rollout"][when]
    assert f"InjectedFault in rollout.{method}" in result.hang_report["summary"], result.hang_report["summary"]


def test_a_hang_inside_the_vla_s_forward_on_actor_rank_1_names_rank_1(tmp_path, tiny_paligemma):
    """The tiny LoRA PaliGemma on 2 fused DDP ranks (2 processes: the cheapest 2-rank layout):
    rank 1's model blocks in its first training forward; rank 0 waits for it in a collective of
    the same step, and rank 1 is named."""
    cell = make_cell(
        "hang_in_forward", "actor", "first_call", "fused", str(tiny_paligemma), first_call_bound_s=FIRST_CALL_BOUND_S
    )
    result = run_cell(tmp_path, cell)
    assert_named(result, cell)
    assert result.hang_report["summary"].startswith("fused rank 1 is behind: "), result.hang_report["summary"]
    assert "fused rank 0 waits in " in result.hang_report["summary"]


def test_an_exception_in_the_vla_rollout_s_first_act_is_named_at_once(tmp_path, tiny_paligemma):
    cell = make_cell("exception", "rollout", "first_call", "inline", hf_folder=str(tiny_paligemma))
    result = run_cell(tmp_path, cell)
    assert_named(result, cell)
    assert "InjectedFault in rollout.act" in result.hang_report["summary"], result.hang_report["summary"]

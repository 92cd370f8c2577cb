"""The components outside the fault matrix's worker cells, each faulted at start-up, on its first
call and in steady state (docs/reference/promises.md lists which test holds which moment): the
eval worker, the controller, the supervisor and the janitor.

The moments, for the processes that have no method `debug.fault` can aim at: start-up is before
the first iteration begins; the first call is the first iteration, held open by its env
(tests/live_envs.py `HeldCartPole`: 1 s a step while the hold file exists, and the first step
writes `stepped`); steady state is once three iterations are logged.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.incidents import HEARTBEAT_TIMEOUT_S, NOTICE_S, SMALL, assert_incident, fault, promised_detection_s
from tests.support import (
    TEARDOWN_PROMISE_S,
    Fleetrl,
    controller_of,
    iterations_logged,
    run_janitor,
    train,
    wait_for,
)

CONFIG = "configs/ppo_cartpole.yaml"
STEADY = 3  # iterations logged: steady state
# An iteration of 8 steps of one env, each 1 s while held: the first call lasts 8 s or more
HELD_STEP_S = 1.0


def held(runs: Path, hold: Path, stepped: Path, *overrides: str) -> list[str]:
    """`fleetrl train` args: 8-step iterations of one HeldCartPole, held (1 s a step) while `hold`
    exists; `stepped` written at its first step."""
    return [
        "train",
        CONFIG,
        f"runner.run_dir={runs}",
        *SMALL,
        "env.id=tests.live_envs:HeldCartPole",
        f"env.kwargs={{hold_file: {hold}, step_s: {HELD_STEP_S}, stepped_file: {stepped}}}",
        "env.num_envs=1",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=8",
        "algorithm.update_epochs=1",
        *overrides,
    ]


def in_first_iteration(running: Fleetrl, runs: Path, stepped: Path) -> None:
    """Returns once the first iteration is under way (its first env step taken, none logged)."""
    wait_for(running, "the first env step", stepped.exists, timeout_s=240)
    assert iterations_logged(runs) == 0


# ---------------------------------------------------------------------------------- the janitor


def test_the_janitor_killed_at_any_moment_is_replaced_and_kill_9_of_the_run_still_leaves_nothing(tmp_path):
    """SIGKILL of the janitor at start-up, in the first iteration and in steady state, on Ray (whose
    daemons only the janitor ends after a `kill -9` of `fleetrl train`): each time the supervisor
    starts another, saying so; then `kill -9` of `fleetrl train` leaves no process of the run (the
    test's own account: every descendant it saw) 10 s later."""
    runs, hold, stepped = tmp_path / "runs", tmp_path / "hold", tmp_path / "stepped"
    hold.touch()
    with Fleetrl(*held(runs, hold, stepped, "cluster.backend=ray", "runner.total_env_steps=100000"), runs=runs) as run:
        _, janitor = run_janitor(run)
        for moment in ("start-up", "the first iteration", "steady state"):
            if moment == "the first iteration":
                in_first_iteration(run, runs, stepped)
            if moment == "steady state":
                hold.unlink()
                wait_for(run, f"{STEADY} iterations", lambda: iterations_logged(runs) >= STEADY)
            janitor.kill()
            _, replaced = run_janitor(run, other_than=janitor.pid)
            # the supervisor says so once the new one is started: the test may see it first
            said = f"janitor (pid {janitor.pid}) ended (killed by SIGKILL): started another"
            wait_for(
                run, "the supervisor's word of the replaced janitor", lambda said=said: said in run.stderr_so_far(), 30
            )
            if moment == "the first iteration":
                assert iterations_logged(runs) == 0, "the first iteration was over before the janitor was replaced"
            janitor = replaced
        left = run.kill_9()
        assert not left, f"alive {TEARDOWN_PROMISE_S:g} s (and the loaded host's margin) after kill -9: {left}"
        assert "process(es) of the run outlived `fleetrl train`" in run.stderr_so_far()


# ------------------------------------------------------------------------------- the supervisor


def test_a_supervisor_stopped_at_any_moment_causes_no_false_incident_once_it_runs_again(tmp_path):
    """SIGSTOP of `fleetrl train` — the supervisor, whose store every heartbeat goes to — for twice
    the heartbeat timeout, at start-up, in the first iteration and in steady state (a debugger, a
    suspended terminal): the workers went on meanwhile, so once it runs again (SIGCONT) nothing is
    frozen and the run ends as it would have: exit 0, no report."""
    runs, hold, stepped = tmp_path / "runs", tmp_path / "hold", tmp_path / "stepped"
    stopped_s = 2 * HEARTBEAT_TIMEOUT_S
    hold.touch()
    with Fleetrl(*held(runs, hold, stepped, "runner.total_env_steps=64"), runs=runs) as run:
        for moment in ("start-up", "the first iteration", "steady state"):
            if moment == "start-up":
                wait_for(run, "the controller", lambda: controller_of(run))
            if moment == "the first iteration":
                in_first_iteration(run, runs, stepped)
            if moment == "steady state":
                hold.unlink()
                wait_for(run, f"{STEADY} iterations", lambda: iterations_logged(runs) >= STEADY)
            run.process.send_signal(signal.SIGSTOP)
            time.sleep(stopped_s)
            run.process.send_signal(signal.SIGCONT)
        result = run.finish(timeout=300)
    result.succeeded()
    assert [r["iteration"] for r in result.metrics] == list(range(1, 9))


# ------------------------------------------------------------------------------- the controller


def test_the_controller_killed_in_its_first_iteration_is_worker_died_naming_the_iteration_s_phase(tmp_path):
    """Start-up (stopped before its first heartbeat) and steady state (killed once checkpointed)
    are tests/test_supervisor.py's; here the first call: SIGKILL of the controller while its first
    iteration collects."""
    runs, hold, stepped = tmp_path / "runs", tmp_path / "hold", tmp_path / "stepped"
    hold.touch()
    with Fleetrl(*held(runs, hold, stepped), runs=runs) as run:
        in_first_iteration(run, runs, stepped)
        time.sleep(4 * HELD_STEP_S)  # the controller's beats say so too (every 0.5 s)
        assert iterations_logged(runs) == 0
        controller = controller_of(run)
        controller.kill()
        result = run.finish(timeout=120)
    assert_incident(result, "worker_died", ["inline", 0], NOTICE_S)
    summary = result.hang_report["summary"]
    assert f"(the controller, pid {controller.pid}) died: killed by SIGKILL" in summary, summary
    assert "; it was in env.step" in summary or "; it was in collect_and_train" in summary, summary


# ---------------------------------------------------------------------------------- the eval worker


def test_an_eval_worker_that_cannot_start_on_ray_is_named(tmp_path):
    """Start-up: the eval worker's env raises in its constructor, in the eval worker's process
    only (the training envs build). The eval worker's first call (killed) is
    tests/test_eval_during_training.py's."""
    result = train(
        CONFIG,
        *SMALL,
        "cluster.backend=ray",
        "env.id=tests.supervisor_envs:BrokenIn",
        "env.kwargs={component: eval}",
        "runner.eval_interval=1",
        "runner.eval_episodes=2",
        runs=tmp_path,
        timeout=240,
    )
    assert_incident(result, "worker_exception", ["eval", 0], NOTICE_S)
    assert "cannot start in the eval worker" in result.hang_report["summary"] + result.hang_report["detail"]


def test_an_evaluation_that_hangs_in_steady_state_is_a_stall_naming_it(tmp_path):
    """Steady state, inline: the third evaluation (eval.run) never returns, its deadline learned
    from the two before."""
    result = train(
        CONFIG,
        *SMALL,
        "runner.eval_interval=1",
        "runner.eval_episodes=2",
        fault("hang", "eval", 0, 3),
        runs=tmp_path,
        timeout=240,
    )
    assert_incident(result, "phase_timeout", ["inline", 0], promised_detection_s("stall"))
    assert "eval.run" in result.hang_report["summary"] or "evaluation" in result.hang_report["summary"]

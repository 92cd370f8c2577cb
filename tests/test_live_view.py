"""`fleetrl top` and `fleetrl stack` against a live Ray job, as a user runs them (not a terminal):
a row per worker with its phase, each worker's stack showing where it is — and the run goes on
to its normal end, nothing stopped by looking."""

from __future__ import annotations

import time

from fleetrl.probe.stack_requests import ask_stacks
from fleetrl.supervise.janitor import processes_of_run
from fleetrl.watch.attach import attach
from tests.support import Fleetrl, first_iteration, fleetrl, held_cartpole, run_janitor


def test_top_and_stack_show_a_live_ray_job_that_then_finishes(tmp_path):
    hold = tmp_path / "hold"  # while it exists, each env step takes 0.3 s in simulate_physics
    hold.touch()
    runs = tmp_path / "runs"
    command = held_cartpole(
        runs, hold, "cluster.backend=ray", "runner.checkpoint_interval=1000", "runner.total_env_steps=200"
    )
    with Fleetrl(*command, runs=runs) as running:
        token, janitor = run_janitor(running)
        run_dir = first_iteration(runs, running)

        # the env worker spends all but the gaps between its 0.3 s steps in env.step: ask until a
        # view lands inside one, as the stack below does
        deadline = time.monotonic() + 60
        while True:
            top = fleetrl("top", str(run_dir), timeout=120)
            assert top.code == 0, top.stderr
            rows = {tuple(line.split()[:2]): line.split() for line in top.stdout.splitlines()[1:] if line.strip()}
            assert rows[("component", "rank")][4] == "phase", top.stdout  # the header
            for worker in (("env", "0"), ("rollout", "0"), ("actor", "0"), ("controller", "0")):
                assert worker in rows, top.stdout
            if rows[("env", "0")][4] == "env.step":  # phase
                break
            assert time.monotonic() < deadline, top.stdout
        assert all(row[3].isdigit() for key, row in rows.items() if key[0] in ("env", "rollout", "actor"))
        assert rows[("component", "rank")][-2:] == ["GPU", "state"], top.stdout
        # no worker computes on a GPU (none here): its GPU column says so, and nothing else
        assert all(row[-2] == "-" for key, row in rows.items() if key[0] in ("env", "rollout", "actor", "controller"))

        stack = fleetrl("stack", str(run_dir), timeout=120)
        assert stack.code == 0, stack.stderr
        sections = dict(part.split(" ===\n", 1) for part in stack.stdout.split("=== ")[1:])
        titles = [title.split(" (")[0] for title in sections]
        assert titles == ["env rank 0", "rollout rank 0", "actor rank 0", "controller rank 0"], stack.stdout
        for title, text in sections.items():
            assert '"fleetrl-heartbeat" (taking these stacks)' in text, text  # it answered itself
            if not title.startswith("controller"):
                assert '"MainThread"' in text and "in main_loop" in text, text  # the Ray worker's task loop
        assert (
            "controller/loop.py" in sections[next(t for t in sections if t.startswith("controller"))]
        )  # the training loop

        # mid-step, the env worker's stack shows the step (it spends all but the gaps between
        # steps there: ask until an answer lands inside one)
        live = attach(str(run_dir))
        deadline = time.monotonic() + 60
        while "in simulate_physics" not in (env_stack := ask_stacks(live.store, [("env", 0)], 5).get(("env", 0), "")):
            assert time.monotonic() < deadline, env_stack
        assert "live_envs.py" in env_stack and "in step" in env_stack

        hold.unlink()  # quick from here: the run goes on to its end
        result = running.finish(timeout=240).succeeded()
        janitor.wait(30)  # after a normal end the janitor finds nothing of the run, and says nothing
        stderr = running.stderr_so_far()
    assert not processes_of_run(token) and "outlived" not in stderr, stderr[-2000:]
    assert result.summary["global_step"] >= 200
    assert not (run_dir / "watch.json").exists()
    gone = fleetrl("top", str(run_dir), timeout=120)
    assert gone.code == 2 and "is not running" in gone.stderr and "Traceback" not in gone.stderr, gone.stderr


def test_top_and_stack_name_what_is_wrong_with_the_run_asked_for(tmp_path):
    missing = fleetrl("stack", str(tmp_path / "no-such-run"), timeout=120)
    assert missing.code == 2 and f"no such run directory: {tmp_path / 'no-such-run'}" in missing.stderr
    empty = fleetrl("top", cwd=tmp_path, timeout=120)  # no ./runs at all
    assert empty.code == 2 and "no run directory under" in empty.stderr, empty.stderr
    assert "Traceback" not in missing.stderr + empty.stderr

"""`fleetrl sweep`: the grid syntax and its checks (in process, nothing starts), then two real
sweeps on Ray Tune, each trial a real `fleetrl train` of CartPole: a 2×2 grid with one trial that
fails on purpose, and a sweep stopped by SIGINT. Every process a sweep started is tracked while
it runs and must be gone when it returns."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from fleetrl.cli import main
from fleetrl.errors import ConfigError, UserError
from fleetrl.sweep.grid import plan_sweep, split_values
from tests.support import REPO, Fleetrl, describe

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_values_split_on_top_level_commas_only():
    assert split_values("algorithm.lr", "1e-3,3e-4") == ["1e-3", "3e-4"]
    assert split_values("model.hidden_sizes", "[64,64],[128,128]") == ["[64,64]", "[128,128]"]
    assert split_values("debug.fault", "{kind: kill, component: env},{}") == ["{kind: kill, component: env}", "{}"]
    assert split_values("env.id", "'a,b',c") == ["'a,b'", "c"]
    assert split_values("model.hidden_sizes", "[64,64]") == ["[64,64]"]
    for bad in ("[64,64", "1,,2", "64]", "'a,b"):
        with pytest.raises(ConfigError, match="top-level commas"):
            split_values("k", bad)


def test_plan_has_every_combination_in_order():
    plan = plan_sweep(CARTPOLE, ["runner.total_env_steps=512", "runner.seed=1,2", "algorithm.lr=1e-3,3e-4"])
    assert [t.name for t in plan.trials] == ["trial-1", "trial-2", "trial-3", "trial-4"]
    assert [t.swept for t in plan.trials] == [
        {"runner.seed": s, "algorithm.lr": lr} for s in ("1", "2") for lr in ("1e-3", "3e-4")
    ]
    assert plan.trials[3].arguments == ("runner.total_env_steps=512", "runner.seed=2", "algorithm.lr=3e-4")
    assert plan.trials[0].setting == plan.trials[2].setting == "algorithm.lr=1e-3"
    assert {(t.cpus, t.gpus) for t in plan.trials} == {(1, 0)}  # inline CartPole: one process, one thread
    assert plan.name == "ppo_cartpole" and plan.config_path == Path(CARTPOLE)


def test_a_bad_value_in_any_combination_is_a_config_error_before_anything_starts(tmp_path, capsys):
    with pytest.raises(
        UserError, match=r"'algorithm\.lr': got -1.*\(in the combination runner\.seed=1 algorithm\.lr=-1\)"
    ):
        plan_sweep(CARTPOLE, ["runner.seed=1,2", "algorithm.lr=1e-3,-1"])
    for overrides, message in (
        (["algorithm.lrr=1e-3,3e-4"], "'algorithm.lrr'"),
        (["runner.seed=1,2", "runner.seed=3"], "runner.seed is given twice"),
        (["runner.resume=somewhere"], "'runner.resume'"),
        ([f"runner.run_dir={tmp_path}/a,{tmp_path}/b"], "'runner.run_dir'"),
        (["model.hidden_sizes=[64,64],[128,128"], "'model.hidden_sizes'"),
    ):
        run_dir = [] if overrides[0].startswith("runner.run_dir") else [f"runner.run_dir={tmp_path}"]
        assert main(["sweep", CARTPOLE, *run_dir, *overrides]) == 2
        assert message in capsys.readouterr().err
    assert main(["sweep", CARTPOLE, "--max-concurrent", "0"]) == 2
    assert list(tmp_path.iterdir()) == []  # no sweep directory, no trial


class ProcessWatch:
    """Every descendant of a process, sampled while it runs: what must be gone after it."""

    def __init__(self, pid: int):
        self.root, self.seen, self.done = psutil.Process(pid), {}, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self):
        while not self.done.is_set():
            try:
                for child in self.root.children(recursive=True):
                    self.seen.setdefault((child.pid, child.create_time()), child)
            except psutil.Error:
                pass
            time.sleep(0.2)

    def left_running(self) -> list[str]:
        self.done.set()
        self.thread.join()
        return [describe(p) for p in self.seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def sweep(tmp_path: Path, *overrides: str) -> Fleetrl:
    """`fleetrl sweep` of CartPole started, its sweep directory under tmp_path/runs."""
    return Fleetrl(
        "sweep", CARTPOLE, f"runner.run_dir={tmp_path / 'runs'}", "--status-interval", "3", *overrides, cwd=tmp_path
    )


def sweep_dir_of(tmp_path: Path) -> Path:
    (sweep_dir,) = (tmp_path / "runs").glob("sweep-ppo_cartpole-*")
    return sweep_dir


def test_two_by_two_sweep_with_one_failing_trial(tmp_path):
    """Seeds 1, 2 × crash_seed null, 9: with seed 2 env 7 is seeded 9, so exactly that trial's
    first env step raises — an incident (exit 4) with a hang report — and the other three run."""
    with sweep(
        tmp_path,
        "env.id=tests.sweep_envs:CartPoleCrashingOnSeed",
        "runner.total_env_steps=4096",
        "runner.target_return=15",
        "env.kwargs.crash_seed=null,9",
        "runner.seed=1,2",
    ) as running:
        watch = ProcessWatch(running.process.pid)
        result = running.finish(timeout=240)
    assert result.code == 5, result.stderr[-3000:]
    assert watch.left_running() == []
    err, out = result.stderr, result.stdout
    sweep_dir = sweep_dir_of(tmp_path)
    trials = json.loads((sweep_dir / "sweep.json").read_text())["trials"]
    assert [(t["trial"], t["status"], t["exit_code"]) for t in trials] == [
        ("trial-1", "finished", 0),
        ("trial-2", "finished", 0),
        ("trial-3", "finished", 0),
        ("trial-4", "failed", 4),
    ]
    failed = trials[3]
    assert failed["overrides"] == {"env.kwargs.crash_seed": "9", "runner.seed": "2"}
    assert failed["cause"].startswith("worker_exception: env rank 0 raised RuntimeError in env.step")
    assert "cannot run with seed 9" in failed["cause"]
    assert Path(failed["hang_report"]).is_file() and Path(failed["hang_report"]).parent.parent == sweep_dir
    for trial in trials[:3]:
        summary = json.loads((Path(trial["run_dir"]) / "summary.json").read_text())
        assert Path(trial["run_dir"]).parent == sweep_dir and trial["steps"] == summary["global_step"] <= 4096
        assert trial["final_return"] == summary["episode_return_last100"] <= trial["best_return"]
        assert (trial["target_step"], trial["target_s"]) == (
            summary["target_reached_step"],
            summary["target_reached_s"],
        )
    assert any(t["target_step"] for t in trials[:3])  # the steps-to-target column has data
    for name in ("trial-1", "trial-2", "trial-3", "trial-4"):
        assert f"[sweep] {name} started: " in err
    assert "[sweep] trial-4 (env.kwargs.crash_seed=9 runner.seed=2): failed, exit code 4: worker_exception" in err
    assert "running" in err and "finished" in err  # status lines
    table = (sweep_dir / "sweep.md").read_text()
    assert table in out
    assert "| env.kwargs.crash_seed=null | 2/2 | " in table and "| env.kwargs.crash_seed=9 | 1/2 | " in table
    assert "- trial-4 (env.kwargs.crash_seed=9 runner.seed=2): failed, exit code 4: worker_exception" in table
    assert (sweep_dir / "curves.png").read_bytes().startswith(PNG_MAGIC)


def test_sigint_stops_every_trial_and_prints_what_finished(tmp_path):
    with sweep(tmp_path, "runner.total_env_steps=1024,1000000", "runner.checkpoint_interval=1000") as running:
        watch = ProcessWatch(running.process.pid)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and running.process.poll() is None:
            finished = "[sweep] trial-1 finished" in running.stderr_so_far()
            if finished and list((tmp_path / "runs").glob("sweep-*/trial-2-*/metrics.jsonl")):
                break
            time.sleep(0.5)
        else:  # leaving the block kills the sweep and everything it started
            pytest.fail("the sweep did not get to one finished and one training trial: " + running.stderr_so_far())
        running.process.send_signal(signal.SIGINT)
        result = running.finish(timeout=90)
    assert result.code == 130, result.stderr[-3000:]
    assert watch.left_running() == []
    err, out = result.stderr, result.stdout
    trials = json.loads((sweep_dir_of(tmp_path) / "sweep.json").read_text())["trials"]
    assert [(t["trial"], t["status"]) for t in trials] == [("trial-1", "finished"), ("trial-2", "stopped")]
    assert "[sweep] stopped by SIGINT: 1 of 2 trials had finished" in err
    assert (
        "| runner.total_env_steps=1024 | 1/1 | " in out and "- trial-2 (runner.total_env_steps=1000000): stopped" in out
    )
    # the stopped trial stopped as a `fleetrl train` does on SIGTERM: with a checkpoint
    (run_dir,) = sweep_dir_of(tmp_path).glob("trial-2-*")
    (checkpoint,) = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1:]
    said = f"stopped by SIGTERM; the newest intact checkpoint is {checkpoint}"  # the one that really exists
    assert said in (sweep_dir_of(tmp_path) / "trial-2.log").read_text()

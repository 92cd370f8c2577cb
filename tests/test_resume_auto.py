"""`runner.resume: auto`, as a cluster job script uses it: the same command line after a
preemption continues the run it had started, from its last checkpoint, in the same directory;
the first time (no run of that name yet) it starts one."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

from fleetrl.checkpoint import checkpoint_dir, list_checkpoints, load_latest
from fleetrl.cli import main
from tests.support import REPO, Fleetrl, fleetrl, read_json

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")
JOB = ["runner.resume=auto", "runner.checkpoint_interval=1", "runner.tensorboard=false", "--skip-doctor"]


def job(runs: Path, *overrides: str) -> list[str]:
    """The job script's `fleetrl` arguments: always the same, whether the run is new or preempted."""
    return ["train", CARTPOLE, f"runner.run_dir={runs}", *JOB, *overrides]


def test_a_killed_run_is_continued_from_its_checkpoint_in_the_same_directory(tmp_path):
    runs = tmp_path / "runs"
    with Fleetrl(*job(runs, "runner.total_env_steps=10000000"), cwd=tmp_path, runs=runs) as running:
        deadline = time.monotonic() + 120
        while not any(list_checkpoints(run) for run in runs.glob("*")) and time.monotonic() < deadline:
            assert running.process.poll() is None, running.stderr_so_far()[-3000:]
            time.sleep(0.2)
        running.kill()  # preempted: the whole process tree, no chance to save or report
        killed = running.finished()
    assert killed.code == -signal.SIGKILL
    run_dir = killed.run_dir
    assert list(runs.iterdir()) == [run_dir] and killed.summary is None
    saved = load_latest(run_dir)
    total = saved["global_step"] + 512  # two more iterations of 256 steps

    result = fleetrl(*job(runs, f"runner.total_env_steps={total}"), cwd=tmp_path, runs=runs, timeout=180).succeeded()
    assert list(runs.iterdir()) == [run_dir]
    assert f"resumed {run_dir} at iteration {saved['iteration']}, {saved['global_step']} env steps" in result.stderr
    assert (result.summary["iterations"], result.summary["global_step"]) == (saved["iteration"] + 2, total)
    resumed = [r for r in result.metrics if r["iteration"] > saved["iteration"]]
    assert [r["global_step"] for r in resumed][-2:] == [total - 256, total]


def test_with_no_run_of_that_name_a_new_one_starts(tmp_path):
    runs = tmp_path / "runs"
    (runs / "Pendulum-v1-20260101-000000").mkdir(parents=True)  # another config's run: not this one's
    result = fleetrl(*job(runs, "runner.total_env_steps=256"), cwd=tmp_path)  # no runs=: that folder holds two runs
    assert result.code == 0, result.stderr[-3000:]
    assert "runner.resume=auto: no run of this name" in result.stderr
    (run_dir,) = runs.glob("CartPole-v1-*")
    assert read_json(run_dir / "summary.json")["global_step"] == 256


def test_a_newest_run_without_a_complete_checkpoint_is_a_config_error_naming_it(tmp_path, capsys):
    runs = tmp_path / "runs"
    older, newest = runs / "CartPole-v1-20260101-000000", runs / "CartPole-v1-20260101-000000-1"
    checkpoint_dir(older).mkdir(parents=True)
    (checkpoint_dir(older) / "ckpt_00000003.pt").write_bytes(b"a checkpoint")
    checkpoint_dir(newest).mkdir(parents=True)
    (checkpoint_dir(newest) / ".ckpt_00000001.pt.tmp-4242").write_bytes(b"partial")
    code = main(["train", CARTPOLE, f"runner.run_dir={runs}", "runner.resume=auto", "--dry-run"])
    assert code == 2
    message = capsys.readouterr().err
    assert "config error at 'runner.resume': got 'auto'" in message
    assert f"{newest} has none" in message and f"the newest that has one is {older}" in message


def test_a_resume_does_not_need_the_folder_its_run_started_from(tmp_path):
    """`runner.init_from` is read when a run starts, never on a resume (the checkpoint holds the
    weights, and the KL's reference with `algorithm.kl_coef`): a start folder deleted since — a
    scratch disk cleaned, a run moved to another machine — must not stop the resume."""
    start = fleetrl(*job(tmp_path / "start", "runner.total_env_steps=256"), cwd=tmp_path, runs=tmp_path / "start")
    start.succeeded()
    runs = tmp_path / "runs"
    from_start = [f"runner.init_from={start.run_dir}", "algorithm.kl_coef=0.1"]
    first = fleetrl(*job(runs, *from_start, "runner.total_env_steps=512"), cwd=tmp_path, runs=runs).succeeded()
    assert f"policy weights from {start.run_dir}" in first.stderr
    shutil.rmtree(start.run_dir)

    resumed = fleetrl(*job(runs, *from_start, "runner.total_env_steps=768"), cwd=tmp_path, runs=runs).succeeded()
    assert f"resumed {first.run_dir} at iteration 2, 512 env steps" in resumed.stderr
    assert (resumed.summary["iterations"], resumed.summary["global_step"]) == (3, 768)
    assert resumed.metrics[-1]["reference_kl"] > 0  # the reference came back with the checkpoint

    fresh = fleetrl(*job(tmp_path / "fresh", *from_start, "runner.total_env_steps=256"), cwd=tmp_path)
    assert fresh.code == 2  # a new run still needs it, and says so before anything starts
    assert "config error at 'runner.init_from'" in fresh.stderr and "no such file or directory" in fresh.stderr

"""`runner.resume: auto`, as a cluster job script uses it: the same command line after a
preemption continues the run it had started, from its last checkpoint, in the same directory;
the first time (no run of that name yet) it starts one."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil

from fleetrl.checkpoint import checkpoint_dir, list_checkpoints, load_latest
from fleetrl.cli import main
from fleetrl.metrics_log import read_metrics
from tests.support import FLEETRL, REPO, subprocess_env

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")
JOB = ["runner.resume=auto", "runner.checkpoint_interval=1", "runner.tensorboard=false", "--skip-doctor"]


def job(runs: Path, *overrides: str) -> list[str]:
    """The job script's command: always the same, whether the run is new or preempted."""
    return [*FLEETRL, "train", CARTPOLE, f"runner.run_dir={runs}", *JOB, *overrides]


def test_a_killed_run_is_continued_from_its_checkpoint_in_the_same_directory(tmp_path):
    runs = tmp_path / "runs"
    process = subprocess.Popen(
        job(runs, "runner.total_env_steps=10000000"),
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(list_checkpoints(run) for run in runs.glob("*")) and time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read().decode()[-3000:]
            time.sleep(0.2)
    finally:  # preempted: the whole process tree, no chance to save or report
        children = psutil.Process(process.pid).children(recursive=True)
        for member in [psutil.Process(process.pid), *children]:
            member.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        psutil.wait_procs(children, timeout=10)
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    (run_dir,) = runs.iterdir()
    assert not (run_dir / "summary.json").exists()
    saved = load_latest(run_dir)
    total = saved["global_step"] + 512  # two more iterations of 256 steps

    result = subprocess.run(
        job(runs, f"runner.total_env_steps={total}"),
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(runs.iterdir()) == [run_dir]
    assert f"resumed {run_dir} at iteration {saved['iteration']}, {saved['global_step']} env steps" in result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["iterations"], summary["global_step"]) == (saved["iteration"] + 2, total)
    resumed = [r for r in read_metrics(run_dir) if r["iteration"] > saved["iteration"]]
    assert [r["global_step"] for r in resumed][-2:] == [total - 256, total]


def test_with_no_run_of_that_name_a_new_one_starts(tmp_path):
    runs = tmp_path / "runs"
    (runs / "Pendulum-v1-20260101-000000").mkdir(parents=True)  # another config's run: not this one's
    result = subprocess.run(
        job(runs, "runner.total_env_steps=256"), cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runner.resume=auto: no run of this name" in result.stderr
    (run_dir,) = runs.glob("CartPole-v1-*")
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == 256


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

"""Checkpoints you can trust: each has its sha256 beside it; a resume takes the newest intact one
(one warning naming each damaged file it skips), refuses with exit 2 naming every file when none
is intact, and leaves the run's config.yaml as it was until the resume has loaded. A disk that
fills during a run is the incident `disk_full` naming the file and the free bytes, reported in a
fallback folder when the run directory cannot take it."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from fleetrl.checkpoint import (
    NoIntactCheckpoint,
    checkpoint_dir,
    list_checkpoints,
    load_latest,
    save_checkpoint,
    sum_file,
)
from tests.support import REPO, Fleetrl, fill, mounted_tmpfs, read_json, train

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")
# 4 envs x 16 steps = 64 env steps an iteration; a checkpoint after each
SMALL = [
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=1",
    "runner.tensorboard=false",
    "runner.checkpoint_interval=1",
]


def state(iteration: int) -> dict:
    return {"iteration": iteration, "weights": torch.full((4,), float(iteration))}


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


# --- the sum and the fallback, in process -------------------------------------------------------


def test_each_checkpoint_has_its_sha256_and_pruning_takes_it_along(tmp_path):
    for iteration in (1, 2, 3):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=2)
    files = sorted(path.name for path in checkpoint_dir(tmp_path).iterdir())
    assert files == ["ckpt_00000002.pt", "ckpt_00000002.pt.sha256", "ckpt_00000003.pt", "ckpt_00000003.pt.sha256"]


def test_a_damaged_newest_checkpoint_falls_back_with_one_warning(tmp_path, caplog):
    for iteration in (1, 2, 3):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=3)
    first, second, third = list_checkpoints(tmp_path)
    truncate(third)
    second.write_bytes(second.read_bytes()[:-1] + b"x")  # same size, one byte flipped: only the sum sees it
    with caplog.at_level(logging.WARNING, logger="fleetrl"):
        assert load_latest(tmp_path)["iteration"] == 1
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert str(third) in warning and str(second) in warning and "does not match" in warning
    assert "using ckpt_00000001.pt" in warning


def test_a_checkpoint_without_a_sum_is_verified_by_loading(tmp_path):
    """Runs saved before checkpoints had sums still resume; a damaged one is still caught."""
    for iteration in (1, 2):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=3)
    older, newest = list_checkpoints(tmp_path)
    sum_file(older).unlink()
    sum_file(newest).unlink()
    assert load_latest(tmp_path)["iteration"] == 2
    truncate(newest)
    assert load_latest(tmp_path)["iteration"] == 1


def test_no_intact_checkpoint_names_every_file_and_why(tmp_path):
    for iteration in (1, 2):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=3)
    older, newest = list_checkpoints(tmp_path)
    truncate(newest)
    sum_file(older).unlink()
    older.write_bytes(b"not a checkpoint")
    with pytest.raises(NoIntactCheckpoint) as caught:
        load_latest(tmp_path)
    assert set(caught.value.problems) == {older, newest}
    assert "does not match" in caught.value.problems[newest]
    assert caught.value.problems[older].startswith("does not load")


# --- resume with real processes -----------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A CartPole run of 10 iterations (640 env steps) with its 3 newest checkpoints: 8, 9, 10."""
    runs = tmp_path_factory.mktemp("runs")
    result = train(CARTPOLE, *SMALL, "runner.total_env_steps=640", runs=runs).succeeded()
    assert [path.name for path in list_checkpoints(result.run_dir)][-1] == "ckpt_00000010.pt"
    return result.run_dir


def copy_run(run_dir: Path, into: Path) -> Path:
    copy = into / run_dir.name
    subprocess.run(["cp", "-a", str(run_dir), str(copy)], check=True)
    return copy


def test_resume_falls_back_past_a_truncated_newest_checkpoint(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path)
    config_before = (run_dir / "config.yaml").read_bytes()
    newest = list_checkpoints(run_dir)[-1]
    truncate(newest)
    result = train(
        CARTPOLE, *SMALL, "runner.total_env_steps=768", f"runner.resume={run_dir}", runs=tmp_path
    ).succeeded()
    warnings = [line for line in result.stderr.splitlines() if "skipping damaged checkpoint" in line]
    assert len(warnings) == 1 and str(newest) in warnings[0] and "does not match" in warnings[0], result.stderr
    assert "resumed" in result.stderr and "at iteration 9, 576 env steps" in result.stderr
    # metrics.jsonl: one record per iteration, 10 trained again from 9's state; the first run's
    # iteration 10 moved to metrics-replaced.jsonl
    assert [record["iteration"] for record in result.metrics] == [*range(1, 13)]
    assert [record["global_step"] for record in result.metrics[9:]] == [640, 704, 768]
    replaced = [json.loads(line) for line in (run_dir / "metrics-replaced.jsonl").read_text().splitlines()]
    assert [(record["iteration"], record["global_step"]) for record in replaced] == [(10, 640)]
    assert result.summary["global_step"] == 768 and result.summary["iterations"] == 12
    assert (run_dir / "config.yaml").read_bytes() == config_before
    assert "total_env_steps: 768" in (run_dir / "config-resume-1.yaml").read_text()


def test_resume_with_no_intact_checkpoint_is_exit_2_and_changes_nothing(finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path)
    before = {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file() and path.name != "train.log"}
    checkpoints = list_checkpoints(run_dir)
    for checkpoint in checkpoints:
        truncate(checkpoint)
    result = train(CARTPOLE, *SMALL, "runner.total_env_steps=768", f"runner.resume={run_dir}", runs=tmp_path)
    assert result.code == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "runner.resume" in result.stderr
    for checkpoint in checkpoints:
        assert str(checkpoint) in result.stderr
    after = {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file() and path.name != "train.log"}
    assert after == before  # config.yaml, metrics, summary untouched; no config-resume-*.yaml


# --- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A real 4 MiB tmpfs (root only), unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "small", "4m") as mount_point:
        yield mount_point


@pytest.mark.needs("root", "mounts a 4 MiB tmpfs to fill")
def test_a_disk_that_fills_during_the_run_is_disk_full(small_fs, tmp_path):
    runs = small_fs / "runs"
    # --skip-doctor: the preflight check would refuse a run directory with under 1 GiB free
    overrides = [*SMALL, "runner.total_env_steps=200000", f"runner.run_dir={runs}"]
    with Fleetrl("train", CARTPOLE, "--skip-doctor", *overrides, runs=runs) as run:
        deadline = time.monotonic() + 120
        while (
            not list(runs.glob("*/checkpoints/ckpt_*.pt"))
            and run.process.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert list(runs.glob("*/checkpoints/ckpt_*.pt")), run.stderr_so_far()[-3000:]
        fill(small_fs)
        result = run.finish(timeout=120)
    assert result.code == 4, result.stderr[-3000:]
    # whichever write met the full disk first: this iteration's metrics line or its checkpoint
    written = rf"{re.escape(str(result.run_dir))}/(metrics\.jsonl|checkpoints/ckpt_\d{{8}}\.pt)"
    summary = rf"no space left on device writing {written}: \d+ bytes free on \S+"
    found = re.search(r"it is in (\S+)\)", result.stderr)
    if found is None:
        # the failed checkpoint's partial file, removed, left room for the report in the run
        # directory itself (seen once: 124 KiB free): there, whole
        assert result.hang_report is not None, result.stderr[-3000:]
        assert result.hang_report["cause"] == "disk_full"
        assert re.fullmatch(summary, result.hang_report["summary"]), result.hang_report["summary"]
        return
    fallback = Path(found[1])
    try:
        report = read_json(fallback / "hang_report.json")
        assert report["cause"] == "disk_full"
        assert re.fullmatch(summary, report["summary"]), report["summary"]
        assert result.hang_report is None  # no half-written report left in the full run directory
        assert "disk_full" in result.stderr and str(fallback) in result.stderr
    finally:
        subprocess.run(["rm", "-rf", str(fallback)], check=True)

"""Checkpoints: atomic saves (a crash mid-save never costs the previous checkpoint), keep-last-K,
and resume: N iterations straight == N/2, then resume, then N/2 more, in every counter."""

from __future__ import annotations

import errno
import gc
import io
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fleetrl.checkpoint import checkpoint_dir, list_checkpoints, load_latest, save_checkpoint
from fleetrl.controller.loop import Trainer
from fleetrl.errors import ConfigError, UserError
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.tracking.jsonl import read_metrics
from tests.support import REPO, TIMING_METRICS, own_children, subprocess_env

CARTPOLE = str(REPO / "configs" / "ppo_cartpole.yaml")


def state(iteration: int) -> dict:
    return {"iteration": iteration, "weights": torch.full((4,), float(iteration))}


def names(run_dir: Path) -> list[str]:
    return [path.name for path in list_checkpoints(run_dir)]


# --- atomicity ----------------------------------------------------------------------------------

CRASH_SCRIPT = r"""
import os, sys, time
from pathlib import Path
import torch
from fleetrl.checkpoint import save_checkpoint

run_dir, where = Path(sys.argv[1]), sys.argv[2]
save_checkpoint(run_dir, 1, {"iteration": 1, "weights": torch.full((4,), 1.0)}, keep=3)
marker = run_dir / "saving"

def hang(stage):
    written = marker.with_name("saving.tmp")  # renamed into place: the test never reads it half-written
    written.write_text(stage)
    written.rename(marker)
    time.sleep(600)

class HangWhilePickled:
    def __reduce__(self):
        hang("pickling")

state = {"iteration": 2, "weights": torch.zeros(1 << 20)}
if where == "pickling":
    state["hang"] = HangWhilePickled()
else:  # the temporary file is fully written; hang before it is renamed into place
    os.fsync = lambda fd: hang("fsync")
save_checkpoint(run_dir, 2, state, keep=3)
print("save returned", flush=True)
"""


@pytest.mark.parametrize("where", ["pickling", "fsync"])
def test_kill_during_save_keeps_the_previous_checkpoint(tmp_path, where):
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(script), str(run_dir), where],
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        marker = run_dir / "saving"
        deadline = time.monotonic() + 120
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), f"the save never started: {process.communicate(timeout=30)}"
        assert marker.read_text() == where
        process.kill()  # SIGKILL: no cleanup code runs
    finally:
        if process.poll() is None:
            process.kill()
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL and b"save returned" not in stdout

    leftovers = [path.name for path in checkpoint_dir(run_dir).iterdir()]
    assert any(name.startswith(".ckpt_00000002.pt.tmp") for name in leftovers), leftovers
    assert names(run_dir) == ["ckpt_00000001.pt"], "a partial file was taken as a checkpoint"
    loaded = load_latest(run_dir)
    assert loaded["iteration"] == 1
    torch.testing.assert_close(loaded["weights"], torch.full((4,), 1.0))
    # the next save works and becomes the latest
    save_checkpoint(run_dir, 3, state(3), keep=3)
    assert names(run_dir) == ["ckpt_00000001.pt", "ckpt_00000003.pt"]
    assert load_latest(run_dir)["iteration"] == 3


def half_writing_save(obj, file, *args, **kwargs):
    """torch.save that runs out of disk halfway through the file."""
    buffer = io.BytesIO()
    REAL_TORCH_SAVE(obj, buffer)
    data = buffer.getvalue()
    file.write(data[: len(data) // 2])
    file.flush()
    raise OSError(errno.ENOSPC, "No space left on device")


REAL_TORCH_SAVE = torch.save


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, state(1), keep=3)
    monkeypatch.setattr(torch, "save", half_writing_save)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 2, state(2), keep=3)
    monkeypatch.undo()
    assert names(tmp_path) == ["ckpt_00000001.pt"]
    assert load_latest(tmp_path)["iteration"] == 1


def test_failed_save_leaves_no_partial_file(tmp_path, monkeypatch):
    """A save that fails (disk full) must not leave its half-written temporary behind: on a full
    disk that file holds exactly the space the next save needs."""
    save_checkpoint(tmp_path, 1, state(1), keep=3)
    monkeypatch.setattr(torch, "save", half_writing_save)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 2, state(2), keep=3)
    monkeypatch.undo()
    assert sorted(path.name for path in checkpoint_dir(tmp_path).iterdir()) == [
        "ckpt_00000001.pt",
        "ckpt_00000001.pt.sha256",
    ]


# --- keep-last-K --------------------------------------------------------------------------------


def test_keep_last_k(tmp_path):
    for iteration in range(1, 7):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=3)
        assert len(names(tmp_path)) == min(iteration, 3)
    assert names(tmp_path) == ["ckpt_00000004.pt", "ckpt_00000005.pt", "ckpt_00000006.pt"]
    assert load_latest(tmp_path)["iteration"] == 6
    save_checkpoint(tmp_path, 7, state(7), keep=1)
    assert names(tmp_path) == ["ckpt_00000007.pt"]


def test_latest_is_the_highest_iteration_and_other_files_are_left_alone(tmp_path):
    folder = checkpoint_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    (folder / ".ckpt_00000500.pt.tmp-1234").write_bytes(b"partial")
    (folder / "ckpt_00000600.pt.bak").write_bytes(b"not a checkpoint")
    for iteration in (9, 10, 100):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=2)
    assert names(tmp_path) == ["ckpt_00000010.pt", "ckpt_00000100.pt"]
    assert load_latest(tmp_path)["iteration"] == 100
    assert (folder / "notes.txt").read_text() == "mine"


def test_saving_the_same_iteration_twice_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 5, state(5), keep=3)
    save_checkpoint(tmp_path, 5, {"iteration": 5, "weights": torch.zeros(4)}, keep=3)
    assert names(tmp_path) == ["ckpt_00000005.pt"]
    torch.testing.assert_close(load_latest(tmp_path)["weights"], torch.zeros(4))


def test_no_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no checkpoint"):
        load_latest(tmp_path)


# --- resume -------------------------------------------------------------------------------------

STEPS_PER_ITERATION = 64  # 4 envs x 16 steps
ITERATIONS = 8
SMALL = [
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=2",
    "runner.tensorboard=false",
    "runner.checkpoint_interval=3",
    "runner.keep_checkpoints=2",
    "runner.seed=3",
]


def run(tmp_path: Path, name: str, total: int, *extra: str) -> dict:
    config = load_config(
        CARTPOLE,
        [*SMALL, f"runner.total_env_steps={total}", f"runner.run_dir={tmp_path}", f"runner.name={name}", *extra],
    )
    return Trainer(resolve(config), live_progress=False).train()


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_resume_continues_exactly_where_the_run_stopped(tmp_path):
    total = ITERATIONS * STEPS_PER_ITERATION
    straight = run(tmp_path, "straight", total)
    first = run(tmp_path, "split", total // 2)
    run_dir = Path(first["run_dir"])
    assert (first["iterations"], first["global_step"]) == (ITERATIONS // 2, total // 2)
    # the final checkpoint of the first half is the one resumed from
    assert load_latest(run_dir)["iteration"] == ITERATIONS // 2

    resumed = run(tmp_path, "ignored", total, f"runner.resume={run_dir}")
    assert resumed["run_dir"] == str(run_dir)
    for key in ("iterations", "global_step"):
        assert resumed[key] == straight[key], key
    assert (resumed["iterations"], resumed["global_step"]) == (ITERATIONS, total)

    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1)), "not appended"
    assert [r["global_step"] for r in records] == [STEPS_PER_ITERATION * i for i in range(1, ITERATIONS + 1)]
    episodes = [r["episodes"] for r in records]
    assert episodes == sorted(episodes) and resumed["episodes"] == episodes[-1]
    straight_records = read_metrics(Path(straight["run_dir"]))
    # after the resume the LR schedule is where the straight run's is (lr linear to 0 over total)
    for mine, theirs in zip(records[ITERATIONS // 2 :], straight_records[ITERATIONS // 2 :]):
        assert mine["lr"] == pytest.approx(theirs["lr"], rel=1e-9), mine["iteration"]
        assert mine["clip_coef"] == pytest.approx(theirs["clip_coef"], rel=1e-9)
    base_lr = load_config(CARTPOLE).algorithm.lr
    assert records[-1]["lr"] == pytest.approx(base_lr * (1 - (total - STEPS_PER_ITERATION) / total))
    # keep-last-K in a real run: checkpoints every 3 iterations (3, 6) and at the end (8), keep 2
    assert names(run_dir) == ["ckpt_00000006.pt", "ckpt_00000008.pt"]
    assert names(Path(straight["run_dir"])) == ["ckpt_00000006.pt", "ckpt_00000008.pt"]


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_resuming_with_a_total_already_reached_says_so_and_trains_nothing(tmp_path):
    """A resume re-applies its config's runner.total_env_steps (a config file's, not the one the
    run was extended to): below the steps taken, the run has nothing to do, and says so."""
    first = run(tmp_path, "done", 4 * STEPS_PER_ITERATION)
    run_dir = Path(first["run_dir"])
    again = run(tmp_path, "ignored", 2 * STEPS_PER_ITERATION, f"runner.resume={run_dir}")
    assert (again["iterations"], again["global_step"]) == (4, 4 * STEPS_PER_ITERATION)
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2, 3, 4]
    assert (
        "the resumed run has taken 256 env steps and runner.total_env_steps is 128: nothing left to train "
        "(raise runner.total_env_steps to train it further)"
    ) in (run_dir / "train.log").read_text()


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_a_run_stopped_and_resumed_is_the_uninterrupted_run_bit_for_bit(tmp_path):
    """Stopped after 4 of 8 iterations and resumed, a run is the uninterrupted one: every number of
    every iteration (losses, KL, entropy, returns, counters; timings aside) and the final weights
    are equal, bit for bit. The simulator, which no checkpoint can hold, is reset on resume: the
    env's episodes end on the iteration boundary (MetronomeEnv), where that reset is the state it
    would be in anyway. The schedule is flat so the first half's 4 iterations are the same as the
    whole run's first 4 (an annealed one would anneal over the half's total); the test above
    checks that an annealed schedule carries on."""
    total = ITERATIONS * STEPS_PER_ITERATION
    flat = ["env.id=tests.envs:MetronomeEnv", "env.kwargs={length: 16}", "algorithm.anneal_lr=false"]
    flat.append("algorithm.anneal_clip=false")
    straight = run(tmp_path, "straight", total, *flat)
    half = run(tmp_path, "split", total // 2, *flat)
    run(tmp_path, "ignored", total, *flat, f"runner.resume={half['run_dir']}")

    def untimed(run_dir: str) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in TIMING_METRICS} for r in read_metrics(Path(run_dir))]

    resumed, uninterrupted = untimed(half["run_dir"]), untimed(straight["run_dir"])
    assert [r["iteration"] for r in resumed] == list(range(1, ITERATIONS + 1))
    assert {"policy_loss", "value_loss", "approx_kl", "entropy"} <= resumed[-1].keys()
    assert resumed == uninterrupted
    mine = load_latest(Path(half["run_dir"]))["actor"]
    theirs = load_latest(Path(straight["run_dir"]))["actor"]
    for part in ("policy", "optimizer"):
        assert mine[part].keys() == theirs[part].keys()
    for key in mine["policy"]:
        torch.testing.assert_close(mine["policy"][key], theirs["policy"][key], rtol=0, atol=0, msg=key)
    for index, state in theirs["optimizer"]["state"].items():
        for name, tensor in state.items():
            torch.testing.assert_close(mine["optimizer"]["state"][index][name], tensor, rtol=0, atol=0)


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_resume_restores_the_trained_state(tmp_path):
    first = run(tmp_path, "a", 2 * STEPS_PER_ITERATION, "env.normalize_obs=true")
    run_dir = Path(first["run_dir"])
    saved = load_latest(run_dir)
    config = load_config(
        CARTPOLE,
        [
            *SMALL,
            f"runner.total_env_steps={4 * STEPS_PER_ITERATION}",
            "env.normalize_obs=true",
            f"runner.resume={run_dir}",
        ],
    )
    trainer = Trainer(resolve(config), live_progress=False)
    try:
        restored = trainer.state.state_dict(trainer.backend)
    finally:
        trainer.backend.shutdown()
    assert restored["iteration"] == saved["iteration"] == 2
    assert restored["global_step"] == saved["global_step"] == 2 * STEPS_PER_ITERATION
    assert restored["recent_returns"] == saved["recent_returns"]
    for key, tensor in saved["actor"]["policy"].items():
        torch.testing.assert_close(restored["actor"]["policy"][key], tensor, rtol=0, atol=0, msg=key)
    saved_opt, restored_opt = saved["actor"]["optimizer"]["state"], restored["actor"]["optimizer"]["state"]
    assert saved_opt.keys() == restored_opt.keys() and saved_opt
    for index in saved_opt:
        torch.testing.assert_close(restored_opt[index]["exp_avg"], saved_opt[index]["exp_avg"])
    (saved_env,), (restored_env,) = saved["env"], restored["env"]
    assert saved_env["obs_norm"]["count"] > 1
    assert restored_env["obs_norm"]["count"] == saved_env["obs_norm"]["count"]
    torch.testing.assert_close(
        torch.as_tensor(restored_env["obs_norm"]["mean"]), torch.as_tensor(saved_env["obs_norm"]["mean"])
    )


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_resume_without_a_complete_checkpoint_is_a_config_error(tmp_path):
    """A run that crashed during its first save holds only a partial temporary: resuming it is
    refused when the config is read, before anything starts."""
    empty_run = tmp_path / "empty_run"
    checkpoint_dir(empty_run).mkdir(parents=True)
    (checkpoint_dir(empty_run) / ".ckpt_00000001.pt.tmp-4242").write_bytes(b"partial")
    with pytest.raises(ConfigError, match="complete checkpoint") as caught:
        load_config(CARTPOLE, [*SMALL, f"runner.resume={empty_run}"])
    assert caught.value.key == "runner.resume"


def test_failed_resume_leaves_no_process_behind(tmp_path):
    """If the checkpoint vanishes between the config check and the start (another process
    pruned it), the trainer fails before starting any simulator (async: one subprocess per
    env) rather than leaving them running."""
    runs = tmp_path / "runs"
    three_iterations = "runner.total_env_steps=192"  # 4 envs x 16 steps each: a checkpoint at the third
    Trainer(
        resolve(load_config(CARTPOLE, [*SMALL, three_iterations, f"runner.run_dir={runs}"])), live_progress=False
    ).train()
    (run_dir,) = runs.iterdir()
    assert list_checkpoints(run_dir)
    config = load_config(CARTPOLE, [*SMALL, "env.vectorization=async", f"runner.resume={run_dir}"])
    for checkpoint in list_checkpoints(run_dir):
        checkpoint.unlink()
    with pytest.raises(UserError, match="no checkpoint") as caught:
        Trainer(resolve(config), live_progress=False)
    # While the caller still holds the error (its traceback references the half-built trainer,
    # so garbage collection has not closed anything), no simulator may be running.
    try:
        alive = own_children()
        assert alive == [], f"{len(alive)} env processes still running after the failed start"
    finally:
        del caught  # lets garbage collection close whatever the trainer left open
        gc.collect()

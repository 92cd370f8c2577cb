"""Checkpoint integrity (fleetrl/checkpoint.py), rule by rule, in process and exact: the sum of
every checkpoint and of every shard of a sharded one, what a damaged shard, sum or file makes of
the checkpoint, the newest intact one, pruning, a full disk named as such, and `runner.init_from`'s
weights with its errors. Real files, real `torch.save`; the mutation run's tests for the module
(benchmarks/diagnosis/mutation.sh), beside tests/test_checkpoint.py's and
tests/test_checkpoint_trust.py's in-process ones."""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os

import numpy as np
import pytest
import torch

from fleetrl.checkpoint import (
    NoIntactCheckpoint,
    causes,
    check_sum,
    checkpoint_dir,
    full_disk,
    initial_weights,
    list_checkpoints,
    load_latest,
    newest_intact,
    non_finite_entry,
    save_checkpoint,
    sha256,
    shards_dir,
    staging_dir,
    sum_file,
    verified_load,
)
from fleetrl.errors import ConfigError, UserError
from fleetrl.non_finite import NonFiniteError
from tests.support import REPO, train


def state(iteration: int, **more) -> dict:
    return {"iteration": iteration, "actor": {"policy": {"w": torch.full((3,), float(iteration))}}, **more}


def staged(run_dir, iteration: int, files: dict[str, bytes]):
    """A staging folder holding shard files, as the actor ranks leave it."""
    folder = staging_dir(run_dir, iteration)
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_the_staging_folder_is_hidden_beside_the_checkpoints_and_named_by_iteration_and_process(tmp_path):
    folder = staging_dir(tmp_path / "new-run", 7)  # a run directory not made yet: its folders are
    assert folder.parent == checkpoint_dir(tmp_path / "new-run") and folder.parent.is_dir()
    folder = staging_dir(tmp_path, 7)
    assert folder.name == f".ckpt_00000007.dcp.tmp-{os.getpid()}"
    assert list_checkpoints(tmp_path) == []


def test_a_sharded_checkpoint_records_each_shard_s_sum_and_moves_them_beside_its_file(tmp_path):
    shards = staged(tmp_path, 3, {"b.distcp": b"bbb", "a.distcp": b"a"})
    final = save_checkpoint(tmp_path, 3, state(3), keep=2, shards=shards)
    assert final == checkpoint_dir(tmp_path) / "ckpt_00000003.pt" and not shards.exists()
    assert sorted(os.listdir(shards_dir(final))) == ["a.distcp", "b.distcp"]
    assert sum_file(final).read_text() == f"{sha256(final)}  ckpt_00000003.pt\n"
    loaded = verified_load(final)
    assert list(loaded["shards"]) == ["a.distcp", "b.distcp"]  # sorted
    assert loaded["shards"]["b.distcp"] == sha256(shards_dir(final) / "b.distcp")
    assert loaded["shards_path"] == str(shards_dir(final))
    # saved again (a resumed run's older attempt at the same iteration): the new shards replace the old
    again = save_checkpoint(tmp_path, 3, state(3), keep=2, shards=staged(tmp_path, 3, {"c.distcp": b"c"}))
    assert again == final and os.listdir(shards_dir(final)) == ["c.distcp"]
    assert list(verified_load(final)["shards"]) == ["c.distcp"]


def test_a_damaged_or_missing_shard_damages_its_checkpoint_and_the_one_before_is_used(tmp_path):
    for iteration in (1, 2):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=3, shards=staged(tmp_path, iteration, {"s": b"x"}))
    older, newest = list_checkpoints(tmp_path)
    (shards_dir(newest) / "s").write_bytes(b"y")
    got, recorded = hashlib.sha256(b"y").hexdigest()[:12], hashlib.sha256(b"x").hexdigest()[:12]
    with pytest.raises(ValueError) as damaged:
        verified_load(newest)
    assert str(damaged.value) == (
        f"its shard {shards_dir(newest) / 's'}: sha256 {got}… does not match the recorded {recorded}…"
    )
    assert load_latest(tmp_path)["iteration"] == 1
    (shards_dir(older) / "s").unlink()
    with pytest.raises(NoIntactCheckpoint) as caught:
        load_latest(tmp_path)
    assert caught.value.problems[older] == f"its shard {shards_dir(older) / 's'} is missing"
    assert str(caught.value) == (
        f"no intact checkpoint in {checkpoint_dir(tmp_path)}: {newest}: {caught.value.problems[newest]}; "
        f"{older}: its shard {shards_dir(older) / 's'} is missing"
    )


def test_pruning_keeps_the_newest_and_takes_each_older_one_s_sum_and_shards_along(tmp_path):
    for iteration in (1, 2, 3):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=2, shards=staged(tmp_path, iteration, {"s": b"x"}))
    assert sorted(os.listdir(checkpoint_dir(tmp_path))) == [
        "ckpt_00000002.dcp",
        "ckpt_00000002.pt",
        "ckpt_00000002.pt.sha256",
        "ckpt_00000003.dcp",
        "ckpt_00000003.pt",
        "ckpt_00000003.pt.sha256",
    ]
    save_checkpoint(tmp_path, 4, state(4), keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_00000004.pt"]


def test_a_sum_that_differs_names_both_digests_and_the_size_and_an_empty_sum_file_says_so(tmp_path):
    final = save_checkpoint(tmp_path, 1, state(1), keep=1)
    check_sum(final)  # intact
    sum_file(final).write_text("0123456789abcdef  ckpt_00000001.pt\n")
    with pytest.raises(ValueError) as caught:
        check_sum(final)
    got = sha256(final)
    assert str(caught.value) == (
        f"sha256 {got[:12]}… of its {final.stat().st_size} bytes does not match ckpt_00000001.pt.sha256 (0123456789ab…)"
    )
    sum_file(final).write_text("")
    with pytest.raises(ValueError, match=r"\(\(empty sum f…\)$"):  # the sum shown as 12 characters
        check_sum(final)
    assert newest_intact(tmp_path) is None


def test_the_newest_intact_checkpoint_is_found_by_its_sum_alone(tmp_path):
    assert newest_intact(tmp_path) is None
    for iteration in (1, 2, 3):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=3)
    first, second, third = list_checkpoints(tmp_path)
    assert newest_intact(tmp_path) == third
    third.write_bytes(third.read_bytes()[:-1])
    assert newest_intact(tmp_path) == second
    sum_file(second).unlink()  # no sum: nothing to hold it against, taken as it is
    assert newest_intact(tmp_path) == second


def test_a_file_that_is_not_a_checkpoint_does_not_load_naming_why(tmp_path):
    final = save_checkpoint(tmp_path, 1, state(1), keep=1)
    sum_file(final).unlink()
    final.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"^does not load: UnpicklingError: invalid load key, 'n'\.$"):
        verified_load(final)


def test_a_full_disk_is_found_in_the_error_or_any_it_came_from(tmp_path):
    disk = OSError(errno.ENOSPC, "No space left on device")
    assert full_disk(disk) and not full_disk(OSError(errno.EACCES, "denied")) and not full_disk(None)
    try:
        try:
            raise disk
        except OSError as inner:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0") from inner
    except RuntimeError as wrapped:
        assert causes(wrapped) == [wrapped, disk] and full_disk(wrapped)
    assert full_disk(RuntimeError("[Errno 28] No space left on device"))
    chain = ValueError("0")
    for depth in range(1, 15):
        error = ValueError(str(depth))
        error.__context__ = chain
        chain = error
    assert len(causes(chain)) == 10 and str(causes(chain)[-1]) == "5"


def test_a_save_that_fails_on_a_full_disk_names_the_checkpoint_and_leaves_no_file(tmp_path, monkeypatch):
    shards = staged(tmp_path, 2, {"s": b"x"})

    def no_space(*args, **kwargs):
        raise RuntimeError("write failed") from OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(OSError) as caught:
        save_checkpoint(tmp_path, 2, state(2), keep=2, shards=shards)
    final = checkpoint_dir(tmp_path) / "ckpt_00000002.pt"
    assert str(caught.value) == f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}: '{final}'"  # what the user reads
    assert sorted(os.listdir(checkpoint_dir(tmp_path))) == ["ckpt_00000002.dcp"]  # the shards moved, no .pt
    assert list_checkpoints(tmp_path) == []


def test_init_from_takes_a_run_s_newest_intact_policy_or_one_file_s(tmp_path):
    for iteration in (1, 2):
        save_checkpoint(tmp_path, iteration, state(iteration), keep=2)
    first, second = list_checkpoints(tmp_path)
    assert initial_weights(str(tmp_path))["w"].tolist() == [2.0, 2.0, 2.0]
    assert initial_weights(str(first))["w"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("missing", "no such file or directory"),
        ("empty run", "no checkpoint in"),
        ("damaged file", "does not match"),
        ("no policy", "it holds no actor policy weights"),
        ("no actor", "it holds no actor policy weights"),
        ("not a mapping", "it holds no actor policy weights"),
    ],
)
def test_init_from_names_the_key_the_path_and_what_is_wrong(tmp_path, source, why):
    path = tmp_path / source
    if source == "empty run":
        path.mkdir()
    elif source == "damaged file":
        final = save_checkpoint(tmp_path, 1, state(1), keep=1)
        final.write_bytes(final.read_bytes()[:-1])
        path = final
    elif source in ("no policy", "no actor"):
        path = save_checkpoint(tmp_path, 1, {"iteration": 1, "actor": {}} if source == "no policy" else {}, keep=1)
    elif source == "not a mapping":  # a file of torch.save's that is not a checkpoint's state
        path = tmp_path / "ckpt_00000001.pt"
        torch.save([1.0, 2.0], path)
    with pytest.raises(ConfigError) as caught:
        initial_weights(str(path))
    valid = "a fleetrl run directory holding an intact checkpoint, or a checkpoint file (ckpt_*.pt)"
    start = f"config error at 'runner.init_from': got {str(path)!r}; expected {valid}. "
    message = str(caught.value)
    assert caught.value.key == "runner.init_from" and message.startswith(start), message
    assert why in message.removeprefix(start) if source in ("empty run", "damaged file") else message == start + why
    assert isinstance(caught.value, UserError)


def test_init_from_weights_of_another_model_stop_the_run_with_exit_2_naming_the_keys(tmp_path):
    """The weights load in the actor workers; their refusal reaches the user as a config error (exit
    2, the keys that differ named, no traceback), not as a dead controller."""
    other = {"other.weight": torch.zeros(1)}
    source = save_checkpoint(tmp_path / "other", 1, {"iteration": 1, "actor": {"policy": other}}, keep=1)
    run = train(
        REPO / "configs/ppo_cartpole.yaml", f"runner.init_from={source}", "--skip-doctor", runs=tmp_path / "runs"
    )
    assert run.code == 2, run.stderr[-3000:]
    said = f"fleetrl: config error at 'runner.init_from': got {str(source)!r}; expected a checkpoint of this run's"
    assert said in run.stderr and "and 1 unexpected (other.weight) keys" in run.stderr, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and run.hang_report is None


def test_the_first_non_finite_value_of_a_state_is_named_by_its_dotted_key():
    """Dicts, lists and tuples walked in order; float tensors, arrays and floats checked; integer
    tensors and other values never non-finite. What a checkpoint that would hold a NaN names."""
    policy = {"steps": torch.tensor([1, 2]), "w": torch.tensor([1.0, math.inf, math.nan])}
    moments = (np.array([0.0, 1.0]), np.array([[0.0, -math.inf]]))
    state = {
        "iteration": 3,
        "name": "run",
        "actor": {"policy": policy},
        "optim": [{"lr": 0.1}, moments],
        "loss": math.nan,
    }
    assert non_finite_entry(state) == ("actor.policy.w", math.inf)
    policy["w"] = torch.tensor([1.0, 2.0])
    assert non_finite_entry(state) == ("optim.1.1", -math.inf)
    state["optim"] = [{"lr": 0.1}, (np.array([0.0]), np.array([[1.0]]))]
    key, value = non_finite_entry(state)
    assert key == "loss" and math.isnan(value)
    state["loss"] = 0.5
    assert non_finite_entry(state) is None
    assert non_finite_entry([torch.tensor([0.0]), torch.tensor([-math.inf])]) == ("1", -math.inf)


def test_a_state_holding_a_non_finite_value_is_never_written_and_a_checkpoint_holding_one_is_passed_over(
    tmp_path, caplog
):
    """A save of a state with an infinity raises NonFiniteError naming its key and writes nothing
    (its staged shards are dropped, also when already gone); checkpoints written with a NaN before
    saves were checked are passed over, each named, for the newest finite one; pruning drops them
    though they have no sum file."""
    run_dir = tmp_path / "runs" / "run-1"  # not made yet: its folders are
    assert save_checkpoint(run_dir, 4, state(4), keep=5) == run_dir / "checkpoints" / "ckpt_00000004.pt"
    infinite = {"iteration": 8, "actor": {"policy": {"w": torch.tensor([1.0, math.inf])}}}
    shards = staged(run_dir, 8, {"shard-0": b"x"})
    for staged_shards in (shards, shards):  # the second time, already gone
        with pytest.raises(NonFiniteError) as refused:
            save_checkpoint(run_dir, 8, infinite, keep=5, shards=staged_shards)
        assert str(refused.value) == (
            "non-finite checkpoint state: actor.policy.w is inf (checkpoint ckpt_00000008.pt was not written)"
        )
        assert (refused.value.what, refused.value.key, refused.value.value) == (
            "checkpoint state",
            "actor.policy.w",
            math.inf,
        )
        assert not shards.exists()
    assert sorted(p.name for p in checkpoint_dir(run_dir).iterdir()) == ["ckpt_00000004.pt", "ckpt_00000004.pt.sha256"]
    for iteration in (12, 16):  # as an older fleetrl wrote them: no check, no sum file
        torch.save(state(iteration, loss=math.nan), checkpoint_dir(run_dir) / f"ckpt_{iteration:08d}.pt")
    with caplog.at_level(logging.WARNING, logger="fleetrl"):
        assert load_latest(run_dir)["iteration"] == 4
    newer = [checkpoint_dir(run_dir) / f"ckpt_{iteration:08d}.pt" for iteration in (16, 12)]
    assert [r.getMessage() for r in caplog.records if r.name == "fleetrl"] == [
        "skipping damaged checkpoint(s), using ckpt_00000004.pt instead. "
        + "; ".join(f"{path}: it holds a non-finite value: loss is nan" for path in newer)
    ]
    for iteration in (20, 24):
        save_checkpoint(run_dir, iteration, state(iteration), keep=2)
    assert [p.name for p in list_checkpoints(run_dir)] == ["ckpt_00000020.pt", "ckpt_00000024.pt"]

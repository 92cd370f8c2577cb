"""Sharded checkpoints (`actor.checkpoint_format: sharded`) are checkpoints you can trust too:
the .pt records every shard's sha256, a damaged or missing shard makes its checkpoint damaged
(the newest intact one is taken, with one warning naming the shard), pruning takes the shards
along, and a run resumes from them and `fleetrl eval` reads them."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from fleetrl.checkpoint import checkpoint_dir, load_latest, save_checkpoint, shards_dir, staging_dir
from fleetrl.controller.loop import Trainer
from fleetrl.evaluate import evaluate
from fleetrl.parallel import dcp
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve


def sharded(run_dir, iteration: int, keep: int = 3):
    module = nn.Linear(3, 2)
    nn.init.constant_(module.weight, float(iteration))
    shards = staging_dir(run_dir, iteration)
    dcp.save(shards, module, None)
    return save_checkpoint(run_dir, iteration, {"iteration": iteration}, keep, shards)


def test_a_damaged_shard_falls_back_to_the_newest_intact_checkpoint(tmp_path, caplog):
    for iteration in (1, 2, 3):
        sharded(tmp_path, iteration)
    third = checkpoint_dir(tmp_path) / "ckpt_00000003.pt"
    state = load_latest(tmp_path)
    assert state["iteration"] == 3 and set(state["shards"]) == {".metadata", "__0_0.distcp"}
    module = nn.Linear(3, 2)
    dcp.load_model_weights(shards_dir(third), module)
    assert torch.equal(module.weight, torch.full((2, 3), 3.0))
    shard = shards_dir(third) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-1] + b"x")  # one byte changed: only the sum sees it
    (shards_dir(checkpoint_dir(tmp_path) / "ckpt_00000002.pt") / ".metadata").unlink()
    with caplog.at_level(logging.WARNING, logger="fleetrl"):
        assert load_latest(tmp_path)["iteration"] == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"its shard {shard}: sha256" in warning and "ckpt_00000002.dcp/.metadata is missing" in warning


def test_pruning_takes_the_shards_along(tmp_path):
    for iteration in (1, 2, 3):
        sharded(tmp_path, iteration, keep=2)
    names = sorted(path.name for path in checkpoint_dir(tmp_path).iterdir())
    assert names == [f"ckpt_0000000{i}{suffix}" for i in (2, 3) for suffix in (".dcp", ".pt", ".pt.sha256")]


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_a_run_resumes_from_its_sharded_checkpoint_and_evaluates(tmp_path):
    base = [
        "runner.tensorboard=false",
        f"runner.run_dir={tmp_path}",
        "env.num_envs=4",
        "algorithm.num_steps=16",
        "algorithm.minibatch_size=32",
        "actor.checkpoint_format=sharded",
    ]
    first = Trainer(resolve(load_config(None, [*base, "runner.total_env_steps=128"])), live_progress=False).train()
    assert "shards" in load_latest(first["run_dir"])
    resumed = Trainer(
        resolve(load_config(None, [*base, "runner.total_env_steps=192", f"runner.resume={first['run_dir']}"])),
        live_progress=False,
    ).train()
    assert (resumed["iterations"], resumed["global_step"]) == (3, 192)
    assert evaluate(first["run_dir"], episodes=2)["episodes"] == 2


def test_a_parameter_that_never_had_a_gradient_has_no_optimizer_state_to_load(tmp_path):
    """A model's unused head (a VLA's pooling head under LoRA) gets no Adam state: the checkpoint
    lacks it, and loading keeps the fresh state the loader initialises for it."""
    used, unused = nn.Linear(3, 2), nn.Linear(3, 2)
    model = nn.ModuleDict({"used": used, "unused": unused})
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    used(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    dcp.save(tmp_path / "shards", model, optimizer)
    fresh = nn.ModuleDict({"used": nn.Linear(3, 2), "unused": nn.Linear(3, 2)})
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.1)
    dcp.load(tmp_path / "shards", fresh, fresh_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert torch.equal(fresh_optimizer.state[fresh["used"].weight]["exp_avg"], optimizer.state[used.weight]["exp_avg"])

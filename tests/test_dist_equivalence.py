"""Real multi-process actor training (2 ranks, Gloo on 127.0.0.1) equals one process.

For each scenario of `tests.dist_support` the two ranks train on their env-column shards of the
same trajectories; the single-process reference trains on the whole. After two iterations the
full parameters and optimizer state, the policy weights the rollout workers would get, and every
metric must equal the reference (float reordering aside), on every rank. The DDP and FSDP
scenarios each share one spawned process group (spawning costs seconds; training each scenario
tens of milliseconds).
"""

from __future__ import annotations

import math

import pytest
import torch

from fleetrl.errors import ConfigError
from fleetrl.plan.load import load_config
from fleetrl.plan.rules import check_actor_layout
from tests import dist_support
from tests.compare import assert_close_state, max_difference
from tests.dist_support import PROGRESS, RESUME, train_reference
from tests.ranks import each_scenario, spawn_ranks
from tests.support import LOADED_HOST_MARGIN_S

WORLD = 2
DDP = ["ddp", "ddp_target_kl", "ddp_accumulation", "ddp_continuous", "ddp_checkpointing", "ddp_kl_to_reference"]
FSDP = [
    "fsdp",
    "fsdp_target_kl_accumulation",
    "fsdp_no_shard",
    "fsdp_hybrid_shard",
    "fsdp_continuous_resume",
    "fsdp_bf16",
    "fsdp_bf16_reduce",
    "fsdp_cpu_offload",
    "fsdp_checkpointing",
]
EXACT = 1e-5  # float32, only the summation order differs
BF16 = 0.03  # bfloat16 compute: ~3 significant digits per operation


@pytest.fixture(scope="module")
def ddp_runs():
    return spawn_ranks(each_scenario, dist_support.train_rank, DDP, world=WORLD, timeout_s=300)


@pytest.fixture(scope="module")
def fsdp_runs():
    return spawn_ranks(each_scenario, dist_support.train_rank, FSDP, world=WORLD, timeout_s=300)


@pytest.fixture(scope="module")
def references():
    torch.set_num_threads(1)
    return {name: train_reference(name) for name in DDP + FSDP}


def assert_close_ppo_metrics(actual: dict, expected: dict, rtol: float) -> None:
    assert actual.keys() == expected.keys()
    for key in ("grad_steps", "epochs", "lr", "clip_coef"):
        assert actual[key] == expected[key], key
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "explained_variance", "reference_kl"):
        if key not in expected:
            continue
        assert math.isclose(actual[key], expected[key], rel_tol=rtol, abs_tol=rtol * 1e-2), (
            key,
            actual[key],
            expected[key],
        )
    # a share of B = 128 samples: at most one sample on the clipping edge may flip
    assert abs(actual["clip_fraction"] - expected["clip_fraction"]) <= (1 / 128 if rtol > EXACT else 1e-7)


def check_scenario(runs: list[dict], reference: dict, name: str, atol: float) -> None:
    ranks = [run[name] for run in runs]
    expected_metrics = reference["metrics"][1:] if name in RESUME else reference["metrics"]
    for rank, result in enumerate(ranks):
        # metrics are global: identical on every rank, and equal to the single process's
        assert result["metrics"] == ranks[0]["metrics"], f"rank {rank} reports other metrics"
        for actual, expected in zip(result["metrics"], expected_metrics, strict=True):
            assert_close_ppo_metrics(actual, expected, rtol=1e-4 if atol <= EXACT else 0.05)
        assert result["replicas"] == {}
    # identical initialisation: what every rank holds after init_distributed is the reference's
    assert max_difference(ranks[0]["initial"], reference["initial"]) == 0
    assert_close_state(ranks[0]["state"], reference["state"], atol)
    assert max_difference(ranks[0]["weights"], reference["weights"]) <= atol


@pytest.mark.parametrize("name", DDP)
def test_ddp_two_ranks_equal_one_process(ddp_runs, references, name):
    check_scenario(ddp_runs, references[name], name, EXACT)
    rank0, rank1 = ddp_runs[0][name], ddp_runs[1][name]
    # DDP replicas: each rank holds the full model, bitwise equal to rank 0's
    assert max_difference(rank1["initial"], rank0["initial"]) == 0
    assert max_difference(rank1["local"], rank0["local"]) == 0
    assert max_difference(rank1["weights"], rank0["weights"]) == 0
    if name == "ddp_kl_to_reference":  # the penalty is there, and every rank kept the weights it started from
        assert all(m["reference_kl"] > 0 for m in rank0["metrics"])
        assert max_difference(rank1["state"]["reference"], rank0["state"]["reference"]) == 0
        assert max_difference(rank0["state"]["reference"], references[name]["initial"]) == 0


def test_target_kl_stops_every_rank_at_the_same_epoch(ddp_runs, fsdp_runs, references):
    for runs, name in ((ddp_runs, "ddp_target_kl"), (fsdp_runs, "fsdp_target_kl_accumulation")):
        epochs = [[m["epochs"] for m in run[name]["metrics"]] for run in runs]
        assert epochs[0] == epochs[1] == [m["epochs"] for m in references[name]["metrics"]]
        # it triggers, and not only after the first epoch (the ranks go on together, then stop)
        assert all(e < 8 for e in epochs[0]) and max(epochs[0]) >= 2, f"{name}: epochs {epochs[0]}"


@pytest.mark.parametrize("name", [n for n in FSDP if "bf16" not in n])
def test_fsdp_two_ranks_equal_one_process(fsdp_runs, references, name):
    check_scenario(fsdp_runs, references[name], name, EXACT)
    # the full state is gathered on rank 0; the other ranks get nothing to send
    assert fsdp_runs[1][name]["weights"] == {}
    assert fsdp_runs[1][name]["state"]["policy"] == {} and fsdp_runs[1][name]["state"]["optimizer"] == {}


@pytest.mark.parametrize("name", ["fsdp_bf16", "fsdp_bf16_reduce"])
def test_fsdp_bfloat16_stays_close_to_one_process(fsdp_runs, references, name):
    check_scenario(fsdp_runs, references[name], name, BF16)
    # and it really computed in bfloat16: not bitwise the float32 result
    assert max_difference(fsdp_runs[0][name]["weights"], references[name]["weights"]) > 0


def test_gradient_accumulation_equals_no_accumulation(references):
    """One process: micro-batches of 4 give the plain update's parameters (the 2-rank version
    of this is the ddp_accumulation / fsdp_target_kl_accumulation scenarios)."""
    plain = references["ddp"]
    config = dist_support.config_for("ddp")
    config.actor.micro_batch_size = 4
    worker = dist_support.ActorWorker(config, *dist_support.spaces("ddp"))
    assert worker.loss_path is not None  # the accumulating driver, not the plain one
    for iteration, progress in enumerate(PROGRESS):
        metrics = worker.train(dist_support.make_trajectory(config, "ddp", iteration), progress)
        assert_close_ppo_metrics(metrics, plain["metrics"][iteration], rtol=1e-4)
    assert max_difference(worker.policy_weights(), plain["weights"]) <= EXACT


def test_joining_fails_after_the_configured_timeout_not_30_minutes():
    """actor.dist_timeout_s (3 s) ends the join: not before it, and within it plus a loaded host's
    margin (Gloo's own default would be 30 minutes; spawn_ranks' timeout ends the test otherwise)."""
    (result,) = spawn_ranks(dist_support.lonely_rank, 3.0, world=1, join=False, timeout_s=60)
    assert result["outcome"].startswith("JoinError") and "actor.dist_timeout_s" in result["outcome"]
    assert 2.5 <= result["seconds"] <= 3.0 + LOADED_HOST_MARGIN_S, result


BAD_ACTOR_CONFIGS = {
    # id: (overrides, key the error names, fragment of what is valid)
    "unknown strategy": (["actor.strategy=zero3"], "actor.strategy", "ddp"),
    "zero timeout": (["actor.dist_timeout_s=0"], "actor.dist_timeout_s", "> 0"),
    "infinite timeout": ([f"actor.dist_timeout_s={float('inf')}"], "actor.dist_timeout_s", "finite"),
    "negative micro-batch": (["actor.micro_batch_size=-4"], "actor.micro_batch_size", "positive"),
    "micro-batch above the minibatch": (
        ["algorithm.minibatch_size=64", "actor.micro_batch_size=128"],
        "actor.micro_batch_size",
        "divisor of the minibatch",
    ),
    "micro-batch not dividing the minibatch": (
        ["algorithm.minibatch_size=64", "actor.micro_batch_size=24"],
        "actor.micro_batch_size",
        "= 64",
    ),
    "global batch not dividing the batch": (["actor.global_batch_size=100"], "actor.global_batch_size", "divisor"),
    "unknown sharding strategy": (
        ["actor.strategy=fsdp", "actor.fsdp_sharding_strategy=zero2"],
        "actor.fsdp_sharding_strategy",
        "shard_grad_op",
    ),
    "float16 compute": (
        ["actor.strategy=fsdp", "actor.fsdp_param_dtype=float16"],
        "actor.fsdp_param_dtype",
        "bfloat16",
    ),
    "unknown reduce dtype": (
        ["actor.strategy=fsdp", "actor.fsdp_reduce_dtype=fp8"],
        "actor.fsdp_reduce_dtype",
        "float32",
    ),
    "fsdp key with ddp": (["actor.fsdp_cpu_offload=true"], "actor.fsdp_cpu_offload", "fsdp"),
    "fsdp dtype with ddp": (["actor.fsdp_param_dtype=bfloat16"], "actor.fsdp_param_dtype", "fsdp"),
    "hybrid size without hybrid_shard": (
        ["actor.strategy=fsdp", "actor.fsdp_hybrid_shard_size=2"],
        "actor.fsdp_hybrid_shard_size",
        "hybrid_shard",
    ),
}


@pytest.mark.parametrize("overrides, key, valid", BAD_ACTOR_CONFIGS.values(), ids=BAD_ACTOR_CONFIGS.keys())
def test_invalid_actor_config_is_a_config_error(overrides, key, valid):
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["env.num_envs=8", "algorithm.num_steps=32"] + overrides)
    assert caught.value.key == key
    assert key in str(caught.value) and valid in str(caught.value)


BAD_LAYOUTS = {
    # id: (overrides, actor world size, key, fragment)
    "envs not divisible by ranks": (
        ["env.num_envs=6", "algorithm.minibatch_size=64"],
        4,
        "env.num_envs",
        "multiple of the actor world size 4",
    ),
    "minibatch not divisible by ranks": (
        ["algorithm.minibatch_size=2"],
        4,
        "algorithm.minibatch_size",
        "multiple of the actor world size 4",
    ),
    "global batch not divisible by ranks": (
        ["actor.global_batch_size=128", "env.num_envs=12"],
        3,
        "actor.global_batch_size",
        "multiple",
    ),
    "micro-batch not dividing the per-rank share": (
        ["env.num_envs=12", "algorithm.minibatch_size=96", "actor.micro_batch_size=3"],
        3,
        "actor.micro_batch_size",
        "per-rank minibatch algorithm.minibatch_size / actor ranks = 96 / 3 = 32",
    ),
    "micro-batch above the per-rank share": (["actor.micro_batch_size=256"], 2, "actor.micro_batch_size", "= 128"),
    "hybrid shard size not dividing the ranks": (
        ["actor.strategy=fsdp", "actor.fsdp_sharding_strategy=hybrid_shard", "actor.fsdp_hybrid_shard_size=3"],
        4,
        "actor.fsdp_hybrid_shard_size",
        "divisor",
    ),
}


@pytest.mark.parametrize("overrides, world, key, valid", BAD_LAYOUTS.values(), ids=BAD_LAYOUTS.keys())
def test_invalid_actor_layout_is_a_config_error(overrides, world, key, valid):
    config = load_config(None, ["env.num_envs=8", "algorithm.num_steps=32"] + overrides)
    check_actor_layout(config, 1)  # one rank: nothing to split
    with pytest.raises(ConfigError) as caught:
        check_actor_layout(config, world)
    assert caught.value.key == key
    assert key in str(caught.value) and valid in str(caught.value)


def test_valid_layouts_pass():
    config = load_config(None, ["env.num_envs=8", "algorithm.num_steps=32", "actor.micro_batch_size=32"])
    for world in (1, 2, 4, 8):
        check_actor_layout(config, world)


@pytest.mark.parametrize("world, micro", [(1, None), (2, None), (2, 4), (4, 2), (8, 3)])
def test_rank_local_minibatches_partition_the_global_ones(world, micro):
    """Ranks' members of minibatch k, mapped back to global indices, are exactly minibatch k of
    one process's permutation; and every rank plans the same number of micro-batches, at most
    `micro` samples each (padding with empty ones where a rank holds fewer members)."""
    from fleetrl.parallel.sharding import EnvShard, plan_epoch

    steps, envs, minibatch = 6, 8, 16
    order = torch.randperm(steps * envs, generator=torch.Generator().manual_seed(world))
    plans = [plan_epoch(order, minibatch, EnvShard(steps, envs, rank, world), micro) for rank in range(world)]
    per_rank = envs // world
    padded = False
    for k, expected in enumerate(order.split(minibatch)):
        assert len({len(plan[k]) for plan in plans}) == 1  # same micro-batch count on every rank
        members = []
        for rank, plan in enumerate(plans):
            local = torch.cat(plan[k])
            step, column = local // per_rank, local % per_rank
            members.append(step * envs + rank * per_rank + column)  # back to global indices
            assert micro is None or all(len(m) <= micro for m in plan[k])
            padded |= micro is not None and any(len(m) == 0 for m in plan[k])
        assert sorted(torch.cat(members).tolist()) == sorted(expected.tolist())
        # in minibatch order within each rank: the rank's members keep their global order
        for rank_members in members:
            positions = [expected.tolist().index(g) for g in rank_members.tolist()]
            assert positions == sorted(positions)
    assert len(plans[0]) == steps * envs // minibatch
    if world == 8:
        assert padded  # 2 samples per rank on average, micro 3: some ranks idle through a micro-batch

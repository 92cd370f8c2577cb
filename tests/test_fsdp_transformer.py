"""FSDP2 on the transformer policy: 2 real ranks (Gloo on 127.0.0.1) shard it block by block and
train exactly what one process trains; their checkpoints are the single-process layout, and
resume identically in 2 ranks or in 1; bfloat16 computes in bfloat16 and reduces gradients in
float32; gradient checkpointing recomputes one block at a time. A user network whose blocks sit
in ModuleDicts is sharded per block too, and trains what one process trains; the MLP over the
image's CNN trains in bfloat16 too.

One spawned process group runs every scenario of `tests.fsdp_transformer_ranks` (spawning costs
seconds per process; the scenarios together take a few).
"""

from __future__ import annotations

import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.models.policy import Policy
from fleetrl.observations import map_obs
from fleetrl.plan.load import load_config
from tests import fsdp_transformer_ranks as ranks
from tests.compare import assert_close_metrics, assert_close_state, max_difference
from tests.dist_support import BASE
from tests.ranks import each_scenario, spawn_ranks

WORLD = 2
EXACT = 1e-5  # float32: only the summation order differs (per-rank sums, then the reduction)
BF16 = 0.03  # bfloat16 compute: ~3 significant digits per operation
UNITS = {"blocks.0", "blocks.1", "root"}  # model.num_layers = 2 blocks, then the Policy itself


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return spawn_ranks(each_scenario, ranks.train_rank, list(ranks.SCENARIOS), world=WORLD, timeout_s=300)


@pytest.fixture(scope="module")
def references() -> dict:
    torch.set_num_threads(1)
    return {name: ranks.train_reference(name, iterations) for name, iterations in ranks.ITERATIONS.items()}


def test_each_block_is_its_own_unit_and_each_rank_holds_half_of_it(runs):
    for rank, run in enumerate(runs):
        shapes = run["f32"]["shapes"]
        assert set(shapes) == UNITS and all(unit["fsdp"] for unit in shapes.values())
        for name in ("blocks.0", "blocks.1"):
            for param, (local, full) in shapes[name]["params"].items():
                # sharded on dim 0: half the rows of every block parameter on each rank
                assert local == (full[0] // 2, *full[1:]), (rank, name, param, local, full)
    # the root's own parameters (embeddings, heads) are sharded too
    assert_split_between_the_ranks(runs, "f32", "root")
    for run in runs:
        # one backward: one reduce-scatter per unit, each block's gradients reduced on their own
        reduced = [op for op, _ in run["f32"]["probe"]["collectives"] if op.startswith("reduce_scatter")]
        assert len(reduced) == len(UNITS)


def assert_split_between_the_ranks(runs: list[dict], name: str, unit: str) -> None:
    """Every parameter of `unit` is split on dim 0 as torch.chunk splits it: rank 0 the first
    ⌈n/2⌉ rows, rank 1 the rest."""
    for param, (local0, full) in runs[0][name]["shapes"][unit]["params"].items():
        local1 = runs[1][name]["shapes"][unit]["params"][param][0]
        assert local0[0] == -(-full[0] // 2) and local0[0] + local1[0] == full[0], (unit, param, local0, local1, full)


def test_a_custom_net_s_blocks_in_a_module_dict_are_each_their_own_unit(runs):
    """`tests.fsdp_transformer_ranks:DictBlocksNet`: each Linear inside its two ModuleDicts is an
    FSDP unit (a ModuleDict's own hooks would never run), its ParameterDict stays with the root."""
    units = ranks.UNITS["dict_blocks"]
    for run in runs:
        shapes = run["dict_blocks"]["shapes"]
        assert set(shapes) == {*units, "root"} and all(unit["fsdp"] for unit in shapes.values())
        assert set(shapes["root"]["params"]) == {"network.scales.hidden"}
    for unit in (*units, "root"):
        assert_split_between_the_ranks(runs, "dict_blocks", unit)


@pytest.mark.parametrize("name", ["f32", "checkpointing_offload", "dict_blocks"])
def test_two_ranks_train_what_one_process_trains(runs, references, name):
    """`checkpointing_offload` adds per-block gradient checkpointing and CPU offload: neither
    changes the arithmetic, so the same bound holds; `dict_blocks` is the user network with
    ModuleDict blocks."""
    reference = references[name]
    expected_state = reference["states"][-1]
    for run in runs:  # metrics are global: the same on every rank, and the single process's
        assert run[name]["metrics"] == runs[0][name]["metrics"]
        for actual, expected in zip(run[name]["metrics"], reference["metrics"], strict=True):
            assert_close_metrics(actual, expected)
    assert_close_state(runs[0][name]["state"], expected_state, EXACT)
    # the rollout workers' weights: the full policy, gathered once on rank 0
    assert max_difference(runs[0][name]["weights"], expected_state["policy"]) <= EXACT
    assert runs[1][name]["weights"] == {} and runs[1][name]["state"]["policy"] == {}


def test_bfloat16_computes_in_bfloat16_and_reduces_gradients_in_float32(runs, references):
    for run in runs:
        probe = run["bf16"]["probe"]
        assert probe["compute"] == {"weight": "torch.bfloat16", "input": "torch.bfloat16"}
        gathered = {str(dtypes) for op, dtypes in probe["collectives"] if op.startswith("all_gather")}
        reduced = [dtypes for op, dtypes in probe["collectives"] if op.startswith("reduce_scatter")]
        assert gathered == {"['torch.bfloat16']"}  # parameters travel in the compute dtype
        assert reduced == [["torch.float32"]] * len(UNITS)  # Gloo reduce-scatters float32 gradients
    result, reference = runs[0]["bf16"], references["bf16"]
    assert_close_state(result["state"], reference["states"][0], BF16)
    # the master weights (and so checkpoints and the rollout's weights) stay float32
    assert {value.dtype for value in result["weights"].values()} == {torch.float32}
    assert max_difference(result["weights"], reference["states"][0]["policy"]) > 0  # not float32 throughout


def test_the_image_mlp_trains_in_bfloat16_as_one_float32_process_does(runs, references):
    """The built-in MLP with its encoders (the 7×7 image's grid CNN, whose uint8 input becomes
    float inside its FSDP unit and must become bfloat16 there, the mission's GRU): one iteration
    in bfloat16 on 2 ranks lands within bfloat16's precision of one float32 process."""
    for run in runs:
        assert all(unit["fsdp"] for unit in run["mlp_bf16"]["shapes"].values())
    result, reference = runs[0]["mlp_bf16"], references["mlp_bf16"]["states"][0]
    assert_close_state(result["state"], reference, BF16)
    assert max_difference(result["weights"], reference["policy"]) > 0  # not float32 throughout


def test_a_two_rank_checkpoint_resumes_identically_in_two_ranks_and_in_one(runs, references):
    f32 = runs[0]["f32"]
    checkpoint = f32["checkpoint"]
    # the single-process layout: the 1-process checkpoint's keys, and a plain Policy loads it
    assert_close_state(checkpoint, references["f32"]["states"][0], EXACT)
    config = ranks.config_for("f32")
    Policy.from_config(config.model, *ranks.SPACES).load_state_dict(checkpoint["policy"])
    # 2 ranks resumed from it continue exactly as the 2 ranks that wrote it
    assert f32["resumed"]["metrics"] == f32["metrics"][1:]
    assert max_difference(f32["resumed"]["state"], f32["state"]) == 0
    # one process resumed from it, and 2 ranks resumed from one process's, continue as one process
    one = ActorWorker(config, *ranks.SPACES)
    one.load_state_dict(checkpoint)
    metrics = ranks.train(one, config, range(1, 2))
    assert_close_metrics(metrics[0], references["f32"]["metrics"][1])
    assert_close_state(one.state_dict(), references["f32"]["states"][1], EXACT)
    assert_close_state(f32["from_one"]["state"], references["f32"]["states"][1], EXACT)


def test_gradient_checkpointing_recomputes_one_block_at_a_time():
    """Per block, not the whole network: block 1 is recomputed and differentiated before block 0
    is recomputed (one block's activations alive at a time)."""
    config = load_config(None, BASE + ranks.TRANSFORMER + ["actor.gradient_checkpointing=true"])
    worker = ActorWorker(config, *ranks.SPACES)
    events = []
    for index, block in enumerate(worker.policy.network.blocks):
        block.linear1.register_forward_hook(lambda *_, i=index: events.append(("forward", i)))
        block.linear1.weight.register_post_accumulate_grad_hook(lambda _, i=index: events.append(("grad", i)))
    batch = ranks.trajectory(config, 0)
    logprob, entropy, value, _ = worker.policy(map_obs(lambda x: x[0], batch.obs), batch.actions[0])
    assert events == [("forward", 0), ("forward", 1)]
    (logprob.sum() + entropy.sum() + value.sum()).backward()
    assert events[2:] == [("forward", 1), ("grad", 1), ("forward", 0), ("grad", 0)]

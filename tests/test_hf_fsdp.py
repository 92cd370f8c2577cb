"""FSDP2 on a Hugging Face model, and sharded (DCP) checkpoints across world sizes: 2 real ranks
(Gloo on 127.0.0.1) shard a PaliGemma (`tests.hf_models`) into the units its
`_no_split_modules` names and train what one process trains (float32); in bfloat16 with float32
reduction, activation checkpointing per layer and CPU offload they compute in bfloat16 and land
within its precision. A DCP checkpoint written by the 2 ranks resumes identically in 2 ranks
and in 1 process; one written by 1 process resumes in 2 ranks.

Float32 throughout on CPU Gloo (bfloat16 is only the compute dtype, gathered parameters
included; Gloo reduce-scatters the float32 gradients).
"""

from __future__ import annotations

import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from tests import hf_fsdp_ranks as ranks
from tests.compare import assert_close_metrics, assert_close_state, max_difference
from tests.fsdp_transformer_ranks import SPACES
from tests.ranks import spawn_ranks

WORLD = 2
EXACT = 1e-5  # float32: only the summation order differs
BF16 = 0.03


def both_scenarios(rank: int, world: int, folder: str) -> dict:
    return {name: ranks.train_rank(name, rank, world, folder) for name in ranks.SCENARIOS}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("dcp")


@pytest.fixture(scope="module")
def references(folder) -> dict:
    torch.set_num_threads(1)
    return {"hf_f32": ranks.train_reference("hf_f32", folder), "hf_bf16": ranks.train_reference("hf_bf16")}


@pytest.fixture(scope="module")
def runs(references, folder) -> list[dict]:
    # after the references: the ranks read the 1-process checkpoint they wrote
    return spawn_ranks(both_scenarios, str(folder), world=WORLD, timeout_s=300)


def test_the_units_are_the_model_s_no_split_modules_each_half_on_each_rank(runs):
    for run in runs:
        assert tuple(run["hf_f32"]["units"]) == ranks.UNITS
    for unit in ranks.UNITS:
        for param, (local0, full) in runs[0]["hf_f32"]["units"][unit].items():
            local1 = runs[1]["hf_f32"]["units"][unit][param][0]
            assert local0[0] + local1[0] == full[0] and local0[0] == -(-full[0] // 2), (unit, param)


def test_two_ranks_train_what_one_process_trains(runs, references):
    reference = references["hf_f32"]
    for run in runs:
        for actual, expected in zip(run["hf_f32"]["metrics"], reference["metrics"], strict=True):
            assert_close_metrics(actual, expected)
    assert_close_state(runs[0]["hf_f32"]["state"], reference["states"][1], EXACT)
    # a weight-sync patch is gathered like the full weights: every tensor trains here; Gemma's
    # lm_head is its token embedding (tied), sent once under the embedding's name
    patch, policy = runs[0]["hf_f32"]["patch"], runs[0]["hf_f32"]["state"]["policy"]
    assert set(policy) - set(patch) == {"network.vlm.lm_head.weight"}
    assert max_difference(patch, {name: policy[name] for name in patch}) == 0
    assert runs[1]["hf_f32"]["patch"] == {}


def test_bfloat16_with_checkpointing_and_offload_computes_in_bfloat16(runs, references):
    for run in runs:
        assert run["hf_bf16"]["compute"] == {"weight": "torch.bfloat16", "input": "torch.bfloat16"}
    state = runs[0]["hf_bf16"]["state"]
    assert_close_state(state, references["hf_bf16"]["states"][0], BF16)
    assert {value.dtype for value in state["policy"].values()} == {torch.float32}  # float32 master weights


def test_a_two_rank_dcp_checkpoint_resumes_in_two_ranks_and_in_one(runs, references, folder):
    f32 = runs[0]["hf_f32"]
    assert f32["resumed"]["metrics"] == f32["metrics"][1:]
    assert max_difference(f32["resumed"]["state"], f32["state"]) == 0
    config = ranks.config_for("hf_f32")
    one = ActorWorker(config, *SPACES)
    reference = references["hf_f32"]
    one.load_state_dict(
        {"generator": reference["states"][0]["generator"], "shards_path": str(folder / "two_ranks.dcp")}
    )
    assert_close_state(one.state_dict(), reference["states"][0], EXACT)  # the 2 ranks' state after iteration 0
    assert_close_metrics(ranks.train(one, config, 1), reference["metrics"][1])
    assert_close_state(one.state_dict(), reference["states"][1], EXACT)


def test_a_one_process_dcp_checkpoint_resumes_in_two_ranks(runs, references):
    from_one = runs[0]["hf_f32"]["from_one"]
    assert_close_metrics(from_one["metrics"][0], references["hf_f32"]["metrics"][1])
    assert_close_state(from_one["state"], references["hf_f32"]["states"][1], EXACT)

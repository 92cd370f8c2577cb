"""The CUDA paths on one GPU: the actor and the rollout on the GPU train what they train on the
CPU, whole runs train on the GPU and checkpoint portably, NCCL with one rank through the trainer's
own join code with torch's flight recorder seeing its collectives complete, and the doctor's CUDA
and NCCL checks.

Skipped where torch sees no GPU (CI's machine has none): they run on the device machine, and
docs/benchmarks.md ('The GPU tests') says when they last ran there and what passed.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests import cuda_ranks, dist_support, fsdp_transformer_ranks
from tests.compare import max_difference
from tests.ranks import spawn_ranks
from tests.support import REPO, fleetrl, train

pytestmark = pytest.mark.needs("cuda", "a GPU: CI's reference host has none, the device machine runs these")

GPU = ["actor.device=cuda", "rollout.device=cuda"]
# float32 on the GPU: other kernels and summation orders than the CPU's (no TF32: torch's default
# for matmuls), over a few optimizer steps.
CLOSE = 1e-4


def trained(worker, trajectories, progress) -> tuple[list[dict], dict]:
    metrics = [worker.train(t, p) for t, p in zip(trajectories, progress, strict=True)]
    return metrics, worker.state_dict()


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_the_actor_on_the_gpu_trains_what_it_trains_on_the_cpu(model):
    """The MLP on vectors, and the transformer on Dict observations with a uint8 image: the same
    trajectories, two iterations (the lr anneals, Adam carries over), on cuda and on cpu."""
    from fleetrl.algos.ppo.actor import ActorWorker
    from fleetrl.plan.load import load_config

    if model == "mlp":
        overrides, spaces = (
            dist_support.BASE + dist_support.MLP + dist_support.SCENARIOS["ddp"],
            dist_support.spaces("ddp"),
        )
        make = lambda config, i: dist_support.make_trajectory(config, "ddp", i)  # noqa: E731
    else:
        r = fsdp_transformer_ranks
        overrides, spaces = dist_support.BASE + r.TRANSFORMER + r.UPDATES, r.SPACES
        make = r.trajectory
    results = {}
    for device in ("cpu", "cuda"):
        config = load_config(None, [*overrides, f"actor.device={device}"])
        worker = ActorWorker(config, *spaces)
        assert {p.device.type for p in worker.policy.parameters()} == {device}
        trajectories = [make(config, i) for i in range(len(dist_support.PROGRESS))]
        results[device] = trained(worker, trajectories, dist_support.PROGRESS)
    (cpu_metrics, cpu_state), (gpu_metrics, gpu_state) = results["cpu"], results["cuda"]
    for actual, expected in zip(gpu_metrics, cpu_metrics, strict=True):
        assert actual.keys() == expected.keys()
        for key, value in expected.items():
            if isinstance(value, int) or key == "lr":  # counts and the schedule: exactly
                assert actual[key] == value, key
            elif not key.endswith("_s"):  # timings aside
                assert math.isclose(actual[key], value, rel_tol=1e-3, abs_tol=CLOSE), (key, actual[key], value)
    # the state a checkpoint holds is on the CPU wherever the actor trained: it loads anywhere
    tensors = list(_tensors(gpu_state))
    assert tensors and {t.device.type for t in tensors} == {"cpu"}
    assert max_difference(gpu_state["policy"], cpu_state["policy"]) <= CLOSE


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


@pytest.mark.parametrize(
    "config, steps",
    [("ppo_cartpole.yaml", 4096), ("sac_pendulum.yaml", 600), ("ppo_atari.yaml", 2048)],
)
def test_a_whole_run_trains_on_the_gpu_and_its_checkpoint_loads_on_the_cpu(tmp_path, config, steps):
    if config == "ppo_atari.yaml":
        import ale_py  # noqa: F401 (the `atari` extra, in `test`)
    done = train(
        REPO / "configs" / config,
        *GPU,
        f"runner.total_env_steps={steps}",
        "runner.target_return=null",
        "runner.tensorboard=false",
        runs=tmp_path,
        timeout=600,
    ).succeeded()
    assert done.metrics and done.metrics[-1]["global_step"] >= steps
    checkpoints = sorted((done.run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert checkpoints, "no checkpoint written"
    state = torch.load(checkpoints[-1], map_location=None, weights_only=False)
    tensors = list(_tensors(state))
    assert tensors and {t.device.type for t in tensors} == {"cpu"}
    assert "actor on cuda, rollout on cuda" in (done.run_dir / "train.log").read_text()


def test_nccl_with_one_rank_reduces_and_torch_s_recorder_sees_each_collective_complete():
    repeats = 3
    (result,) = spawn_ranks(cuda_ranks.nccl_rank, repeats, world=1, join=False, timeout_s=180)
    assert result["backend"] == "nccl"
    assert result["values"] == [1.0] * repeats
    summary = result["summary"]
    assert summary["authoritative"] is True  # on NCCL torch's view is the one the alignment uses
    assert summary["entered"] == summary["completed"] == {"actor": repeats}
    assert summary["in_flight"] == []
    assert result["entries"] == [("nccl:all_reduce", True)] * repeats  # each completed at the dump


def test_the_doctor_finds_the_gpu_and_handshakes_over_nccl():
    done = fleetrl(
        "doctor", str(REPO / "configs" / "ppo_cartpole.yaml"), "actor.device=cuda",
        "--only", "cuda", "--only", "nccl", "--json", timeout=300,
    )  # fmt: skip
    assert done.code == 0, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["cuda"]["status"] == "pass" and torch.cuda.get_device_name(0) in checks["cuda"]["detail"]
    assert checks["nccl.handshake"]["status"] == "pass" and "nccl: 1 rank" in checks["nccl.handshake"]["detail"]

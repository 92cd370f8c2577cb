"""`runner.weight_sync_transport: collective` (issue 42): a sync's bytes broadcast from actor rank 0
over a process group of actor rank 0 and the rollout workers (parallel/sync_group.py), its header
through Ray. Real Gloo processes: the group forms only among members that prove the run's secret,
listens on loopback alone and records every wait; the rollouts end up with the bits the Ray path
gives them, and act identically."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.controller.loop import Trainer
from fleetrl.errors import ConfigError
from fleetrl.net import free_port
from fleetrl.parallel.sync_group import choose_backend
from fleetrl.parallel.sync_payload import decode, encode
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.probe.collectives import WEIGHT_SYNC_GROUP, WEIGHT_SYNC_JOIN
from fleetrl.workers.rollout_worker import RolloutWorker
from tests.dist_support import BASE, PROGRESS, synthetic_spaces
from tests.fsdp_transformer_ranks import SPACES, trajectory
from tests.incidents import STALL_S, assert_incident, promised_detection_s, run_fault
from tests.ranks import spawn_ranks
from tests.support import TIMING_METRICS
from tests.sync_members import KINDS, ray_path_reference, sync_member

LORA = ["model.id=tests.hf_models:PaliGemmaNet", "model.kwargs={lora: true}", "algorithm.update_epochs=1"]


def same(a: dict, b: dict) -> bool:
    """The same tensor names, dtypes and bits."""
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_every_kind_of_sync_is_raw_bytes_that_decode_to_what_the_ray_path_sends():
    """A LoRA PaliGemma after a real update, bfloat16 rollout, compressed changes: full weights,
    trainable tensors and changed values each encode to one uint8 buffer (no pickle) and decode to
    exactly the payload the Ray path hands the rollout."""
    config = load_config(
        None, [*BASE, *LORA, "runner.weight_sync=changed", "rollout.dtype=bfloat16", "runner.weight_sync_compress=true"]
    )
    actor = ActorWorker(config, *SPACES)
    first = actor.changed_weights()
    actor.train(trajectory(config, 0), PROGRESS[0])
    payloads = {"full": actor.policy_weights(), "trainable": actor.trainable_weights()}
    for kind, payload in [*payloads.items(), ("changed", first), ("changed", actor.changed_weights())]:
        header, buffer = encode(kind, payload)
        assert buffer.dtype == np.uint8 and buffer.nbytes == header.size
        decoded = decode(header, buffer.copy())
        if kind != "changed":
            assert same(decoded, payload)
        elif "full" in payload:
            assert same(decoded["full"], payload["full"])
        else:
            assert decoded["patch"].keys() == payload["patch"].keys() and payload["patch"]
            for name, (layout, *arrays, dtype) in payload["patch"].items():
                layout_read, *read, dtype_read = decoded["patch"][name]
                assert (layout_read, dtype_read) == (layout, dtype) and len(read) == len(arrays)
                for (numpy_dtype, shape, raw, z), (numpy_dtype_read, shape_read, raw_read, z_read) in zip(arrays, read):
                    assert (numpy_dtype_read, tuple(shape_read), bytes(raw_read), z_read) == (
                        numpy_dtype,
                        shape,
                        raw,
                        z,
                    )
    with pytest.raises(ValueError, match="its header says"):
        decode(header, buffer[:-1])


def test_members_that_prove_the_secret_form_the_group_on_loopback_and_give_rollouts_the_ray_path_s_bits():
    """Two spawned processes: a PPO actor and a bfloat16 rollout worker (the Ray test below has
    two rollouts). A formation where the rollout lacks the run's secret fails on both members,
    before any weights move; with the secret the group forms, listens on 127.0.0.1 alone, and five
    syncs (full, trainable, then changed values after each update) leave the rollout with exactly
    the weights, and the deterministic actions, that the Ray path's loaders give; each wait was a
    recorded collective."""
    results = spawn_ranks(sync_member, (free_port(), free_port()), 20.0, world=2, timeout_s=240)
    reference = ray_path_reference()
    for rank, result in enumerate(results):
        assert result["unformed"] and "did not prove the run's secret" in result["refused"], result["refused"]
        assert result["joined"] is None, result["joined"]
        assert result["listening"] == ["127.0.0.1"], result["listening"]
        # the join; the proof's broadcast, all-gather, broadcast and all-reduce; one broadcast a sync
        assert result["entered"][WEIGHT_SYNC_JOIN] == 2 and result["entered"][WEIGHT_SYNC_GROUP] == 8 + len(KINDS)
        if rank > 0:
            assert same(result["state"], reference["state"])
            assert torch.equal(result["actions"], reference["actions"])
    assert "actor rank 0 refused rollout rank 0" in results[0]["refused"]


def test_nccl_only_where_every_member_has_a_gpu_of_its_own():
    """NCCL refuses two ranks on one device and cannot reach a CPU member: Gloo then."""
    own = [((0, 0), "cuda"), ((0, 1), "cuda"), ((1, 0), "cuda:0")]
    assert choose_backend(own) == "nccl"
    assert choose_backend([((0, 0), "cuda"), ((0, 0), "cuda")]) == "gloo"  # collocated on one GPU
    assert choose_backend([((0, 0), "cuda"), ((0, 1), "cpu")]) == "gloo"


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["runner.asynchronous=true"], "runner.weight_sync_transport"),
        (["algorithm.name=sac", "env.id=Pendulum-v1"], "runner.weight_sync_transport"),
    ],
)
def test_a_collective_sync_that_cannot_work_is_refused_before_anything_starts(overrides, key):
    with pytest.raises(ConfigError) as caught:
        resolve(load_config(None, ["runner.weight_sync_transport=collective", "cluster.backend=ray", *overrides]))
    assert caught.value.key == key, caught.value


# ---------------------------------------------------------------------------------------- on Ray

CARTPOLE = "configs/ppo_cartpole.yaml"
# one actor rank and two rollout workers (each serving an env worker) as Ray workers, changed values
# to bfloat16 rollouts, with the collective transport asked for
TWO_ROLLOUTS_COLLECTIVE = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0, env: 0-1, rollout: 0-1}",
    "runner.weight_sync=changed",
    "rollout.dtype=bfloat16",
    "runner.weight_sync_transport=collective",
    "actor.dist_timeout_s=20",
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=2",
    "runner.tensorboard=false",
]
ITERATIONS = 2
CARTPOLE_SPACES = synthetic_spaces(continuous=False)  # CartPole's shapes


def rollouts_after_training(runs, *overrides: str) -> tuple[str, list[dict], list[dict], str]:
    """Train ITERATIONS iterations on Ray; the backend's transport, each iteration's metrics (the
    timings left out), each rollout worker's weights after the last sync, and train.log."""
    config = load_config(CARTPOLE, [*TWO_ROLLOUTS_COLLECTIVE, f"runner.run_dir={runs}", *overrides])
    trainer = Trainer(resolve(config), live_progress=False)
    try:
        trainer.backend.collector.start(0)
        records = [trainer.run_iteration() for _ in range(ITERATIONS)]
        trainer.updates.versions.refresh(wait=True)  # the last update's weights too
        rollout = trainer.backend.rollout
        states = rollout.get(rollout.call_all(RolloutWorker.policy_state))
    finally:
        trainer.backend.shutdown()
    metrics = [{k: v for k, v in r.items() if k not in TIMING_METRICS} for r in records]
    return trainer.backend.sync_transport, metrics, states, (trainer.run_dir / "train.log").read_text()


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_on_ray_the_collective_sync_trains_exactly_as_the_ray_sync_that_it_falls_back_to(tmp_path):
    """The same run twice on Ray: once the weight-sync group forms and every sync is broadcast over
    it; once it cannot form (every member's Gloo interface, GLOO_SOCKET_IFNAME, does not exist)
    and the run says why and syncs through Ray. Both rollout workers hold the same bits after
    both, act identically, and every iteration's metrics are the same."""
    collective = rollouts_after_training(tmp_path / "collective")
    fallback = rollouts_after_training(
        tmp_path / "fallback", "cluster.env_vars={GLOO_SOCKET_IFNAME: no_such_interface0}"
    )
    assert collective[0] == "collective" and fallback[0] == "ray"
    assert "weight-sync group: actor rank 0 and 2 rollout worker(s), gloo, rendezvous at 127.0.0.1:" in collective[3]
    assert "could not be formed" not in collective[3]
    assert (
        "weights sync through Ray (runner.weight_sync_transport: collective): the weight-sync group could not"
        in (fallback[3])
    )
    assert "no_such_interface0" in fallback[3]
    assert collective[1] == fallback[1]  # losses, returns, episodes: the same trajectories, iteration by iteration
    config = load_config(CARTPOLE, TWO_ROLLOUTS_COLLECTIVE)
    observations = torch.randn(32, 4, generator=torch.Generator().manual_seed(0)).numpy()
    for ours, theirs in zip(collective[2], fallback[2], strict=True):
        assert same(ours, theirs)
        acting = []
        for state in (ours, theirs):
            rollout = RolloutWorker.from_config(config, *CARTPOLE_SPACES)
            rollout.load_weights(state)
            acting.append(rollout.infer(observations, deterministic=True)[0])
        assert torch.equal(*acting)


# The join's wait is judged after the start-up step allowance: shorter than the join's own timeout
# (actor.dist_timeout_s), so that the members are still waiting when it is judged
JOIN_FAULT = ["watchdog.startup_step_allowance_s=25", "actor.dist_timeout_s=90"]


@pytest.mark.parametrize(
    "method, call",
    [
        pytest.param("join_weight_sync", 1, marks=pytest.mark.slow),  # start-up: the group never forms
        pytest.param("receive_weights", 1, marks=pytest.mark.slow),  # the first sync
        ("receive_weights", 3),  # steady state
    ],
)
def test_a_rollout_worker_that_hangs_in_the_sync_is_named_by_the_watchdog(tmp_path, method, call):
    """A rollout worker that never reaches the weight-sync group's collective — at its join, at
    the first sync, in steady state — while actor rank 0 waits in it is named as the rank behind
    (`rank_missing_from_collective`), within the promised detection, and everything ends. The
    start-up and first-sync cells are slow (a Ray run each, ~110-125 s on a loaded 2-core host): the
    same alignment rule names the rank in all three, held in-process by
    tests/test_alignment_rules.py for the join and the broadcast alike."""
    joining = method == "join_weight_sync"
    result = run_fault(
        tmp_path,
        "cluster.backend=ray",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0, env: 0-1, rollout: 0-1}",
        "runner.weight_sync_transport=collective",
        f"debug.fault={{kind: hang, component: rollout, rank: 1, method: {method}, call: {call}}}",
        *(JOIN_FAULT if joining else []),
        checkpointed=call > 1,
    )
    promised = promised_detection_s("startup_step", startup_step_allowance_s=25) if joining else STALL_S
    assert_incident(result, "rank_missing_from_collective", ["rollout", 1], promised)
    summary = result.hang_report["summary"]
    assert summary.startswith("rollout rank 1 is behind") and f"in rollout.{method}" in summary, summary
    group = "weight_sync join" if joining else "weight_sync"
    assert "actor rank 0, rollout rank 0 wait in" in summary or "actor rank 0 waits in" in summary, summary
    assert f"of group {group} (" in summary, summary
    # the report's table: the rollout workers have columns, the one behind has not entered the wait
    waited = re.search(r" waits? in .+? #(?P<seq>\d+) of group " + re.escape(group) + r" \(", summary)
    assert waited, summary
    rows = {row["seq"]: row["cells"] for row in result.hang_report["collectives"]["rows"] if row["group"] == group}
    seq = int(waited["seq"])
    assert rows[seq]["actor/0"]["state"] == "in flight" and rows[seq]["rollout/1"]["state"] == "not entered", rows
    if not joining:
        assert rows[seq - 1]["rollout/1"]["state"] == "done", rows  # exactly one behind

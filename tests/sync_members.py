"""Support for tests/test_weight_sync_collective.py: what each member of a weight-sync group runs in
the processes `tests.ranks.spawn_ranks` starts — member 0 a real `ActorWorker` (PPO, the MLP on
CartPole's shapes) that trains between syncs, the others real `RolloutWorker`s — and the
single-process reference that makes the same syncs the Ray path's way (the actor's answer handed
to the rollout's loader).

The header of each sync goes from member 0 to the others over the test's own Gloo group (the one
`spawn_ranks` joins every rank to), standing in for Ray, which carries it in a run; the bytes go
over the weight-sync group, a second, standalone group in the same processes.
"""

from __future__ import annotations

import psutil
import torch
import torch.distributed as dist

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.parallel.sync_group import Formation
from fleetrl.plan.load import load_config
from fleetrl.probe import flight_recorder
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.workers.actor_base import SYNC_GATHERS
from fleetrl.workers.rollout_worker import SYNC_LOADS, RolloutWorker
from tests.dist_support import BASE, MLP, make_trajectory, spaces

SECRET, WRONG_SECRET = b"s" * 32, b"w" * 32
# bfloat16 rollouts, changed values zlib-compressed: every encoding a sync can take
CONFIG = [*BASE, *MLP, "rollout.dtype=bfloat16", "runner.weight_sync_compress=true", "algorithm.update_epochs=1"]
# the actor trains before every sync but the first: each kind once, then changes after updates
KINDS = ("full", "trainable", "changed", "changed", "changed")
OBSERVATIONS = torch.randn(64, 4, generator=torch.Generator().manual_seed(5)).numpy()


def progress(sync: int) -> float:
    return sync / (2 * len(KINDS))


def sync_member(rank: int, world: int, ports: tuple[int, int], timeout_s: float) -> dict:
    """Member `rank`: a formation where the last member lacks the run's secret (it must fail on
    every member), then one where all hold it, then the syncs of `KINDS`. Returns both formations'
    outcomes, this process's listening addresses, its flight recorder's collectives and, on a
    rollout, its weights and deterministic actions."""
    recorder = Recorder("actor" if rank == 0 else "rollout", max(rank - 1, 0), 0)
    flight_recorder.install(recorder)
    config = load_config(None, CONFIG)
    worker = ActorWorker(config, *spaces("ddp")) if rank == 0 else RolloutWorker.from_config(config, *spaces("ddp"))
    formation = Formation("127.0.0.1", ports[0], world, "gloo", timeout_s, member=rank)
    refused = worker.join_weight_sync(formation, WRONG_SECRET if rank == world - 1 else SECRET)
    unformed = worker.sync_group is None
    joined = worker.join_weight_sync(Formation("127.0.0.1", ports[1], world, "gloo", timeout_s, member=rank), SECRET)
    listening = sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN"})
    for sync, kind in enumerate(KINDS):
        if rank == 0 and sync > 0:
            worker.train(make_trajectory(config, "ddp", sync), progress(sync))
        header = [worker.prepare_weights(kind) if rank == 0 else None]
        dist.broadcast_object_list(header, src=0)  # what Ray carries in a run
        if rank == 0:
            worker.send_weights()
        else:
            worker.receive_weights(header[0])
    result = {
        "refused": refused,
        "unformed": unformed,
        "joined": joined,
        "listening": listening,
        "entered": recorder.collectives.record()["collectives"]["entered"],
    }
    if rank > 0:
        result.update(state=worker.policy_state(), actions=worker.infer(OBSERVATIONS, deterministic=True)[0])
    worker.leave_weight_sync()
    return result


def ray_path_reference() -> dict:
    """The same syncs through the Ray path's methods in one process: the rollout's weights and
    deterministic actions after them."""
    config = load_config(None, CONFIG)
    actor = ActorWorker(config, *spaces("ddp"))
    rollout = RolloutWorker.from_config(config, *spaces("ddp"))
    for sync, kind in enumerate(KINDS):
        if sync > 0:
            actor.train(make_trajectory(config, "ddp", sync), progress(sync))
        getattr(rollout, SYNC_LOADS[kind].__name__)(getattr(actor, SYNC_GATHERS[kind].__name__)())
    return {"state": rollout.policy_state(), "actions": rollout.infer(OBSERVATIONS, deterministic=True)[0]}

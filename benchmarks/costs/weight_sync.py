"""Bytes and time of one actor → rollout weight sync after a real PPO update, for a LoRA fine-tune of
a Hugging Face PaliGemma (`tests.hf_models`, peft adapters on q/v projections, rank 4; frozen
base) at two widths: full weights, a patch of the whole trainable tensors (`runner.weight_sync:
trainable`), and only the values that changed at the rollout's precision (`changed`).

Two tables:

1. In one process (`--part payload`): what each mode's payload costs as Ray moves it — the actor's
   dict serialised (pickle protocol 5, as Ray's object store does for tensors) and loaded into a
   rollout worker's own copy: pickled bytes, and the time to gather, serialise, deserialise and
   load (median over the syncs after each of two updates). `changed` for float32 and bfloat16
   rollouts, bfloat16 also zlib-compressed.
2. Between processes (`--part transports`): each mode through each transport
   (`runner.weight_sync_transport`), an actor and `--rollouts` rollout workers each a Ray worker
   process of its own, bfloat16 rollouts. `ray`: the actor's answer handed to every rollout's
   loader through Ray's object store; `collective`: the weight-sync group of actor rank 0 and the
   rollouts (Gloo over loopback, formed and proven once, as at a run's start), the actor's
   encoded bytes broadcast over it, their header through Ray. Time per sync: from the request
   to every rollout's load done, as the controller sees it (median over `--updates` updates, each
   followed by a full, a trainable and a changed sync). Bytes: Ray's pickled payload; the
   collective's broadcast bytes plus its pickled header. The rollouts' weights after all syncs
   are checked to be the same bits through both transports.

    python benchmarks/costs/weight_sync.py [--part payload|transports|both]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import ROOT, log  # noqa: E402

sys.path.insert(0, str(ROOT))

WIDTHS = {"tiny (width 16, 2+2 layers)": {"width": 16}, "width 256, 4+4 layers": {"width": 256, "layers": 4}}


def changed_patch(tracker, actor) -> dict:
    return tracker.patch(actor.trainable_weights())


def timed(make, load) -> tuple[int, float]:
    """(pickled bytes, seconds) of one sync: gather/encode, serialise, deserialise, load."""
    started = time.perf_counter()
    payload = pickle.dumps(make(), protocol=5)
    load(pickle.loads(payload))
    return len(payload), time.perf_counter() - started


def payload_table() -> None:
    import torch

    from fleetrl.algos.ppo.actor import ActorWorker
    from fleetrl.parallel.changed_values import Changes, apply_changes
    from fleetrl.plan.load import load_config
    from fleetrl.workers.rollout_worker import RolloutWorker
    from tests.dist_support import BASE, PROGRESS
    from tests.fsdp_transformer_ranks import SPACES, trajectory

    torch.set_num_threads(1)
    print(
        "| model | parameters (trainable) | full: bytes, ms | trainable: bytes, ms | changed fp32 rollout: bytes, ms "
        "| changed bf16 rollout: bytes, ms | changed bf16 + zlib: bytes, ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, kwargs in WIDTHS.items():
        log(name)
        keys = ", ".join(f"{k}: {v}" for k, v in {"lora": "true", **kwargs}.items())
        config = load_config(None, [*BASE, f"model={{id: tests.hf_models:PaliGemmaNet, kwargs: {{{keys}}}}}"])
        actor = ActorWorker(config, *SPACES)
        rollout = RolloutWorker.from_config(config, *SPACES)
        rollout.load_weights(actor.policy_weights())
        total = sum(p.numel() for p in actor.policy.parameters())
        trainable = sum(p.numel() for p in actor.policy.parameters() if p.requires_grad)
        variants = {
            "fp32": (torch.float32, False),
            "bf16": (torch.bfloat16, False),
            "bf16+zlib": (torch.bfloat16, True),
        }
        results = {mode: [] for mode in ("full", "trainable", *variants)}
        for iteration in range(len(PROGRESS)):  # a sync after each real update (Adam moves every value)
            trackers = {mode: Changes(*options) for mode, options in variants.items()}
            for tracker in trackers.values():
                tracker.record(actor.trainable_weights())
            actor.train(trajectory(config, iteration), PROGRESS[iteration])
            results["full"].append(timed(actor.policy_weights, rollout.load_weights))
            results["trainable"].append(timed(actor.trainable_weights, rollout.load_patch))
            for mode, tracker in trackers.items():
                make = partial(changed_patch, tracker, actor)
                results[mode].append(timed(make, partial(apply_changes, rollout.policy)))
        cells = [
            f"{statistics.median(b for b, _ in runs):,.0f}, {statistics.median(s for _, s in runs) * 1e3:.2f}"
            for runs in results.values()
        ]
        print(f"| {name} | {total:,} ({trainable:,}) | " + " | ".join(cells) + " |")


# ------------------------------------------------------------------- between processes, on Ray

KINDS = ("full", "trainable", "changed")
TRANSPORTS = ("ray", "collective")


def lora_config(kwargs: dict, rollout_dtype: str = "bfloat16"):
    from fleetrl.plan.load import load_config
    from tests.dist_support import BASE

    keys = ", ".join(f"{k}: {v}" for k, v in {"lora": "true", **kwargs}.items())
    model = f"model={{id: tests.hf_models:PaliGemmaNet, kwargs: {{{keys}}}}}"
    return load_config(None, [*BASE, model, f"rollout.dtype={rollout_dtype}", "algorithm.update_epochs=1"])


class ActorHost:
    """An actor worker in a Ray worker process of its own (one torch thread)."""

    def __init__(self, kwargs: dict):
        import torch

        from fleetrl.algos.ppo.actor import ActorWorker
        from tests.fsdp_transformer_ranks import SPACES

        torch.set_num_threads(1)
        self.config = lora_config(kwargs)
        self.actor, self.updates = ActorWorker(self.config, *SPACES), 0

    def train(self) -> None:
        from tests.fsdp_transformer_ranks import trajectory

        self.actor.train(trajectory(self.config, self.updates), min(0.9, self.updates / 10))
        self.updates += 1

    def gather(self, kind: str):
        from fleetrl.workers.actor_base import SYNC_GATHERS

        return getattr(self.actor, SYNC_GATHERS[kind].__name__)()

    def prepare(self, kind: str):
        return self.actor.prepare_weights(kind)

    def send(self) -> None:
        self.actor.send_weights()

    def join(self, formation, secret: bytes):
        return self.actor.join_weight_sync(formation, secret)


class RolloutHost:
    """A rollout worker in a Ray worker process of its own (one torch thread)."""

    def __init__(self, kwargs: dict):
        import torch

        from fleetrl.workers.rollout_worker import RolloutWorker
        from tests.fsdp_transformer_ranks import SPACES

        torch.set_num_threads(1)
        self.rollout, self.last = RolloutWorker.from_config(lora_config(kwargs), *SPACES), None

    def load(self, kind: str, payload) -> None:
        from fleetrl.workers.rollout_worker import SYNC_LOADS

        getattr(self.rollout, SYNC_LOADS[kind].__name__)(payload)
        self.last = payload

    def pickled_bytes(self) -> int:
        return len(pickle.dumps(self.last, protocol=5))

    def receive(self, header) -> None:
        self.rollout.receive_weights(header)

    def join(self, formation, secret: bytes):
        return self.rollout.join_weight_sync(formation, secret)

    def state(self) -> dict:
        return self.rollout.policy_state()


def sync_once(transport: str, kind: str, actor, rollouts) -> tuple[int, float]:
    """(bytes, seconds) of one sync of `kind` through `transport`, request to every load done."""
    import ray

    started = time.perf_counter()
    if transport == "ray":
        payload = actor.gather.remote(kind)
        ray.get([rollout.load.remote(kind, payload) for rollout in rollouts])
        seconds = time.perf_counter() - started
        return ray.get(rollouts[0].pickled_bytes.remote()), seconds
    header = actor.prepare.remote(kind)
    ray.get([actor.send.remote(), *[rollout.receive.remote(header) for rollout in rollouts]])
    seconds = time.perf_counter() - started
    header = ray.get(header)
    return header.size + len(pickle.dumps(header, protocol=5)), seconds


def run_transport(transport: str, kwargs: dict, rollout_count: int, updates: int) -> tuple[dict, list[dict]]:
    """{kind: [(bytes, seconds) per update]} and the rollouts' final weights."""
    import secrets

    import ray

    from fleetrl.net import free_port
    from fleetrl.parallel.sync_group import Formation

    actor = ray.remote(num_cpus=0)(ActorHost).remote(kwargs)
    rollouts = [ray.remote(num_cpus=0)(RolloutHost).remote(kwargs) for _ in range(rollout_count)]
    if transport == "collective":
        secret, group = secrets.token_bytes(32), Formation("127.0.0.1", free_port(), 1 + rollout_count, "gloo", 120)
        members = [actor, *rollouts]
        reasons = ray.get([m.join.remote(replace(group, member=i), secret) for i, m in enumerate(members)])
        assert not any(reasons), reasons
    sync_once(transport, "changed", actor, rollouts)  # the first changed sync: the full weights, held
    results = {kind: [] for kind in KINDS}
    for _ in range(updates):
        ray.get(actor.train.remote())
        for kind in KINDS:
            results[kind].append(sync_once(transport, kind, actor, rollouts))
    states = ray.get([rollout.state.remote() for rollout in rollouts])
    for handle in [actor, *rollouts]:
        ray.kill(handle)
    return results, states


def transports_table(rollout_count: int, updates: int) -> None:
    import os

    from fleetrl.cluster.ray.nodes import set_ray_loopback

    set_ray_loopback(True)  # before Ray is imported: 127.0.0.1 stays the instance's address
    import ray
    import torch

    from fleetrl.cluster.ray.local import LocalRay

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    local = LocalRay(1, 2, "127.0.0.1")  # a Ray instance as fleetrl starts one
    ray.init(address=local.address, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        print(
            f"| model | sync | ray: bytes, ms | collective: bytes, ms | collective/ray time "
            f"({rollout_count} rollout worker processes, bfloat16) |"
        )
        print("|---|---|---|---|---|")
        for name, kwargs in WIDTHS.items():
            log(name)
            measured = {transport: run_transport(transport, kwargs, rollout_count, updates) for transport in TRANSPORTS}
            (ray_runs, ray_states), (group_runs, group_states) = measured["ray"], measured["collective"]
            for ours, theirs in zip(ray_states, group_states, strict=True):
                assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), name
            for kind in KINDS:
                cells = []
                for runs in (ray_runs[kind], group_runs[kind]):
                    cells.append((statistics.median(b for b, _ in runs), statistics.median(s for _, s in runs)))
                (ray_bytes, ray_s), (group_bytes, group_s) = cells
                print(
                    f"| {name} | {kind} | {ray_bytes:,.0f}, {ray_s * 1e3:.1f} | {group_bytes:,.0f}, {group_s * 1e3:.1f} "
                    f"| {group_s / ray_s:.2f} |"
                )
        print("the rollouts' weights after every sync: the same bits through both transports")
    finally:
        ray.shutdown()
        local.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("payload", "transports", "both"), default="both")
    parser.add_argument("--rollouts", type=int, default=2, help="rollout worker processes (transports)")
    parser.add_argument("--updates", type=int, default=4, help="updates, each followed by one sync of each mode")
    options = parser.parse_args()
    if options.part in ("payload", "both"):
        payload_table()
    if options.part in ("transports", "both"):
        transports_table(options.rollouts, options.updates)

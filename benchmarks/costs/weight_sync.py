"""Bytes and time of one actor → rollout weight sync after a real PPO update: full weights,
a patch of the whole trainable tensors (`runner.weight_sync: trainable`), and only the values
that changed at the rollout's precision (`changed`: float32 and bfloat16 rollouts, bfloat16 also
zlib-compressed), for a LoRA fine-tune of a Hugging Face PaliGemma (`tests.hf_models`, peft
adapters on q/v projections, rank 4; frozen base) at two widths. Medians over the syncs after
each of two updates.

A sync is what the Ray backend moves: the actor's dict of CPU tensors, serialised (pickle
protocol 5, as Ray's object store does for tensors) and loaded into the rollout worker's own
copy of the policy. Measured in one process: the serialised bytes, and the time to gather,
serialise, deserialise and load (median of 5); the transfer between processes adds what the
link costs per byte, the same for both modes.

    python benchmarks/costs/weight_sync.py
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
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


def main() -> None:
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


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no options: --help only
    main()

"""Bytes and time of one actor → rollout weight sync: full weights against a patch of only the
trainable tensors (`runner.weight_sync: trainable`), for a LoRA fine-tune of a Hugging Face
PaliGemma (`tests.hf_models`, peft adapters on q/v projections, rank 4; frozen base) at two
widths.

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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import ROOT, log  # noqa: E402

sys.path.insert(0, str(ROOT))

WIDTHS = {"tiny (width 16, 2+2 layers)": {"width": 16}, "width 256, 4+4 layers": {"width": 256, "layers": 4}}


def one_sync(actor, rollout, trainable: bool) -> tuple[int, float]:
    started = time.perf_counter()
    weights = actor.trainable_weights() if trainable else actor.policy_weights()
    payload = pickle.dumps(weights, protocol=5)
    loaded = pickle.loads(payload)
    (rollout.load_patch if trainable else rollout.load_weights)(loaded)
    return len(payload), time.perf_counter() - started


def main() -> None:
    import torch

    from fleetrl.algos.ppo.actor import ActorWorker
    from fleetrl.plan.load import load_config
    from fleetrl.workers.rollout_worker import RolloutWorker
    from tests.fsdp_transformer_ranks import SPACES

    torch.set_num_threads(1)
    print("| model | parameters (trainable) | full sync: bytes, ms | trainable patch: bytes, ms | bytes ratio |")
    print("|---|---|---|---|---|")
    for name, kwargs in WIDTHS.items():
        log(name)
        config = load_config(
            None,
            [
                "model.id=tests.hf_models:PaliGemmaNet",
                f"model.kwargs={{lora: true, {', '.join(f'{k}: {v}' for k, v in kwargs.items())}}}",
            ],
        )
        actor = ActorWorker(config, *SPACES)
        rollout = RolloutWorker.from_config(config, *SPACES)
        total = sum(p.numel() for p in actor.policy.parameters())
        trainable = sum(p.numel() for p in actor.policy.parameters() if p.requires_grad)
        results = {}
        for mode in (False, True):
            runs = [one_sync(actor, rollout, mode) for _ in range(5)]
            results[mode] = (runs[0][0], statistics.median(s for _, s in runs) * 1e3)
        (full_bytes, full_ms), (patch_bytes, patch_ms) = results[False], results[True]
        print(
            f"| {name} | {total:,} ({trainable:,}) | {full_bytes:,}, {full_ms:.2f} | "
            f"{patch_bytes:,}, {patch_ms:.2f} | {patch_bytes / full_bytes:.4f} |"
        )


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no options: --help only
    main()

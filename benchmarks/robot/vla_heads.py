"""Acting and update time per env step of the three action heads of `model.id: hf` (issue 41): the
flow expert at 5 and 10 denoising steps and the L1 head, as ratios to the tokens head (parallel
decoding), on the CPU, one torch thread, in one process side by side.

Each cell: a PaliGemma folder (`tiny`, the tests' size, and `wide`: a 256-wide, 4-layer language
model and a 128-wide vision tower), LoRA rank 4, chunks of 4 actions of a 3-dimensional Box, 4
MiniGrid views with a 5-wide proprioception key; acting is `policy.act` (the VLM once, then the
head: S expert forwards for flow), the update one loss-path forward and backward of what acting
recorded (the flow head's velocities of its S steps in one batched call). Per env step = the
call's time / (4 observations × 4 actions of a chunk). The cells alternate within each repetition
so that a change of the host's load touches every head alike; the median of `--reps` is reported.
A GPU was not lent to this task: these are CPU figures.

    python benchmarks/robot/vla_heads.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import ROOT, log, machine, machine_line, results_dir, write_json  # noqa: E402

sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

CHUNK, BATCH = 4, 4
HEADS = {
    "tokens": {},
    "l1": {"action_head": "l1", "l1": {"width": 64}},
    "flow K=5": {"action_head": "flow", "flow": {"steps": 5, "width": 64, "layers": 2, "heads": 4}},
    "flow K=10": {"action_head": "flow", "flow": {"steps": 10, "width": 64, "layers": 2, "heads": 4}},
}


def policies(folder: Path, spaces) -> dict:
    from fleetrl.config.model_sections import FlowConfig, HfModelConfig, L1Config, LoraConfig
    from fleetrl.models.policy import Policy

    built = {}
    for name, keys in HEADS.items():
        keys = dict(keys)
        if "flow" in keys:
            keys["flow"] = FlowConfig(**keys["flow"])
        if "l1" in keys:
            keys["l1"] = L1Config(**keys["l1"])
        torch.manual_seed(0)
        config = HfModelConfig(path=str(folder), action_chunk=CHUNK, lora=LoraConfig(rank=4), **keys)
        built[name] = Policy.from_config(config, *spaces)
    return built


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def update(policy, obs, records) -> None:
    outputs = policy(obs, records)
    (outputs.logprobs.sum() + outputs.value.sum()).backward()
    policy.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions of every cell; the median is reported")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from fleetrl.models.hf.builders import PALIGEMMA_SIZES, Dims
    from fleetrl.models.hf.init_model import init_model
    from tests.vla_support import minigrid_batch

    PALIGEMMA_SIZES["wide"] = Dims(128, 256, 2, 4, 32, 8, 256, 1024, 4, 4, 1, 64)
    observation_space, _, obs = minigrid_batch()
    observation_space = gym.spaces.Dict(
        dict(observation_space.spaces, state=gym.spaces.Box(-np.inf, np.inf, (5,), np.float32))
    )
    obs = dict(obs, state=torch.randn(BATCH, 5, generator=torch.Generator().manual_seed(0)))
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    out = results_dir("vla_heads")
    info = machine()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for size in ("tiny", "wide"):
            folder = init_model("paligemma", size, Path(scratch) / size)
            built = policies(folder, (observation_space, box))
            times = {name: {"act": [], "update": []} for name in built}
            for rep in range(args.reps + 1):  # the first is a warm-up, not kept
                for name, policy in built.items():
                    torch.manual_seed(rep)
                    records = policy.act(obs)[0]
                    act = timed(lambda p=policy: p.act(obs))
                    learn = timed(lambda p=policy, r=records: update(p, obs, r))
                    if rep:
                        times[name]["act"].append(act)
                        times[name]["update"].append(learn)
                log(f"{size}: repetition {rep} done")
            for name, kept in times.items():
                per_step = {key: statistics.median(values) / (BATCH * CHUNK) for key, values in kept.items()}
                rows.append(
                    {"size": size, "head": name, "runs": kept, **{f"{k}_s_per_step": v for k, v in per_step.items()}}
                )
    write_json(out / "results.json", {"machine": info, "rows": rows, "command": " ".join(sys.argv)})
    print(machine_line(info))
    print("| size | head | act, ms / env step | × tokens | update, ms / env step | × tokens |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        tokens = next(r for r in rows if r["size"] == row["size"] and r["head"] == "tokens")
        print(
            f"| {row['size']} | {row['head']} | {row['act_s_per_step'] * 1e3:.2f} | "
            f"{row['act_s_per_step'] / tokens['act_s_per_step']:.2f} | {row['update_s_per_step'] * 1e3:.2f} | "
            f"{row['update_s_per_step'] / tokens['update_s_per_step']:.2f} |"
        )


if __name__ == "__main__":
    main()

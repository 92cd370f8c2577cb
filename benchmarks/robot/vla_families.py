"""Per family: bytes and wall time of load → first act on the CPU, `model.dtype` float32 against
bfloat16, for folders built by transformers from each family's published configuration
(tests/hf_families.py: the real processor, image splitting, special tokens and vocabulary size;
widths and depths shrunk to 32 and 1-2 layers, so the vocabulary's embedding is most of the
weights, as it is not in a real 2-3 B model).

Each cell runs in a fresh Python process (so its peak memory is its own): load the folder as
`model.id: hf` does (`Policy.from_config`), then one act on 2 MiniGrid observations. Reported:
the weights' bytes, the process's peak RSS, the load time and the first act's time. A GPU was not
lent to this task: the bfloat16 rows are CPU figures (a CPU without AMX computes bfloat16 slower
than float32; the point of bfloat16 here is the memory).

    python benchmarks/robot/vla_families.py [--families paligemma smolvlm2 ...] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import ROOT, log, machine, machine_line, results_dir, subprocess_env, write_json  # noqa: E402

sys.path.insert(0, str(ROOT))

FAMILIES = ["paligemma", "paligemma2", "smolvlm", "smolvlm2", "qwen2_vl", "qwen2_5_vl"]

CELL = """
import json, resource, sys, time
import torch
torch.set_num_threads(1)
from fleetrl.config.model_sections import HfModelConfig
from fleetrl.models.policy import Policy
from tests.vla_support import minigrid_batch
observation_space, action_space, obs = minigrid_batch()
obs = {key: value[:2] for key, value in obs.items()}
started = time.perf_counter()
policy = Policy.from_config(HfModelConfig(path=sys.argv[1], dtype=sys.argv[2]), observation_space, action_space)
loaded = time.perf_counter()
policy.act(obs)
acted = time.perf_counter()
weights = sum(p.numel() * p.element_size() for p in policy.parameters())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"load_s": loaded - started, "act_s": acted - loaded, "weight_bytes": weights, "peak_rss": peak}))
"""


def cell(folder: Path, dtype: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CELL, str(folder), dtype],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=FAMILIES, choices=FAMILIES)
    parser.add_argument("--reps", type=int, default=3, help="processes per cell; the median is reported")
    args = parser.parse_args()
    from tests.hf_families import build

    out = results_dir("vla_families")
    info = machine()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.families:
            folder = build(name, Path(scratch) / name)
            for dtype in ("float32", "bfloat16"):
                log(f"{name} {dtype}")
                runs = [cell(folder, dtype) for _ in range(args.reps)]
                rows.append(
                    {
                        "family": name,
                        "dtype": dtype,
                        "runs": runs,
                        **{key: statistics.median(run[key] for run in runs) for key in runs[0]},
                    }
                )
    write_json(out / "results.json", {"machine": info, "rows": rows, "command": " ".join(sys.argv)})
    print(machine_line(info))
    print("| family | dtype | weights, MB | peak RSS, MB | load, s | first act, s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['family']} | {row['dtype']} | {row['weight_bytes'] / 1e6:.1f} | {row['peak_rss'] / 1e6:.0f} | "
            f"{row['load_s']:.2f} | {row['act_s']:.2f} |"
        )


if __name__ == "__main__":
    main()

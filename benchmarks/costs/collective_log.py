"""What recording collectives costs, before (a base commit) and after (this tree), side by side.

Runs the same measurements in a child process per tree — the base commit's `fleetrl` extracted
with `git archive` into a temp folder, and this tree's — alternating, `--rounds` times each, and
prints the medians and the after/before ratios, in CPU microseconds (the process's CPU time,
every thread counted, per call: robust to a loaded host, where wall time is mostly the wait for a
core):

- mark: one `flight_recorder.collective(...)` block around nothing (a recorder installed): the
  bookkeeping of one synchronous collective (fleetrl's own all-reduces and broadcasts);
- per bucket: one DDP backward over a model cut into `--buckets` gradient buckets, with fleetrl's
  recorded comm hook, minus the same without a recorder installed (the hook then calls DDP's
  default all-reduce straight), divided by the buckets: what recording costs a gradient bucket
  (entry, and after, completion through `Future.then`);
- all_reduce: one bare Gloo all-reduce of 8 floats (1 rank), which after this change also pays
  torch's own flight recorder (`TORCH_FR_BUFFER_SIZE`, switched on by
  `process_group.init_process_group`);
- heartbeat record: `Recorder.record()` + JSON after the DDP steps (after: with torch's recorder
  dumped and summarised).

    .venv/bin/python benchmarks/costs/collective_log.py [--base main] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import before_after, per_call_us  # noqa: E402

MEASURES = ("mark_us", "per_bucket_us", "all_reduce_us", "record_us")


def measure(buckets: int) -> dict:
    """In the child: every measure once, in one process group of one Gloo rank."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from fleetrl.net import free_port
    from fleetrl.parallel import process_group
    from fleetrl.parallel.wrap import ddp
    from fleetrl.probe import flight_recorder

    torch.set_num_threads(1)
    process_group.init_process_group(0, 1, "127.0.0.1", free_port(), timeout_s=30)
    recorder = flight_recorder.Recorder("actor", 0, 0)
    flight_recorder.install(recorder)
    tensor = torch.zeros(8)

    def mark():
        with flight_recorder.collective("all_reduce", tensor):
            pass

    # small 64x64 layers (16 KiB of float32 each), buckets cut at 16 KiB: the step's compute
    # is small beside the per-bucket costs measured
    layers = [nn.Linear(64, 64) for _ in range(buckets)]
    model = ddp(nn.Sequential(*layers), torch.device("cpu"), bucket_cap_mb=1 / 64)
    batch = torch.ones(4, 64)

    def step():
        model(batch).sum().backward()

    recorded = per_call_us(step, 400)
    seq_before = recorder.record()["last_collective"]["seq"]
    step()
    buckets = recorder.record()["last_collective"]["seq"] - seq_before  # as DDP cut them
    flight_recorder.install(None)
    plain = per_call_us(step, 400)
    flight_recorder.install(recorder)
    results = {
        "mark_us": per_call_us(mark, 20_000),
        "per_bucket_us": (recorded - plain) / buckets,
        "buckets": buckets,
        "all_reduce_us": per_call_us(lambda: dist.all_reduce(tensor), 2_000),
        "record_us": per_call_us(lambda: json.dumps(recorder.record()), 2_000),
    }
    process_group.destroy_process_group()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="main", help="the commit to compare against (default: main)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--buckets", type=int, default=8)
    args = parser.parse_args()
    runs = before_after(args.base, args.rounds, Path(__file__), f"measure({args.buckets})", ("TORCH_FR_BUFFER_SIZE",))
    print(f"{'measure':<16}{'before':>12}{'after':>12}{'after/before':>14}")
    for measure_name in MEASURES:
        before = statistics.median(r[measure_name] for r in runs["before"])
        after = statistics.median(r[measure_name] for r in runs["after"])
        print(f"{measure_name:<16}{before:>12.2f}{after:>12.2f}{after / before:>14.2f}")


if __name__ == "__main__":
    main()

"""What the flight recorder costs each worker call, before (a base commit) and after (this tree).

Every call the controller makes to a worker (inline: `rollout.act` and `env.step`, twice per vector
step) runs through `fleetrl.probe.recorded_calls.RecordedCalls`, which marks it as a phase of the recorder.
Measured in a child process per tree (the base commit's `fleetrl` from `git archive`), alternating,
`--rounds` times, as CPU microseconds per call (robust to a loaded host):

- plain: `getattr(worker, name)(*args)` (what an unrecorded inline group does);
- recorded: the same call through `RecordedCalls` (a recorder installed, no fault armed);
- heartbeat record: `Recorder.record()` + JSON after 4 phases have run (the publishing thread's
  work, twice a second).

    .venv/bin/python benchmarks/costs/recorder_hot_path.py [--base main] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

MEASURES = ("plain_us", "recorded_us", "record_us")


class Worker:
    def step(self, actions):
        return actions


def measure(calls: int) -> dict:
    """In the child: each measure once."""
    from fleetrl.debug.faults import FaultPlan
    from fleetrl.probe.flight_recorder import Recorder
    from fleetrl.probe.recorded_calls import RecordedCalls

    worker, recorder = Worker(), Recorder("env", 0, 0)
    recorded = RecordedCalls(worker, "env", 0, recorder, FaultPlan({}, "env", 0))
    for name in ("reset", "act", "train"):
        recorder.exit_phase(recorder.enter_phase(f"env.{name}"))
    method = "step"  # by name, as the controller's calls arrive
    return {
        "plain_us": kit.per_call_us(lambda: getattr(worker, method)(1), calls),
        "recorded_us": kit.per_call_us(lambda: recorded(method, 1), calls),
        "record_us": kit.per_call_us(lambda: json.dumps(recorder.record()), calls // 50),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="main", help="the commit to compare against (default: main)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    info = kit.machine()
    runs = kit.before_after(args.base, args.rounds, Path(__file__), f"measure({args.calls})")
    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/costs/recorder_hot_path.py --base {args.base} --rounds {args.rounds}`\n"
    )
    print("| CPU µs per call (median of rounds) | before | after | after/before | rounds before | rounds after |")
    print("|---|---|---|---|---|---|")
    for name in MEASURES:
        before, after = ([r[name] for r in runs[tree]] for tree in ("before", "after"))
        b, a = statistics.median(before), statistics.median(after)
        print(f"| {name} | {b:.3f} | {a:.3f} | {a / b:.2f} | {kit.spread(before)} | {kit.spread(after)} |")
    added = {t: statistics.median(r["recorded_us"] - r["plain_us"] for r in runs[t]) for t in runs}
    print(
        f"\nWhat recording adds to a worker call: {added['before']:.3f} µs before, {added['after']:.3f} µs after "
        f"(median of per-round differences)."
    )


if __name__ == "__main__":
    main()

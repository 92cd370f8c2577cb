"""What freeze-proofing costs: the same PPO CartPole job with the watchdog on (default) and off
(`watchdog.enabled=false`), inline and on Ray with 2 DDP actor ranks (1 node x 2 slots: actor 0-1,
rollout 0-1, env 0-1), variants rotating order each repetition; throughput (env steps / training
seconds after --warmup iterations) and the on/off ratio.

`watchdog.enabled=false` only skips the controller's watchdog thread (fleetrl/watch/session.py,
`WatchSession.start`): every worker still runs each call as a recorded phase
(fleetrl/watch/host.py `RecordedCalls`), still marks every collective (DDP gradient buckets included,
with a call-site stack walk), and still publishes a heartbeat every 0.5 s. So the run-level
comparison measures the watchdog thread alone; the rest is measured with micro-benchmarks in this
process: RecordedCalls vs a plain getattr call, `Recorder.in_collective` vs nothing, one heartbeat
(record + JSON + TCPStore set) and one watchdog poll of 6 workers (store reads + checks).

    .venv/bin/python benchmarks/watchdog_overhead.py [--reps 3] [--inline-reps 6] [--inline-steps 60000] [--ray-steps 15360]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _runkit as kit  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
COMMON = ["runner.checkpoint_interval=100000", "runner.log_interval=1000", "runner.target_return=null"]
RAY2 = [
    "cluster.backend=ray",
    "cluster.num_nodes=1",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}",
]


def variants(inline_steps: int, ray_steps: int) -> dict[str, list[str]]:
    inline = [*COMMON, "cluster.backend=inline", f"runner.total_env_steps={inline_steps}"]
    ray = [*COMMON, *RAY2, f"runner.total_env_steps={ray_steps}"]
    return {
        "inline, watchdog on": inline,
        "inline, watchdog off": [*inline, "watchdog.enabled=false"],
        "Ray 2 ranks, watchdog on": ray,
        "Ray 2 ranks, watchdog off": [*ray, "watchdog.enabled=false"],
    }


# ---------------------------------------------------------------- micro-benchmarks


class Worker:
    def step(self, x):
        return x


def per_call_ns(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def micro(rounds: int = 7) -> dict:
    import torch

    from fleetrl.config.schema import WatchdogConfig
    from fleetrl.watch.faults import FaultPlan
    from fleetrl.watch.flight_recorder import Recorder
    from fleetrl.watch.host import RecordedCalls
    from fleetrl.watch.store import HeartbeatStore, connect_publisher
    from fleetrl.watch.watchdog import Watchdog

    torch.set_num_threads(1)
    worker, recorder = Worker(), Recorder("env", 0, 0)
    runner = RecordedCalls(worker, "env", 0, recorder, FaultPlan({}, "env", 0))
    plain = lambda method, *args: getattr(worker, method)(*args)  # noqa: E731 - InlineGroup's fallback
    tensor = torch.zeros(11_000)
    results = {
        "plain getattr call": [],
        "RecordedCalls call": [],
        "no collective mark": [],
        "Recorder.in_collective mark": [],
    }
    for _ in range(rounds):  # interleaved
        results["plain getattr call"].append(per_call_ns(lambda: plain("step", 1), 50_000))
        results["RecordedCalls call"].append(per_call_ns(lambda: runner("step", 1), 50_000))
        results["no collective mark"].append(per_call_ns(lambda: contextlib.nullcontext().__enter__(), 20_000))

        def mark():
            with recorder.in_collective("all_reduce (ddp grad bucket 0)", [tensor]):
                pass

        results["Recorder.in_collective mark"].append(per_call_ns(mark, 5_000))
    store = HeartbeatStore("127.0.0.1")
    publish = connect_publisher("127.0.0.1", store.port, "env", 0)
    import json

    def beat():
        publish(json.dumps(recorder.record()))

    results["heartbeat (record + JSON + TCPStore set)"] = [per_call_ns(beat, 500) for _ in range(rounds)]
    keys = [(c, r) for c in ("env", "rollout", "actor") for r in range(2)]
    for key in keys:
        connect_publisher("127.0.0.1", store.port, *key)(
            json.dumps({**recorder.record(), "component": key[0], "rank": key[1]})
        )
    dog = Watchdog(WatchdogConfig(), store.read, keys, lambda incident: None)

    results["watchdog poll, 6 workers (store reads + checks)"] = [per_call_ns(dog.poll, 200) for _ in range(rounds)]
    return {name: statistics.median(values) for name, values in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the Ray pair")
    parser.add_argument("--inline-reps", type=int, default=6, help="repetitions of the inline pair")
    parser.add_argument("--inline-steps", type=int, default=60000)
    parser.add_argument("--ray-steps", type=int, default=15360)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("watchdog_overhead")
    overrides = variants(args.inline_steps, args.ray_steps)
    threads = {name: kit.placement_threads(CONFIG, o) for name, o in overrides.items()}
    inline = {name: o for name, o in overrides.items() if name.startswith("inline")}
    ray = {name: o for name, o in overrides.items() if not name.startswith("inline")}
    runs = {
        **kit.run_interleaved(CONFIG, inline, args.inline_reps, out, args.warmup),
        **kit.run_interleaved(CONFIG, ray, args.reps, out, args.warmup),
    }
    timings = micro()
    kit.write_json(
        out / "results.json",
        {"machine": info, "args": vars(args), "threads": threads, "runs": runs, "micro_ns": timings},
    )

    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/watchdog_overhead.py --reps {args.reps} --inline-reps "
        f"{args.inline_reps} --inline-steps "
        f"{args.inline_steps} --ray-steps {args.ray_steps} --warmup {args.warmup}`; each run `fleetrl train {CONFIG} "
        f"{' '.join(COMMON)} runner.tensorboard=false <variant> --skip-doctor`; raw: "
        f"`{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    print(kit.throughput_table(runs, threads, "inline, watchdog on"))
    print()
    print(
        "| backend | on/off throughput ratio (median of per-repetition ratios) | per-repetition ratios | "
        "ratio of medians | target (≥ 0.98) |"
    )
    print("|---|---|---|---|---|")
    for backend in ("inline", "Ray 2 ranks"):
        on, off = runs[f"{backend}, watchdog on"], runs[f"{backend}, watchdog off"]
        ratios = [
            a["steady"]["steps_per_s"] / b["steady"]["steps_per_s"]
            for a, b in zip(on, off)
            if a["code"] == 0 and b["code"] == 0
        ]
        med_on = kit.median(r["steady"]["steps_per_s"] for r in on if r["code"] == 0)
        med_off = kit.median(r["steady"]["steps_per_s"] for r in off if r["code"] == 0)
        verdict = "met" if kit.median(ratios) >= 0.98 else "not met (or within noise: see ranges)"
        print(
            f"| {backend} | {kit.median(ratios):.3f} | {', '.join(f'{r:.3f}' for r in ratios)} | "
            f"{med_on / med_off:.3f} | {verdict} |"
        )
    print()
    print("Micro-benchmarks (this process, 1 torch thread, median of 7 interleaved rounds):\n")
    print("| what | per call |")
    print("|---|---|")
    for name, ns in timings.items():
        print(f"| {name} | {ns / 1000:.2f} µs |")
    extra_call = timings["RecordedCalls call"] - timings["plain getattr call"]
    print(
        f"\nRecordedCalls adds {extra_call / 1000:.2f} µs per worker call (inline: 2 calls per vector step → "
        f"{2 * extra_call / 1000:.2f} µs per 8 env steps); a collective mark costs "
        f"{timings['Recorder.in_collective mark'] / 1000:.1f} µs (one per DDP bucket per minibatch and per "
        f"fleetrl collective); heartbeats cost {timings['heartbeat (record + JSON + TCPStore set)'] / 1000:.0f} µs "
        f"every 0.5 s per worker, a watchdog poll "
        f"{timings['watchdog poll, 6 workers (store reads + checks)'] / 1000:.0f} µs every 0.25 s."
    )


if __name__ == "__main__":
    main()

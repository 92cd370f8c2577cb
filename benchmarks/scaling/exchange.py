"""What one env ⇄ rollout exchange costs on Ray: compiled graph vs plain actor calls vs inline.

Part 1, the exchange alone: a no-op policy (`act` returns its input) and a no-op env (`step`
returns it), each a Ray actor that dispatches `call(name, *args)` like fleetrl's WorkerHost, and
one lane driven T steps per epoch the three ways fleetrl can:

  inline            both objects in this process (the floor: Python dispatch only);
  Ray plain calls   fleetrl's classic exchange: per step `act.remote` then `step.remote`, futures
                    passed along, nothing waited for until the epoch's end (collect.QueuedCalls);
  Ray plain, waited the same two calls, each step's outcome waited for (a round trip per step);
  Ray compiled, U   one Ray Compiled Graph of U chained act → step pairs, executed T/U times, the
                    outcome read after each execution: U = 1 (a controller barrier every step) and
                    U = 8 (what cluster/exchange/compiled.py compiles for T = 32, 1 lane);
                    and U = 8 exchanging what fleetrl's workers do (a StepResult, an action
                    array) instead of one array: what serialisation adds, with Ray's default
                    serialisation and with fleetrl's (`pack_step_results`);
  Ray direct        fleetrl's direct channels (cluster/exchange/direct_channels.py): one `serve` call to
                    the env actor and one `drive` call to the rollout actor per epoch, the steps
                    exchanged over a TCP socket between them; with a no-op payload and with
                    fleetrl's (a StepResult one way, an action array the other).

Per exchange = per act+step pair, median over --reps epochs of --steps steps, variants interleaved.

Part 2, training: PPO CartPole (configs/ppo_cartpole.yaml, fixed env-step budget, target off) with
actor, rollout and 2 env ranks (2 pipeline stages each) as Ray actors, cluster.exchange compiled
vs classic vs direct, and the inline backend; env steps per training second, ratios to inline.

Part 3, the tiny VLA (configs/ppo_minigrid_vla.yaml on Ray: one env, rollout and actor worker, a
tiny PaliGemma made here by `fleetrl init-model`), synchronous, cluster.exchange compiled vs
direct: env steps/s and the cores the run's own processes kept busy after the warm-up, where a
reader waiting on the graph's channels shows as CPU that the direct channels' blocking reads
do not spend.

    .venv/bin/python benchmarks/scaling/exchange.py [--reps 5] [--steps 200] [--train-reps 2] [--train-steps 20480]
        [--vla-reps 2] [--vla-steps 6144]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
UNROLLS = (1, 8)  # steps per compiled-graph execution
REAL = "fleetrl's payload"  # the U = 8 graph exchanging StepResults and action arrays (RealPayload)
PACKED = "fleetrl's payload, one pickle"  # the same, StepResults packed as fleetrl does (PackedPayload)
RAY_FOUR_LANES = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0, env: 0-1, rollout: 0}",
    "rollout.pipeline_stage_num=2",
]
TRAIN_VARIANTS = {
    "inline": ["cluster.backend=inline"],
    "Ray classic calls": [*RAY_FOUR_LANES, "cluster.exchange=classic"],
    "Ray compiled graph": [*RAY_FOUR_LANES, "cluster.exchange=compiled"],
    "Ray direct channels": [*RAY_FOUR_LANES, "cluster.exchange=direct"],
}
VLA_CONFIG = "configs/ppo_minigrid_vla.yaml"
VLA_VARIANTS = {
    "VLA, compiled graph": ["cluster.backend=ray", "cluster.exchange=compiled"],
    "VLA, direct channels": ["cluster.backend=ray", "cluster.exchange=direct"],
}


class NoOp:
    """The policy and the env at once: every method returns what it is given."""

    def call(self, name: str, *args):
        return getattr(self, name)(*args)

    def act(self, lane: int, t: int, outcome):
        return outcome

    def step(self, actions, stage: int):
        return actions


class RealPayload(NoOp):
    """What fleetrl's workers exchange instead, for 4 CartPole envs: `act` answers an action
    array, `step` a `StepResult` (observations, rewards, flags, truncation index, final
    observations: 6 arrays in a dataclass): the serialisation cost above a single array."""

    def act(self, lane: int, t: int, outcome):
        import numpy as np

        return np.zeros(len(outcome.reward), np.int64)

    def step(self, actions, stage: int):
        import numpy as np

        from fleetrl.step_result import StepResult

        return StepResult.initial(np.zeros((len(actions), 4), np.float32))


class PackedPayload(RealPayload):
    """The same, with the StepResult sent as one pickle, as fleetrl's processes do
    (cluster/ray/worker_host.py `pack_step_results`)."""

    def __init__(self):
        from fleetrl.cluster.ray.worker_host import pack_step_results

        pack_step_results()


def direct_host(payload: type) -> type:
    """`payload`'s actor with direct channels, as fleetrl's WorkerHost has (`direct`)."""

    class Direct(payload):
        def __init__(self, rank: int):
            from fleetrl.cluster.exchange.direct_channels import DirectChannels

            super().__init__()
            self.channels = DirectChannels(self.call, ("benchmark", rank), b"benchmark secret")

        def direct(self, operation: str, *args):
            return getattr(self.channels, operation)(*args)

    return Direct


def connect_direct(ray, env, rollout) -> None:
    address = ray.get(env.direct.remote("listen"))
    ray.get([env.direct.remote("accept", 60.0), rollout.direct.remote("connect", {0: tuple(address)}, 60.0)])


def exchange_costs(reps: int, steps: int) -> dict[str, list[float]]:
    """Seconds per exchange (act + step) of each variant, one value per epoch."""
    import numpy as np
    import ray
    from ray.dag import InputNode

    from fleetrl.cluster.ray.worker_host import pack_step_results
    from fleetrl.step_result import StepResult

    outcome = np.zeros((4, 4), np.float32)  # 4 CartPole observations
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        host, real, packed = (ray.remote(num_cpus=0)(c) for c in (NoOp, RealPayload, PackedPayload))
        # A pair of actors per graph: an actor serves one compiled graph at a time.
        pairs = {name: (host.remote(), host.remote()) for name in ("plain", *UNROLLS)}
        pairs[REAL], pairs[PACKED] = (real.remote(), real.remote()), (packed.remote(), packed.remote())
        direct = {
            name: (ray.remote(num_cpus=0)(direct_host(c)).remote(0), ray.remote(num_cpus=0)(direct_host(c)).remote(0))
            for name, c in (("no-op", NoOp), (PACKED, PackedPayload))
        }
        for pair in direct.values():
            connect_direct(ray, pair[1], pair[0])
        ray.get([actor.__ray_ready__.remote() for pair in pairs.values() for actor in pair])
        rollout, env = pairs["plain"]
        graphs = {}
        for graph, unroll in [*((u, u) for u in UNROLLS), (REAL, UNROLLS[-1]), (PACKED, UNROLLS[-1])]:
            with InputNode() as inputs:  # inputs[k]: step index; inputs[unroll]: the last outcome
                value = inputs[unroll]
                for k in range(unroll):
                    act = pairs[graph][0].call.bind("act", 0, inputs[k], value)
                    value = pairs[graph][1].call.bind("step", act, 0)
            graphs[graph] = value.experimental_compile()
        local = NoOp()

        def inline() -> None:
            value = outcome
            for t in range(steps):
                value = local.call("step", local.call("act", 0, t, value), 0)

        def queued() -> None:
            value = outcome
            for t in range(steps):
                value = env.call.remote("step", rollout.call.remote("act", 0, t, value), 0)
            ray.get(value)

        def waited() -> None:
            value = outcome
            for t in range(steps):
                value = ray.get(env.call.remote("step", rollout.call.remote("act", 0, t, value), 0))

        def compiled(unroll: int, graph=None, first_outcome=outcome) -> None:
            value = first_outcome
            for first in range(0, steps, unroll):
                value = copy.deepcopy(
                    graphs[graph or unroll].execute(*range(first, first + unroll), value).get(timeout=-1)
                )

        def direct_channels(pair: str, first_outcome=outcome) -> None:
            rollout, env = direct[pair]
            ray.get(
                [
                    env.direct.remote("serve", "step", 1, steps),
                    rollout.direct.remote("drive", "act", [(0, 0)], [first_outcome], steps),
                ]
            )

        variants = {"inline": inline, "Ray plain calls": queued, "Ray plain, waited": waited}
        variants.update({f"Ray compiled, U = {u}": partial(compiled, u) for u in UNROLLS})

        def packed_here(run) -> None:  # this process packs StepResults too, for that variant only
            pack_step_results()
            try:
                run()
            finally:
                ray.util.deregister_serializer(StepResult)

        initial = StepResult.initial(outcome)
        variants[f"Ray compiled, U = {UNROLLS[-1]}, {REAL}"] = partial(compiled, UNROLLS[-1], REAL, initial)
        variants[f"Ray compiled, U = {UNROLLS[-1]}, {PACKED}"] = partial(
            packed_here, partial(compiled, UNROLLS[-1], PACKED, initial)
        )
        variants["Ray direct channels"] = partial(direct_channels, "no-op")
        variants[f"Ray direct channels, {PACKED}"] = partial(packed_here, partial(direct_channels, PACKED, initial))
        for run in variants.values():  # warm-up
            run()
        costs: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for rep in range(reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                started = time.perf_counter()
                variants[name]()
                costs[name].append((time.perf_counter() - started) / steps)
        for graph in graphs.values():
            graph.teardown()
        return costs
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="steps per epoch, a multiple of 8")
    parser.add_argument("--train-reps", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=20480)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--vla-reps", type=int, default=2, help="part 3's repetitions (0: skip it)")
    parser.add_argument("--vla-steps", type=int, default=6144, help="part 3's env steps a run (256 an iteration)")
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("exchange_overhead")
    load_before = os.getloadavg()
    costs = exchange_costs(args.reps, args.steps)
    overrides = {
        name: [*kit.FIXED_WORK, f"runner.total_env_steps={args.train_steps}", *extra]
        for name, extra in TRAIN_VARIANTS.items()
    }
    threads = {name: kit.placement_threads(CONFIG, o) for name, o in overrides.items()}
    runs = kit.run_interleaved(CONFIG, overrides, args.train_reps, out, args.warmup) if args.train_reps else {}
    vla_overrides = {
        name: [*kit.FIXED_WORK, f"runner.total_env_steps={args.vla_steps}", *extra]
        for name, extra in VLA_VARIANTS.items()
    }
    if args.vla_reps:
        model = f"model.path={kit.tiny_vla(out / 'paligemma-tiny')}"
        vla_overrides = {name: [*o, model] for name, o in vla_overrides.items()}
    vla_threads = {name: kit.placement_threads(VLA_CONFIG, o) for name, o in vla_overrides.items()}
    vla_runs = (
        kit.run_interleaved(VLA_CONFIG, vla_overrides, args.vla_reps, out / "vla", args.warmup, steady_cores=True)
        if args.vla_reps
        else {}
    )
    kit.write_json(
        out / "results.json",
        {
            "machine": info,
            "args": vars(args),
            "load_before": load_before,
            "costs": costs,
            "threads": threads,
            "runs": runs,
            "vla_threads": vla_threads,
            "vla_runs": vla_runs,
        },
    )

    print(f"Machine: {kit.machine_line(info)}; load average before: {load_before[0]:.2f}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/scaling/exchange.py --reps {args.reps} --steps {args.steps} "
        f"--train-reps {args.train_reps} --train-steps {args.train_steps} --warmup {args.warmup} "
        f"--vla-reps {args.vla_reps} --vla-steps {args.vla_steps}`; raw: "
        f"`{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    plain = statistics.median(costs["Ray plain calls"])
    print("| exchange (no-op act + step, 1 lane) | µs per exchange, median (range) | vs Ray plain calls |")
    print("|---|---|---|")
    for name, values in costs.items():
        micro = [v * 1e6 for v in values]
        print(
            f"| {name} | {statistics.median(micro):.1f} ({kit.spread(micro)}) | {statistics.median(values) / plain:.2f}× |"
        )
    if runs:
        print()
        print(kit.throughput_table(runs, threads, "inline"))
    if vla_runs:
        busy = {"cores busy": lambda rs: kit.fmt(kit.med([r.get("steady_cores") for r in rs]), 2)}
        print()
        print(kit.throughput_table(vla_runs, vla_threads, "VLA, compiled graph", extra_columns=busy))


if __name__ == "__main__":
    main()

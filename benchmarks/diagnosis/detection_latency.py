"""How fast a failure surfaces: fleetrl's watchdog against plain torch.distributed (Gloo) defaults.

fleetrl: a small Ray CartPole job with 2 actor ranks (the placement of tests/test_freeze_proof.py:
actor 0-1, env 0-1, rollout 0 on 1 node x 2 slots), default watchdog settings
(heartbeat_timeout_s=5, min_deadline_s=5, collective_timeout_s=5, poll_interval_s=0.25), one
fault injected with `debug.fault=...` per run; from hang_report.json: `detected_after_s`
(report time − `incident_started`, which is the fault's start as well as fleetrl can tell: the
last heartbeat of a killed or frozen process, the start of a hung phase or collective, the
arrival of an exception) and the wall time from `incident_started` to the `fleetrl` process's
exit (stacks captured, report written, every worker killed).

plain torch.distributed: 2 spawned processes in a Gloo group with the default timeout (30 min),
all-reducing 10k floats in a loop; on the 50th iteration rank 1 suffers the same fault; how long
until rank 0 sees anything (an exception), capped at --cap seconds. These run in a background
thread while the fleetrl runs go on (they are blocked in recv or stopped: no CPU).

    .venv/bin/python benchmarks/diagnosis/detection_latency.py [--reps 3] [--cap 120]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
import kit  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
SMALL = [
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=2",
    "runner.checkpoint_interval=1",
    "runner.total_env_steps=1000000",
    "runner.target_return=null",
]
RAY_TWO_ACTORS = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0}",
]
# fault class → (kind, component, rank, call), the expected cause, the target bound (s)
FAULTS = {
    "kill (actor 1, mid all-reduce)": (("kill", "actor", 1, 3), "worker_died", 3),
    "stop (SIGSTOP actor 1)": (("stop", "actor", 1, 3), "process_frozen", 10),
    "gil_hang (actor 1 holds the GIL)": (("gil_hang", "actor", 1, 2), "process_frozen", 10),
    "env hang (env 1 step never returns)": (("hang", "env", 1, 40), "phase_timeout", 10),
    "exception (env 1 raises)": (("exception", "env", 1, 40), "worker_exception", 3),
    "extra_collective (actor 1)": (("extra_collective", "actor", 1, 2), "collective_mismatch", 10),
}
# the same faults in plain torch.distributed (gil_hang is not re-run there: it would burn a core
# for --cap seconds on a shared machine, and a held GIL looks to the peer exactly like SIGSTOP)
PLAIN = {
    "kill": "kill (actor 1, mid all-reduce)",
    "exception": "exception (env 1 raises)",
    "stop": "stop (SIGSTOP actor 1)",
    "hang": "env hang (env 1 step never returns)",
    "extra_collective": "extra_collective (actor 1)",
}


def fault_override(kind: str, component: str, rank: int, call: int) -> str:
    return f"debug.fault={{kind: {kind}, component: {component}, rank: {rank}, call: {call}}}"


# ---------------------------------------------------------------- plain torch.distributed


def _plain_worker(rank: int, port: int, kind: str, marker: str, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # this child only: 127.0.0.1
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)  # default timeout
    tensor = torch.ones(10_000)
    for step in range(10**9):
        if rank == 1 and step == 50:
            Path(marker).write_text(repr(time.time()))
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif kind == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif kind == "hang":
                while True:
                    time.sleep(3600)
            elif kind == "exception":
                raise RuntimeError("injected fault")
            elif kind == "extra_collective":
                dist.all_reduce(torch.zeros(7))
        try:
            dist.all_reduce(tensor)
        except Exception as error:  # noqa: BLE001 - what surfaces is the measurement
            queue.put((rank, time.time(), f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"))
            return
        if rank == 0 and step == 60 and kind == "extra_collective":
            queue.put((rank, time.time(), "no error: rank 0 went on (the ranks are silently out of step)"))
            return


def plain_fault(kind: str, cap: float) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    marker = tempfile.mktemp(prefix=f"plain-{kind}-")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_plain_worker, args=(r, port, kind, marker, queue), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    outcome = None
    deadline = time.time() + cap + 60  # + start-up
    while time.time() < deadline:
        try:
            rank, when, what = queue.get(timeout=0.2)
            if rank == 0:
                outcome = (when, what)
                break
        except Exception:  # noqa: BLE001 - queue.Empty
            pass
        if os.path.exists(marker) and time.time() - float(Path(marker).read_text() or "inf") > cap:
            break
        if not procs[0].is_alive() and queue.empty():
            break
    fault_at = float(Path(marker).read_text()) if os.path.exists(marker) else None
    rank0_exit = procs[0].exitcode  # before we end anything: None while it still runs
    for p in procs:  # ours: resume a stopped one so it can die, then kill
        p.join(timeout=0.5)
        if p.is_alive():
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.join(timeout=10)
    if os.path.exists(marker):
        os.unlink(marker)
    if outcome is None and rank0_exit not in (None, 0) and fault_at is not None:
        return {
            "kind": kind,
            "surfaced_after_s": None,
            "cap": cap,
            "what": f"rank 0's process died (exit code {rank0_exit}), no Python exception",
        }
    if outcome is None or fault_at is None:
        return {"kind": kind, "surfaced_after_s": None, "what": f"nothing within {cap:.0f} s", "cap": cap}
    return {"kind": kind, "surfaced_after_s": outcome[0] - fault_at, "what": outcome[1], "cap": cap}


def plain_all(cap: float, results: list) -> None:
    for kind in ("kill", "exception"):
        results.append(plain_fault(kind, cap))
    threads = [
        threading.Thread(target=lambda k=k: results.append(plain_fault(k, cap)))
        for k in ("stop", "hang", "extra_collective")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---------------------------------------------------------------- fleetrl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cap", type=float, default=120.0)
    args = parser.parse_args()
    info = kit.machine()
    out = kit.results_dir("detection_latency")
    plain: list[dict] = []
    background = threading.Thread(target=plain_all, args=(args.cap, plain), daemon=True)
    background.start()
    runs: dict[str, list[dict]] = {name: [] for name in FAULTS}
    for rep in range(args.reps):
        for name, ((kind, component, rank, call), _cause, _bound) in FAULTS.items():
            kit.log(f"rep {rep + 1}/{args.reps}: {name}")
            run = kit.run_fleetrl(
                CONFIG,
                [*SMALL, *RAY_TWO_ACTORS, fault_override(kind, component, rank, call)],
                out / f"{kind}-{rep}",
                timeout=300,
            )
            report = run["report"] or {}
            run["cause"], run["culprit"] = report.get("cause"), report.get("culprit")
            run["detected_after_s"] = report.get("detected_after_s")
            run["watcher_absent_s"] = report.get("watcher_absent_s")  # the host's part of it (a loaded host)
            run["fault_to_exit_s"] = run["ended"] - report["incident_started"] if report else None
            run["report_to_exit_s"] = run["ended"] - report["reported_at"] if report else None
            run.pop("metrics", None)
            kit.log(
                f"  exit {run['code']}, {run['cause']} {run['culprit']}, detected after "
                f"{run['detected_after_s']} (watchdog absent {run['watcher_absent_s']}), "
                f"fault→exit {run['fault_to_exit_s']}; leftover Ray: "
                f"{run['leftover_ray_pids']}"
            )
            runs[name].append(run)
    kit.log("waiting for the plain torch.distributed runs")
    background.join(timeout=args.cap + 300)
    kit.write_json(out / "results.json", {"machine": info, "args": vars(args), "runs": runs, "plain": plain})

    print(f"Machine: {kit.machine_line(info)}\n")
    print(
        f"Command: `.venv/bin/python benchmarks/diagnosis/detection_latency.py --reps {args.reps} --cap {args.cap:.0f}`; each "
        f"fleetrl run `fleetrl train {CONFIG} runner.run_dir=<dir> runner.tensorboard=false {' '.join(SMALL)} "
        f"{' '.join(RAY_TWO_ACTORS)} 'debug.fault={{kind: K, component: C, rank: R, call: N}}' --skip-doctor` "
        f"(watchdog defaults); raw: `{out.relative_to(kit.ROOT)}/results.json`\n"
    )
    by_kind = {PLAIN[p["kind"]]: p for p in plain}
    print(
        "| fault | debug.fault | cause reported (runs) | exit code | detected_after_s median (range) | target | met | "
        "fault → process exit, s median (range) | report → exit, s | plain torch.distributed (Gloo, default timeout) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, ((kind, component, rank, call), cause, bound) in FAULTS.items():
        rs = runs[name]
        causes = sorted({f"{r['cause']} {r['culprit']}" for r in rs})
        detected = [r["detected_after_s"] for r in rs if r["detected_after_s"] is not None]
        to_exit = [r["fault_to_exit_s"] for r in rs if r["fault_to_exit_s"] is not None]
        report_exit = [r["report_to_exit_s"] for r in rs if r["report_to_exit_s"] is not None]
        right = sum(r["cause"] == cause and r["culprit"] == [component, rank] for r in rs)
        met = "yes" if detected and len(detected) == len(rs) and kit.median(detected) <= bound else "no"
        if detected and max(detected) > bound and met == "yes":
            met = "median yes (max over)"
        baseline = by_kind.get(name)
        if baseline is not None and baseline["surfaced_after_s"] is None and "died" in baseline["what"]:
            plain_text = baseline["what"]
        elif baseline is None:
            plain_text = "not re-run (a held GIL looks like SIGSTOP to the peer: waits for the timeout)"
        elif baseline["surfaced_after_s"] is None:
            plain_text = f"> {baseline['cap']:.0f} s (default timeout 30 min): nothing surfaced"
        else:
            what = re.sub(r"\[[^\]]*pair\.cc:\d+\] ", "", baseline["what"]).split(". This is")[0]
            plain_text = f"{baseline['surfaced_after_s']:.2f} s: {what}"
        print(
            f"| {name} | `{kind}, {component}, rank {rank}, call {call}` | {', '.join(causes)} ({right}/{len(rs)} as "
            f"expected) | {','.join(sorted({str(r['code']) for r in rs}))} | "
            f"{kit.median(detected):.2f} ({kit.spread(detected)}) | ≤ {bound} s | {met} | "
            f"{kit.median(to_exit):.2f} ({kit.spread(to_exit)}) | {kit.median(report_exit):.2f} | {plain_text} |"
        )
    leftovers = sorted({pid for rs in runs.values() for r in rs for pid in r["leftover_ray_pids"]})
    print(
        f"\nRay daemons of these runs (session named after the fleetrl process) still alive after them: "
        f"{leftovers or 'none'}"
    )


if __name__ == "__main__":
    main()

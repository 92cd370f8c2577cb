"""The supervisor watching N workers: detection, CPU, store traffic, memory and the report, per N.

N simulated workers (fleetrl/debug/fleet.py: real flight recorders, up to 256 actor ranks in one
process group, the rest env workers), 64 to a simulated node, each node one process that drives
its workers and publishes each one's real heartbeat record, sealed, through its own real store
client (probe/store.py's connect_publisher, as a worker host does) every `heartbeat_interval_s`. This process is the supervisor's side: the
real heartbeat store (probe/store.py, a TCPStore server) and the real watchdog thread
(watch/watchdog.py, default settings), then the real report (watch/reporting/hang_report.py). Each node
names a "raylet" address of its own (a socket its process listens on), so a killed node process
is a lost node as watch/judging/node_loss.py tells one; its host name is its own, so no local pid checks.

One fault per run, injected after a steady window:
  freeze  one worker (the last) stops publishing;            threshold heartbeat_timeout_s
  skip    actor rank 128 (or N/2) finishes a step without its all_reduce, the others wait in it;
                                                              threshold collective_timeout_s
  node    the node process holding workers 64-127 is killed; threshold heartbeat_timeout_s

Measured per (fault, N): detection latency past the threshold (from the injection, on this
clock), the supervisor process's CPU seconds per second over the steady window (getrusage: the
store's server thread, the watchdog thread, everything) and the watchdog thread's alone, store
requests per second (workers' sets counted by the nodes, the watchdog's check + multi_get
counted here), RSS growth of this process from before the store, the report's size and the time
to build and write it. Stacks are not requested from simulated workers: the report carries
"(not captured)" where a real one carries each worker's stack.

    .venv/bin/python benchmarks/diagnosis/scale_harness.py --workers 8 64 256 1024 --faults freeze skip node \
        --out docs/benchmarks/scale.json --plot docs/benchmarks/scale.png
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import resource
import socket
import tempfile
import time
from pathlib import Path

import psutil

from fleetrl.config.schema import WatchdogConfig
from fleetrl.debug.fleet import SimulatedWorker, fleet_layout
from fleetrl.probe.seal import new_run_secret
from fleetrl.probe.store import HeartbeatStore, connect_publisher
from fleetrl.watch.reporting.hang_report import build_hang_report, write_hang_report
from fleetrl.watch.watchdog import Watchdog

PER_NODE = 64


class Steps(ctypes.Structure):
    """Shared with the nodes: the epoch step their workers begin at, and the one the fault strikes at."""

    _fields_ = [("begin", ctypes.c_longlong), ("strike", ctypes.c_longlong)]


THRESHOLD = {"freeze": "heartbeat_timeout_s", "skip": "collective_timeout_s", "node": "heartbeat_timeout_s"}


def node_main(
    port: int, secret: bytes, members: list, culprit: tuple, interval_s: float, fault: str, shared, sets, ready
) -> None:
    """One simulated node: its workers step and publish every `interval_s` until killed. Steps are
    numbered on the epoch clock from `shared.begin`, and a node that woke late makes the steps it
    missed, so every actor rank enters the same collectives: all_reduce #n is step begin + n - 1
    on every node. At step `shared.strike` (0: none yet) the fault strikes."""
    raylet = socket.socket()
    raylet.bind(("127.0.0.1", 0))
    raylet.listen(64)
    address = f"127.0.0.1:{raylet.getsockname()[1]}"
    workers, clients = [], []  # a publish function per worker, as probe/recorded_calls.py makes it
    for component, rank, node in members:
        worker = SimulatedWorker(component, rank, node, host=f"sim-node-{node}")
        worker.recorder.identity["raylet"] = address
        workers.append(worker)
        clients.append(connect_publisher("127.0.0.1", port, component, rank, secret))
    ready.release()
    done = None  # the last step made
    while True:
        now_step = int(time.time() / interval_s)
        if shared.begin and now_step >= shared.begin:
            done = shared.begin - 1 if done is None else done
            while done < now_step:
                done += 1
                for worker in workers:
                    if done == shared.strike and fault == "skip" and worker.key[0] == "actor":
                        worker.skip() if worker.key == culprit else worker.hold()
                    else:
                        worker.step()
        for worker, client in zip(workers, clients):
            if (
                fault == "freeze"
                and worker.key == culprit
                and shared.strike
                and done is not None
                and done >= shared.strike
            ):
                continue  # the frozen worker: no more beats
            client(json.dumps(worker.record()))
            sets.value += 1
        time.sleep(max(0.0, interval_s - (time.time() % interval_s)))


def run(workers: int, fault: str, steady_s: float, timeout_s: float) -> dict:
    config = WatchdogConfig()
    layout = fleet_layout(workers, PER_NODE)
    actors = sum(1 for c, _, _ in layout if c == "actor")
    culprit = ("actor", 128 if actors >= 256 else actors // 2) if fault == "skip" else layout[-1][:2]
    import torch.distributed  # noqa: F401 (the store's import, before the baseline)

    rss_before = psutil.Process().memory_info().rss
    secret = new_run_secret()
    store = HeartbeatStore("127.0.0.1", secret)
    context = multiprocessing.get_context("fork")
    shared = context.Value(Steps, 0, 0, lock=False)
    sets, ready = [], context.Semaphore(0)
    nodes = sorted({entry[2] for entry in layout})
    processes = []
    for node in nodes:
        members = [entry for entry in layout if entry[2] == node]
        counter = context.Value("q", 0, lock=False)
        sets.append(counter)
        process = context.Process(
            target=node_main,
            args=(store.port, secret, members, culprit, config.heartbeat_interval_s, fault, shared, counter, ready),
            daemon=True,
        )
        process.start()
        processes.append(process)
    try:
        connecting = time.time()
        for _ in nodes:  # the store's server takes each client's handshake in turn (~0.1 s each here)
            if not ready.acquire(timeout=timeout_s + 0.2 * workers):
                raise TimeoutError("a simulated node did not start")
        connected_s = time.time() - connecting
        shared.begin = int(time.time() / config.heartbeat_interval_s) + 2
        keys = [(c, r) for c, r, _ in layout]
        reads = [0]

        def read(which):
            reads[0] += 2  # check + multi_get (probe/store.py)
            return store.read(which)

        detected: dict = {}
        watchdog = Watchdog(config, read, keys, lambda incident: detected.setdefault("at", time.time()))
        watchdog.start()
        time.sleep(2 * config.heartbeat_interval_s)  # every worker published once
        cpu0, thread0 = resource.getrusage(resource.RUSAGE_SELF), watchdog_cpu(watchdog)
        sets0, reads0, wall0 = sum(s.value for s in sets), reads[0], time.time()
        time.sleep(steady_s)
        if watchdog.incident is not None:  # a false alarm before any fault: say so, measure no more
            return {
                "workers": workers,
                "fault": fault,
                "load": os.getloadavg(),
                "connected_s": connected_s,
                "incident_before_fault": f"{watchdog.incident.cause}: {watchdog.incident.summary[:300]}",
            }
        cpu1, thread1 = resource.getrusage(resource.RUSAGE_SELF), watchdog_cpu(watchdog)
        wall = time.time() - wall0
        steady = {
            "supervisor_cpu_per_s": (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / wall,
            "watchdog_thread_cpu_per_s": (thread1 - thread0) / wall,
            "store_requests_per_s": (sum(s.value for s in sets) - sets0 + reads[0] - reads0) / wall,
            # what the loaded host achieved against the configured rates (2 beats/s, 4 polls/s)
            "beats_per_worker_per_s": (sum(s.value for s in sets) - sets0) / wall / workers,
            "polls_per_s": (reads[0] - reads0) / 2 / wall,
            # CPU per poll depends little on the host's load, the rate of polls a lot
            "watchdog_cpu_per_poll_s": (thread1 - thread0) / max(1, (reads[0] - reads0) / 2),
            "rss_growth_mib": (psutil.Process().memory_info().rss - rss_before) / 2**20,
            "incident_before_fault": watchdog.incident.summary if watchdog.incident else None,
        }
        injected = inject(fault, shared, processes, config.heartbeat_interval_s)
        deadline = time.time() + timeout_s
        while "at" not in detected and time.time() < deadline:
            time.sleep(0.05)
        incident = watchdog.incident
        watchdog.stop()
        result = {"workers": workers, "fault": fault, "load": os.getloadavg(), "connected_s": connected_s, **steady}
        if incident is None:
            return {**result, "detected": False}
        threshold = getattr(config, THRESHOLD[fault])
        result.update(
            detected=True,
            cause=incident.cause,
            culprit=list(incident.culprit or []),
            summary=incident.summary,
            detection_s=detected["at"] - injected,
            # from the fault's first sign as the watchdog tells it (the frozen worker's last beat,
            # the start of the wait): the figure the threshold bounds
            past_threshold_s=detected["at"] - incident.started - threshold,
            threshold_s=threshold,
        )
        return {**result, **report_cost(incident, layout)}
    finally:
        for process in processes:
            process.kill()
            process.join()


def watchdog_cpu(watchdog: Watchdog) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(watchdog.ident))


def inject(fault: str, shared, processes: list, interval_s: float) -> float:
    """Strike `fault`; when it struck, on this clock."""
    if fault == "node":
        processes[min(1, len(processes) - 1)].kill()
        return time.time()
    strike = int(time.time() / interval_s) + 2
    shared.strike = strike
    return strike * interval_s


def report_cost(incident, layout) -> dict:
    workers = [{"component": c, "rank": r, "node": n} for c, r, n in layout]
    started = time.perf_counter()
    report = build_hang_report(incident, workers, {}, time.time())
    with tempfile.TemporaryDirectory() as folder:
        text, _ = write_hang_report(Path(folder), report)
        elapsed = time.perf_counter() - started
        sizes = {name.name: name.stat().st_size for name in Path(folder).iterdir()}
    return {
        "report_s": elapsed,
        "report_json_bytes": sizes["hang_report.json"],
        "report_text_bytes": sizes["hang_report.txt"],
        "report_first_lines": text.splitlines()[:3],
    }


COLUMNS = (  # (heading, field, format)
    ("past threshold s", "past_threshold_s", ".2f"),
    ("supervisor CPU/s", "supervisor_cpu_per_s", ".3f"),
    ("watchdog CPU/s", "watchdog_thread_cpu_per_s", ".3f"),
    ("watchdog CPU s/poll", "watchdog_cpu_per_poll_s", ".4f"),
    ("polls/s", "polls_per_s", ".2f"),
    ("beats/worker/s", "beats_per_worker_per_s", ".2f"),
    ("store req/s", "store_requests_per_s", ".0f"),
    ("RSS +MiB", "rss_growth_mib", ".1f"),
    ("report s", "report_s", ".3f"),
    ("report.json B", "report_json_bytes", "d"),
    ("report.txt B", "report_text_bytes", "d"),
)


def render(results: list[dict]) -> str:
    """A Markdown table; a run with a false alarm before its fault says so in the cause column."""
    lines = [
        "| fault | N | cause | " + " | ".join(h for h, _, _ in COLUMNS) + " | load 1/5/15 min |",
        "|" + "---|" * (len(COLUMNS) + 4),
    ]
    for r in results:
        alarm = r.get("incident_before_fault")
        cause = r.get("cause") or (f"false alarm before the fault: {alarm}" if alarm else "not detected")
        cells = [format(r[f], spec) if r.get(f) is not None else "-" for _, f, spec in COLUMNS]
        load = "/".join(f"{x:.1f}" for x in r["load"])
        lines.append(f"| {r['fault']} | {r['workers']} | {cause} | " + " | ".join(cells) + f" | {load} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for fault in sorted({r["fault"] for r in results}):
        rows = sorted((r for r in results if r["fault"] == fault and r.get("detected")), key=lambda r: r["workers"])
        left.plot([r["workers"] for r in rows], [r["detection_s"] for r in rows], "o-", label=fault)
        polls = 1 / WatchdogConfig().poll_interval_s  # the configured rate: a loaded host polls less
        n = [r["workers"] for r in rows]
        right.plot(
            n, [r["watchdog_cpu_per_poll_s"] * polls for r in rows], "o-", label=f"{fault}: CPU/poll x {polls:g}"
        )
        right.plot(n, [r["supervisor_cpu_per_s"] for r in rows], "x:", label=f"{fault}: measured (starved)")
    left.set(xscale="log", xlabel="workers", ylabel="detection after injection (s)", title="detection latency")
    right.set(
        xscale="log",
        yscale="log",
        xlabel="workers",
        ylabel="CPU s per s",
        title="watchdog CPU at the configured poll rate",
    )
    for axis in (left, right):
        axis.legend(fontsize=7)
        axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--faults", nargs="+", choices=sorted(THRESHOLD), default=sorted(THRESHOLD))
    parser.add_argument("--steady-s", type=float, default=10.0, help="the window CPU and requests are measured over")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    results = []
    for workers in args.workers:
        for fault in args.faults:
            result = run(workers, fault, args.steady_s, args.timeout_s)
            results.append(result)
            print(json.dumps(result), flush=True)
            if args.out:  # after each run: a later N that does not finish leaves the earlier ones
                args.out.write_text(json.dumps(results, indent=1))
    print(render(results))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()

"""`fleetrl train` as a benchmark runs it: a subprocess in a parent folder of its own, its run
directory read back (metrics, summary, report, train.log's times), the steady-state throughput,
runs of several variants interleaved, and no Ray daemon of ours left behind."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
from contextlib import nullcontext
from pathlib import Path

from kit.load import ForeignLoad
from kit.places import FLEETRL, ROOT, fleetrl_executable, log, subprocess_env
from kit.tree_cpu import SteadyCpu

RAY_DAEMONS = ("raylet", "gcs_server")
# Overrides for runs that compare throughput: the same fixed work in every run (no stop at the
# target return, no checkpoints or console lines inside the measured iterations).
FIXED_WORK = ["runner.checkpoint_interval=100000", "runner.log_interval=1000", "runner.target_return=null"]
# The seed layout's env side: two env workers, one on each of two simulated nodes, the rollout
# pipelined in two stages (the scaling suite's runs beside inline).
TWO_ENV_NODES = [
    "cluster.backend=ray",
    "cluster.simulate_nodes=2",
    "cluster.num_nodes=2",
    "cluster.devices_per_node=1",
    "cluster.component_placement={actor: 0, rollout: 0, env: 0-1}",
    "rollout.pipeline_stage_num=2",
]


def ray_daemon_pids() -> set[int]:
    import psutil  # here, not above: the kit is also imported in venvs without it (robot/render_cost.py)

    pids = set()
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            text = process.info["name"] + " " + " ".join(process.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if any(name in text for name in RAY_DAEMONS):
            pids.add(process.info["pid"])
    return pids


def started_by(pid: int, driver_pid: int) -> bool:
    import psutil

    try:
        text = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    return f"_{driver_pid}/" in text or f"_{driver_pid} " in text or text.endswith(f"_{driver_pid}")


def run_fleetrl(
    config: str,
    overrides: list[str],
    parent: Path,
    timeout: float = 600,
    extra_args: tuple = ("--skip-doctor",),
    root: Path = ROOT,
    steady_from: int | None = None,
) -> dict:
    """One `fleetrl train` in its own parent directory; returns exit code, wall seconds,
    per-iteration metrics, summary, the run directory and the foreign CPU load meanwhile.
    `root`: the tree whose fleetrl runs (another commit's: `base_tree`), its cwd. With
    `steady_from` W, also `steady_cores`: the cores the run's own processes kept busy from the end
    of iteration W to its last (`tree_cpu.SteadyCpu`)."""
    parent.mkdir(parents=True, exist_ok=True)
    command = [
        *FLEETRL,
        "train",
        config,
        f"runner.run_dir={parent}",
        "runner.tensorboard=false",
        *overrides,
        *extra_args,
    ]
    daemons_before = ray_daemon_pids()
    started = time.time()
    with ForeignLoad() as load:
        process = subprocess.Popen(
            command, cwd=root, env=subprocess_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        sampler = SteadyCpu(process.pid, parent, steady_from) if steady_from is not None else nullcontext()
        with sampler:
            try:
                _, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate()
    result = subprocess.CompletedProcess(command, process.returncode, "", stderr)
    ended = time.time()
    runs = sorted(p for p in parent.iterdir() if p.is_dir())
    run_dir = runs[-1] if runs else None
    metrics, summary, report = read_run(run_dir) if run_dir is not None else ([], None, None)
    (parent / "stderr.txt").write_text(result.stderr)
    time.sleep(0.5)
    # Ray names its session directory session_<date>_<time>_<micro>_<pid of the starting driver>:
    # a daemon of *this* run carries the fleetrl process's pid there (others' clusters do not).
    leftovers = sorted(pid for pid in ray_daemon_pids() - daemons_before if started_by(pid, process.pid))
    return {
        "command": command,
        "code": result.returncode,
        "started": started,
        "ended": ended,
        "wall_s": ended - started,
        "metrics": metrics,
        "summary": summary,
        "report": report,
        "run_dir": str(run_dir) if run_dir else None,
        "foreign_cores": load.cores,
        "own_cores": load.own_cores,
        "stderr_tail": result.stderr[-2000:],
        "leftover_ray_pids": leftovers,
        **({"steady_cores": sampler.cores()} if steady_from is not None else {}),
    }


def read_run(run_dir: Path) -> tuple[list[dict], dict | None, dict | None]:
    """A run directory's (metrics.jsonl records, summary.json, hang_report.json); what is missing
    is empty or None."""
    metrics_path, summary_path, report_path = (
        run_dir / n for n in ("metrics.jsonl", "summary.json", "hang_report.json")
    )
    metrics = (
        [json.loads(line) for line in metrics_path.read_text().splitlines() if line] if metrics_path.is_file() else []
    )
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    return metrics, summary, report


TRAIN_LOG_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO (run directory|it (\d+) \|)")


def train_log_times(train_log: Path) -> tuple[float | None, dict[int, float]]:
    """(epoch time of train.log's first 'run directory' line, i.e. the start of training, or None;
    {iteration: epoch time of its 'it N |' line}), to the millisecond."""
    start, lines = None, {}
    if not train_log.exists():
        return start, lines
    for line in train_log.read_text().splitlines():
        match = TRAIN_LOG_LINE.match(line)
        if not match:
            continue
        stamp = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1e3
        if match.group(4) is None:
            start = start or stamp
        else:
            lines[int(match.group(4))] = stamp
    return start, lines


def steady(metrics: list[dict], warmup: int) -> dict:
    """Throughput and per-phase medians over the iterations after the first `warmup` ones:
    env steps / training wall seconds between the end of iteration `warmup` and the last one."""
    if len(metrics) <= warmup:
        raise RuntimeError(f"only {len(metrics)} iterations; need more than {warmup} (warm-up)")
    first, last = metrics[warmup - 1] if warmup else {"global_step": 0, "wall_s": 0.0}, metrics[-1]
    kept = metrics[warmup:]
    steps = last["global_step"] - first["global_step"]
    per_iter_steps = statistics.median(b["global_step"] - a["global_step"] for a, b in zip([first, *kept[:-1]], kept))
    return {
        "steps_per_s": steps / (last["wall_s"] - first["wall_s"]),
        "iterations": len(kept),
        "steps_per_iter": per_iter_steps,
        "collect_s": statistics.median(m["time_collect_s"] for m in kept),
        "update_s": statistics.median(m["time_update_s"] for m in kept),
        "sync_s": statistics.median(m.get("time_weight_sync_s", 0.0) for m in kept),
        # (asynchronous training's records have no weight-sync time: its loads ride on the collection)
        "iter_s": statistics.median(
            m.get("time_weight_sync_s", 0.0) + m["time_collect_s"] + m["time_update_s"] for m in kept
        ),
    }


def run_interleaved(
    config: str,
    variants: dict[str, list[str]],
    reps: int,
    out: Path,
    warmup: int,
    timeout: float = 600,
    roots: dict[str, Path] | None = None,
    steady_cores: bool = False,
) -> dict[str, list[dict]]:
    """Every variant once per repetition, the order rotating each repetition (ABC, BCA, CAB, ...),
    so slow drifts in the machine's other load fall on all variants alike. `roots`: the tree a
    variant runs from, where not this one (`run_fleetrl`); `steady_cores`: measure each run's own
    cores after the warm-up (`run_fleetrl`'s `steady_from`)."""
    names = list(variants)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for _index, name in enumerate(names[shift:] + names[:shift]):
            slug = "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
            log(f"rep {rep + 1}/{reps}: {name}")
            root = (roots or {}).get(name, ROOT)
            steady_from = warmup if steady_cores else None
            run = run_fleetrl(
                config, variants[name], out / f"{slug}-{rep}", timeout=timeout, root=root, steady_from=steady_from
            )
            if run["code"] != 0:
                log(f"  FAILED (exit {run['code']}): {run['stderr_tail'][-600:]}")
            else:
                run["steady"] = steady(run["metrics"], warmup)
                log(
                    f"  {run['steady']['steps_per_s']:.0f} steps/s, collect {run['steady']['collect_s']:.3f} s/iter, "
                    f"foreign load {run['foreign_cores']:.2f} cores"
                )
            if run["leftover_ray_pids"]:
                log(f"  Ray daemons of this run still alive after it: {run['leftover_ray_pids']}")
            runs[name].append(run)
    return runs


def collect_rate(run: dict) -> float:
    """Env steps per second of collecting alone, in a run's steady state (`steady`)."""
    return run["steady"]["steps_per_iter"] / run["steady"]["collect_s"]


def first_at_target(records: list[dict], target: float) -> dict | None:
    """The first metrics record whose mean return over the last 100 episodes (100 at least) is at
    or over `target`: where a run reaches it (`runner.target_return` stops the run there)."""
    return next(
        (
            record
            for record in records
            if record.get("episodes", 0) >= 100
            and record.get("episode_return_last100") is not None
            and record["episode_return_last100"] >= target
        ),
        None,
    )


def train_to_target(
    config: str | Path,
    overrides: list[str],
    parent: Path,
    name: str,
    target: float | None,
    timeout: float,
    executable: str | None = None,
) -> dict:
    """One `fleetrl train` (with `overrides`) that stops once the mean return of its last 100
    episodes reaches `target`, or at its step budget (the only end, with no target); its output
    in parent/<name>.log.

    Returns the command, exit code ("timeout" when killed after `timeout` s), wall seconds, and,
    for a run that finished: its run directory, metrics records and summary; `startup_s`, spawn →
    train.log's first line (fleetrl's own summary.startup_s reads the process's start from
    /proc/stat's whole-second clock); where the target was reached, `steps_to_target` and
    `train_s_to_target`, train.log's first line → the line of the iteration that reached it (both
    to the millisecond). On failure, `error` says where the log is."""
    parent.mkdir(parents=True, exist_ok=True)
    command = [
        fleetrl_executable(executable),
        "train",
        str(config),
        *overrides,
        f"runner.target_return={'null' if target is None else target}",
        f"runner.run_dir={parent}",
        f"runner.name={name}",
    ]
    log_path = parent / f"{name}.log"
    earlier = set(parent.glob(f"{name}-*"))  # an earlier attempt of the same job
    with open(log_path, "w") as out:
        spawn = time.time()
        try:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:  # run() has killed it
            code = "timeout"
        ended = time.time()
    job = {"command": command, "returncode": code, "log": str(log_path), "total_wall_s": ended - spawn}
    finished = sorted(p.parent for p in parent.glob(f"{name}-*/summary.json") if p.parent not in earlier)
    if code != 0 or not finished:
        job["error"] = f"fleetrl train exited {code}; see {log_path}"
        log(job["error"])
        return job
    run_dir = finished[-1]
    records, summary, _ = read_run(run_dir)
    start, stamps = train_log_times(run_dir / "train.log")
    crossing = None if target is None else first_at_target(records, target)
    job.update(
        run_dir=str(run_dir),
        records=records,
        summary=summary,
        startup_s=(start - spawn) if start else summary["startup_s"],
        global_step=summary["global_step"],
        train_s_total=summary["train_s"],
        target_return=target,
        target_reached=crossing is not None,
        steps_to_target=None,
        train_s_to_target=None,
        last100_final=summary.get("episode_return_last100"),
    )
    if crossing is not None:
        reached_at = stamps.get(crossing["iteration"])
        job.update(
            steps_to_target=crossing["global_step"],
            last100_at_target=crossing["episode_return_last100"],
            train_s_to_target=(reached_at - start) if start and reached_at else None,
        )
    return job

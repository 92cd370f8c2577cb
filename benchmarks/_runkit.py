"""Shared plumbing for every benchmark script: run `fleetrl train` as a subprocess, read its run
directory, measure the CPU that *other* processes used meanwhile (and wait for a quiet machine),
find the comparison libraries' venvs and their versions, describe the machine, format result
cells, and check that no Ray daemon of ours is left behind.

Not part of fleetrl; nothing here changes how fleetrl runs.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
VENVS = BENCH / ".venvs"  # the comparison libraries' venvs (setup_venvs.sh)
FLEETRL = [sys.executable, "-m", "fleetrl"]
RAY_DAEMONS = ("raylet", "gcs_server")
# Overrides for runs that compare throughput: the same fixed work in every run (no stop at the
# target return, no checkpoints or console lines inside the measured iterations).
FIXED_WORK = ["runner.checkpoint_interval=100000", "runner.log_interval=1000", "runner.target_return=null"]


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def results_dir(name: str) -> Path:
    """A new benchmarks/results/<name>-<time>/ folder (-2, -3, ... for a second run started in
    the same second: two runs side by side once wrote one results.json), announced on the log."""
    stamp = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    path, copy = RESULTS / stamp, 1
    while True:
        try:
            path.mkdir()
            break
        except FileExistsError:
            copy += 1
            path = RESULTS / f"{stamp}-{copy}"
    log(f"results in {path}")
    return path


def venv_python(name: str) -> Path:
    """The Python of benchmarks/.venvs/<name> (made by setup_venvs.sh)."""
    return VENVS / name / "bin" / "python"


def fleetrl_executable(override: str | None = None) -> str:
    """The `fleetrl` console script: `override` if given, else the one beside this Python, else
    the repository's .venv's."""
    if override:
        return override
    candidate = Path(sys.executable).parent / "fleetrl"
    return str(candidate if candidate.exists() else ROOT / ".venv" / "bin" / "fleetrl")


def subprocess_env(root: Path = ROOT) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.pop("PYTHONWARNINGS", None)
    return env


# ---------------------------------------------------------------- other load on the machine


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, of which steal) CPU-seconds of the whole machine since boot (/proc/stat, all cores).
    Steal counts as busy: time the hypervisor gave another guest slows a job as much as a local
    process does."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, steal / tick


def own_cpu_seconds() -> tuple[float, float]:
    """(this process, its waited-for descendants) CPU-seconds."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


class ForeignLoad:
    """Over a `with` block: `cores`, the average number of cores busy with processes that are not
    this one or its waited-for children (steal included); `steal_cores`; `own_cores`;
    `children_cpu_s`; `wall_s`. (Ray daemons that outlive the waited-for child are counted as
    foreign: an overestimate.)"""

    def __enter__(self):
        self.t0, (self.busy0, self.steal0), (self.me0, self.kids0) = (
            time.monotonic(),
            machine_cpu_seconds(),
            own_cpu_seconds(),
        )
        return self

    def __exit__(self, *exc):
        self.wall_s = max(time.monotonic() - self.t0, 1e-9)
        (busy, steal), (me, kids) = machine_cpu_seconds(), own_cpu_seconds()
        self.children_cpu_s = kids - self.kids0
        own = me - self.me0 + self.children_cpu_s
        self.cores = max(0.0, (busy - self.busy0 - own) / self.wall_s)
        self.own_cores = own / self.wall_s
        self.steal_cores = (steal - self.steal0) / self.wall_s
        return False

    def record(self) -> dict:
        return {"foreign_cores": self.cores, "steal_cores": self.steal_cores, "wall_s": self.wall_s}


def wait_for_quiet(threshold: float, max_wait: float) -> dict:
    """Wait (at most `max_wait` s) until other processes use < `threshold` cores over two
    consecutive 0.5 s windows: the comparisons time 1-2-thread jobs that slow down several-fold
    under contention."""
    started, quiet, busiest = time.monotonic(), 0, 0.0
    while time.monotonic() - started < max_wait:
        with ForeignLoad() as load:
            time.sleep(0.5)
        busiest = max(busiest, load.cores)
        quiet = quiet + 1 if load.cores < threshold else 0
        if quiet >= 2:
            return {"waited_s": time.monotonic() - started, "quiet": True}
    return {"waited_s": time.monotonic() - started, "quiet": False, "busiest_cores": busiest}


# ---------------------------------------------------------------- fleetrl runs


def ray_daemon_pids() -> set[int]:
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
) -> dict:
    """One `fleetrl train` in its own parent directory; returns exit code, wall seconds,
    per-iteration metrics, summary, the run directory and the foreign CPU load meanwhile.
    `root`: the tree whose fleetrl runs (another commit's: `base_tree`), its cwd."""
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
        "iter_s": statistics.median(m["time_weight_sync_s"] + m["time_collect_s"] + m["time_update_s"] for m in kept),
    }


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spread(values) -> str:
    values = list(values)
    if not values:
        return "–"
    return f"{min(values):.3g}–{max(values):.3g}"


def med(values: list) -> float | None:
    """The median of the values that are not None (None if there are none)."""
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def fmt(value, digits: int = 1, thousands: bool = False) -> str:
    """A result cell: n/a for None, 'not reached' for infinity."""
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "not reached"
    return f"{value:,.0f}" if thousands else f"{value:.{digits}f}"


def cell(values: list, digits: int = 1, thousands: bool = False) -> str:
    """'median (min–max)' of the values that are not None."""
    clean = [v for v in values if v is not None]
    if not clean:
        return "n/a"
    text = fmt(statistics.median(clean), digits, thousands)
    if len(clean) > 1:
        text += f" ({fmt(min(clean), digits, thousands)}–{fmt(max(clean), digits, thousands)})"
    return text


def ratio(a, b) -> str:
    if a is None or b is None or math.isinf(a) or math.isinf(b) or b == 0:
        return "n/a"
    return f"{a / b:.2f}"


# ---------------------------------------------------------------- description


VERSION_PROBES = {  # what each venv reports about itself, as one JSON line
    "fleetrl": "import torch, gymnasium, numpy; from importlib.metadata import version; "
    "print(json.dumps({'torch': torch.__version__, 'gymnasium': gymnasium.__version__, "
    "'numpy': numpy.__version__, 'fleetrl': version('fleetrl')}))",
    "sb3": "import torch, gymnasium, numpy, stable_baselines3; print(json.dumps({'torch': "
    "torch.__version__, 'gymnasium': gymnasium.__version__, 'numpy': numpy.__version__, "
    "'stable_baselines3': stable_baselines3.__version__}))",
    "cleanrl": "import warnings; warnings.filterwarnings('ignore'); import torch, gym, numpy; "
    "from importlib.metadata import version; print(json.dumps({'torch': torch.__version__, "
    "'gym': gym.__version__, 'numpy': numpy.__version__, 'cleanrl': version('cleanrl')}))",
}


def venv_versions(pythons: dict[str, tuple[str | Path, str]]) -> dict:
    """{key: (python, probe name in VERSION_PROBES)} → {key: that Python's versions, or why not}."""
    found = {}
    for key, (python, probe) in pythons.items():
        try:
            code = "import json; " + VERSION_PROBES[probe]
            done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
            found[key] = json.loads(done.stdout.strip().splitlines()[-1])
        except Exception as error:  # noqa: BLE001 - recorded, not fatal
            found[key] = f"unavailable: {error!r}"
    return found


def cpu_model() -> str:
    return next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )


def machine() -> dict:
    import torch

    info = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "loadavg": os.getloadavg(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    for package in ("ray", "gymnasium", "mujoco", "numpy"):
        try:
            info[package] = __import__(package).__version__
        except Exception:  # noqa: BLE001 - optional
            info[package] = "absent"
    try:
        from importlib.metadata import version

        info["fleetrl"] = version("fleetrl")
    except Exception:  # noqa: BLE001
        info["fleetrl"] = "?"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "fleetrl"], cwd=ROOT, capture_output=True, text=True)
    info["commit"] = commit.stdout.strip() + (" + uncommitted changes in fleetrl/" if dirty.stdout.strip() else "")
    return info


def machine_line(info: dict) -> str:
    return (
        f"{info['date']}; {info['cpus']} × {info['cpu_model']} ({info.get('gpu') or 'no GPU'}), Linux "
        f"{info['kernel']}; Python {info['python']}, torch {info['torch']}, ray {info['ray']}, gymnasium "
        f"{info['gymnasium']}, mujoco {info['mujoco']}, numpy {info['numpy']}; fleetrl {info['fleetrl']} "
        f"at {info['commit']}; load average at start {info['loadavg'][0]:.2f}"
    )


def placement_threads(config: str, overrides: list[str]) -> str:
    """The torch thread count of each worker, as fleetrl's placement resolves it."""
    from fleetrl.plan.layout import worker_processes
    from fleetrl.plan.load import load_unchecked
    from fleetrl.plan.resolve import resolve

    plan = resolve(load_unchecked(ROOT / config, [o for o in overrides if "=" in o]))
    cfg, layout = plan.config, plan.layout
    if layout.backend == "inline":
        return f"inline: 1 process, runner.torch_threads={cfg.runner.torch_threads}"
    parts = [f"{a.component}{a.rank}@node{a.node}:{a.cpu_threads}" for a in worker_processes(layout)]
    return "ray: " + ", ".join(parts) + f"; controller runner.torch_threads={cfg.runner.torch_threads}"


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))


def run_interleaved(
    config: str,
    variants: dict[str, list[str]],
    reps: int,
    out: Path,
    warmup: int,
    timeout: float = 600,
    roots: dict[str, Path] | None = None,
) -> dict[str, list[dict]]:
    """Every variant once per repetition, the order rotating each repetition (ABC, BCA, CAB, ...),
    so slow drifts in the machine's other load fall on all variants alike. `roots`: the tree a
    variant runs from, where not this one (`run_fleetrl`)."""
    names = list(variants)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for _index, name in enumerate(names[shift:] + names[:shift]):
            slug = "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
            log(f"rep {rep + 1}/{reps}: {name}")
            root = (roots or {}).get(name, ROOT)
            run = run_fleetrl(config, variants[name], out / f"{slug}-{rep}", timeout=timeout, root=root)
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


def throughput_table(
    runs: dict[str, list[dict]], threads: dict[str, str], baseline: str, extra_columns: dict | None = None
) -> str:
    """Markdown: throughput (median, range, ratio to `baseline`) and per-phase medians."""
    extra_columns = extra_columns or {}
    ok = {name: [r for r in rs if r["code"] == 0] for name, rs in runs.items()}
    base = median(r["steady"]["steps_per_s"] for r in ok[baseline])
    head = [
        "variant",
        "runs ok",
        "env steps/s median (range)",
        f"vs {baseline}",
        "collect s/iter",
        "update s/iter",
        "weight sync s/iter",
        *extra_columns,
        "start-up s (median)",
        "end-to-end wall s",
        "other load, cores",
        "torch threads",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rs in ok.items():
        if not rs:
            lines.append(f"| {name} | 0/{len(runs[name])} |" + " – |" * (len(head) - 2))
            continue
        sps = [r["steady"]["steps_per_s"] for r in rs]
        cells = [
            name,
            f"{len(rs)}/{len(runs[name])}",
            f"{median(sps):.0f} ({spread(sps)})",
            f"{median(sps) / base:.2f}×",
            f"{median(r['steady']['collect_s'] for r in rs):.3f}",
            f"{median(r['steady']['update_s'] for r in rs):.3f}",
            f"{median(r['steady']['sync_s'] for r in rs):.4f}",
            *[fn(rs) for fn in extra_columns.values()],
            f"{median(r['summary']['startup_s'] for r in rs):.1f}",
            f"{median(r['wall_s'] for r in rs):.1f}",
            f"{median(r['foreign_cores'] for r in rs):.2f}",
            threads.get(name, "?"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- before/after in child processes


def per_call_us(function, calls: int) -> float:
    """CPU time of this process (all its threads) per call: on a loaded host, wall time mostly
    measures the wait for a core."""
    function()  # warm-up
    started = time.process_time()
    for _ in range(calls):
        function()
    return (time.process_time() - started) / calls * 1e6


def base_tree(ref: str, into: Path, paths: tuple[str, ...] = ("fleetrl",)) -> Path:
    """`ref`'s `fleetrl` package (and `paths`) extracted under `into` (for PYTHONPATH=into): the 'before'."""
    archive = subprocess.run(["git", "archive", ref, *paths], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def before_after(base: str, rounds: int, module: str, call: str, drop_env: tuple = ()) -> dict[str, list[dict]]:
    """`{"before": [...], "after": [...]}`: `module.call` (a function call in benchmarks/<module>.py
    returning JSON-able data) run `rounds` times in child processes, alternating between `base`'s
    fleetrl and this tree's, without the variables `drop_env`."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        trees = {"before": base_tree(base, Path(folder)), "after": ROOT}
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(rounds):
            for name, tree in trees.items():
                env = {k: v for k, v in os.environ.items() if k not in drop_env}
                code = f"import json, sys; sys.path.insert(0, {str(BENCH)!r}); import {module} as m; print(json.dumps(m.{call}))"
                done = subprocess.run(
                    [sys.executable, "-c", code],
                    cwd=tree,
                    env={**env, "PYTHONPATH": str(tree)},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs

"""What tests share besides fixtures: how to run fleetrl as a user would (`fleetrl`, `train`,
`Fleetrl` for a run a test signals), and how to find the processes a test started. Test modules
import from here and from the other support modules, never from each other or conftest.

Every `python -m fleetrl` a test runs goes through `Fleetrl`: its wait is bounded (on timeout the
driver and every process it started are killed and the test fails), and once it has ended, every
process it started must end within `TEARDOWN_BOUND_S`. Which processes those are is the test's
own account, not fleetrl's: the driver's descendants, sampled while it runs (`Descendants`; Ray's
daemons and workers, the janitor, env subprocesses: all descend from it, orphans through the
supervisor, a subreaper), and, for what may have started between the last sample and the exit,
the processes marked as the run's (`ray_processes_of`) — other Ray sessions on the machine are
not the test's business.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from fleetrl.run_dir import SUMMARY_FILE
from fleetrl.tracking.jsonl import read_metrics
from fleetrl.watch.reporting.hang_report import REPORT_JSON

REPO = Path(__file__).resolve().parent.parent
# LeRobotDatasets written and read back by LeRobot's own code (benchmarks/compare/lerobot_datasets.py)
LEROBOT_DATASETS = REPO / "tests" / "data" / "lerobot"
FLEETRL = [sys.executable, "-m", "fleetrl"]
# The advantages a VLA pipeline test crosses with the families: GAE, and GRPO's groups of 2 envs
# (each of 2 ranks holds whole groups of the 4 envs)
ADVANTAGES = {
    "ppo": [],
    "grpo": ["algorithm.adv_type=grpo", "algorithm.norm_adv=false", "algorithm.group_size=2"],
}
# 2 FSDP actor ranks and a rollout worker of their own, sent the adapters after each update
TWO_FSDP_RANKS_ON_RAY = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, rollout: 0, env: 0}",
    "actor.strategy=fsdp",
]
# 2 DDP actor ranks and one rollout and one env rank as Ray workers, on one simulated 2-slot node
TWO_ACTOR_RANKS_ON_RAY = [
    "runner.tensorboard=false",
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0-1, rollout: 0, env: 0}",
]
# 2 env workers in 2 pipeline stages each (4 lanes) served by one rollout worker, as Ray actors
FOUR_LANES_ON_RAY = [
    "cluster.backend=ray",
    "cluster.devices_per_node=2",
    "cluster.component_placement={actor: 0, env: 0-1, rollout: 0}",
    "rollout.pipeline_stage_num=2",
]
# What a loaded 2-core CI host adds to anything the product promises within a configured time: a
# heartbeat thread's or the watchdog's turn on a core, Ray's notice of a dead actor, a report
# written. A bound is the promised figure plus this, never a figure measured on a quiet host; the
# one margin of every bound of the suite.
LOADED_HOST_MARGIN_S = 5


def detection_s(report: dict) -> float:
    """How long the watchdog took to detect the incident of hang report `report`, of the time it
    ran: `detected_after_s` less the seconds the watchdog itself did not run (`watcher_absent_s`:
    its thread got no turn on a loaded host for longer than any margin) and, for a busy call, the
    seconds its thread waited for a CPU (`cpu_wait_s`: the busy allowance does not count them).
    The promised figures bound this; both are the host's, and the report says them."""
    absent, waited = report["watcher_absent_s"], report["cpu_wait_s"]
    assert 0 <= absent <= report["detected_after_s"], (absent, report["detected_after_s"])
    assert waited == 0 or report["state"] == "busy", report
    return report["detected_after_s"] - absent - waited


# The promise "every process of the run is gone within 10 s of detection" (fleetrl/watch/respond.py
# TEARDOWN_PROMISE_S), as the tests hold it: from the report's detection to the last process the
# test saw of the run ended; and from a run's own exit to the end of everything it started.
TEARDOWN_PROMISE_S = 10.0
TEARDOWN_BOUND_S = TEARDOWN_PROMISE_S + LOADED_HOST_MARGIN_S
# The wait for a run that trains to a target return: it ends a run that hangs despite its watchdog,
# and makes no speed claim (the learning claims are in env steps: `summary["target_reached_step"]`).
LEARNING_GUARD_S = 1800
# The robot task set as the VLA pipeline tests play it: 32×32 images, 8-step episodes
PANDA_ENV = "fleetrl.envs.manipulation:PandaTasks"
PANDA_SFT_ENV = {"tasks": ["reach", "push"], "image_size": 32, "max_steps": 8}
TIMING_METRICS = ("wall_s", "steps_per_s", "time_weight_sync_s", "time_collect_s", "time_update_s")


# What each env⇄rollout exchange logs on FOUR_LANES_ON_RAY (four_lane_cartpole), and the direct
# channels (`cluster.exchange: auto`) for the seed layout (2 env ranks x 2 stages on another node)
COMPILED_LINE = "[fleetrl] env⇄rollout exchange: compiled graph (4 lanes, 8 steps per execution)"
DIRECT_LINE = "[fleetrl] env⇄rollout exchange: direct worker-to-worker channels (4 lanes)"
CLASSIC_LINE = "[fleetrl] env⇄rollout exchange: classic actor calls (cluster.exchange: classic)"


def four_lane_cartpole(runs, *overrides: str, iterations: int = 4) -> list[str]:
    """`fleetrl train` args: `iterations` iterations of 128 CartPole steps on FOUR_LANES_ON_RAY,
    each a weight sync and 16 steps of every lane."""
    return [
        "train",
        "configs/ppo_cartpole.yaml",
        f"runner.run_dir={runs}",
        *FOUR_LANES_ON_RAY,
        "env.num_envs=8",
        "algorithm.num_steps=16",
        "algorithm.minibatch_size=64",
        "algorithm.update_epochs=2",
        f"runner.total_env_steps={iterations * 128}",
        "runner.tensorboard=false",
        "--skip-doctor",
        *overrides,
    ]


def held_cartpole(runs: Path, hold: Path, *overrides: str) -> list[str]:
    """`fleetrl train` args for a run a test looks at while it trains: CartPole on one env whose
    every step takes 0.3 s while the file `hold` exists (tests/live_envs.py), so the run stays in
    training while the test looks, and goes quickly to its end once the test removes `hold`;
    8-step iterations of one update epoch. `overrides` (the backend, the length) come last."""
    return [
        "train",
        "configs/ppo_cartpole.yaml",
        f"runner.run_dir={runs}",
        "runner.tensorboard=false",
        "env.id=tests.live_envs:HeldCartPole",
        f"env.kwargs={{hold_file: {hold}}}",
        "env.num_envs=1",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=8",
        "algorithm.update_epochs=1",
        "--skip-doctor",
        *overrides,
    ]


def wait_for(running: Fleetrl, what: str, found, timeout_s: float = 120.0):
    """Poll `found()` until it returns something truthy, and return that; fail naming `what` (with
    the run's stderr) after `timeout_s` or once the run has ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running.process.poll() is None:
        value = found()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"{what}: not within {timeout_s:g} s; stderr:\n{running.stderr_so_far()[-3000:]}", pytrace=False)


def iterations_logged(runs: Path) -> int:
    """How many iterations the one run under `runs` has logged (metrics.jsonl's records)."""
    metrics = list(runs.glob("*/metrics.jsonl"))
    return len([line for line in metrics[0].read_text().splitlines() if line.strip()]) if metrics else 0


def first_iteration(runs: Path, running: Fleetrl, timeout_s: float = 180) -> Path:
    """The run directory under `runs`, once the run has logged its first iteration; fails the
    test if the run ends or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not (metrics := list(runs.glob("*/metrics.jsonl"))) or not metrics[0].read_text().strip():
        assert running.process.poll() is None, running.stderr_so_far()[-3000:]
        assert time.monotonic() < deadline, "no iteration logged: " + running.stderr_so_far()[-3000:]
        time.sleep(0.5)
    return metrics[0].parent


@contextlib.contextmanager
def refusing_port():
    """A 127.0.0.1 port that refuses every connection while the block runs: bound, so no other
    process can take it meanwhile, and never listening (a closed port, probed and released,
    could be anyone's by the time it is used)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def subprocess_env() -> dict:
    """Environment for `python -m fleetrl` subprocesses: plain, non-interactive, and able to
    import `tests.envs` entry points."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("PYTHONWARNINGS", None)
    return env


def describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid} {process.name()!r} ({' '.join(process.cmdline())[:200]})"
    except psutil.Error:
        return f"pid {process.pid} (gone while describing)"


def is_interpreter_helper(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker / forkserver: one per interpreter, started the first
    time a spawn-context lock or shared array is made, and meant to live until the interpreter
    exits. Not something a test started or can end."""
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return "multiprocessing.resource_tracker" in command or "multiprocessing.forkserver" in command


def has_ended(process: psutil.Process) -> bool:
    """Gone, or a zombie: it has exited and only its parent's reaping is left. Not a leftover — a
    pytest worker made a child subreaper by an in-process watched run (`become_subreaper`)
    inherits every orphan that ends later, and nothing of its own waits for them."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def own_children() -> list[psutil.Process]:
    """The descendants of this process still running, but the interpreter's own helpers."""
    return [p for p in psutil.Process().children(recursive=True) if not is_interpreter_helper(p) and not has_ended(p)]


@contextlib.contextmanager
def reaping_new_children():
    """Inside: a block that starts processes of this one's — an in-process Ray's daemons, which
    `ray.shutdown()` ends but on a loaded host may leave unreaped (zombies) or still ending. After
    it: each child that appeared meanwhile is killed and reaped, so the next test in this pytest
    worker finds no child it did not start."""
    before = {child.pid for child in psutil.Process().children()}
    try:
        yield
    finally:
        left = [child for child in psutil.Process().children() if child.pid not in before]
        for child in left:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(left, timeout=30)


def end_leftovers(processes: list[psutil.Process], what: str, grace_s: float = TEARDOWN_BOUND_S) -> None:
    """Fail naming whichever of `processes` is still alive after a grace period (for processes
    already on their way out: vector-env workers after close(), a run's Ray workers on a cluster
    the test started, which Ray ends after the run's driver: by default the teardown promise's
    bound); kill those, so one leaky test does not fail the ones after it."""
    if not processes:
        return
    _, alive = psutil.wait_procs(processes, timeout=grace_s)  # also reaps exited children (no zombies)
    leftovers = [p for p in alive if p.is_running()]
    if not leftovers:
        return
    names = [describe(p) for p in leftovers]
    end(leftovers)
    pytest.fail(f"{what} left {len(names)} process(es) alive: " + "; ".join(names), pytrace=False)


class Descendants:
    """Every process descended from `root_pid`, sampled every `SAMPLE_S` by a daemon thread until
    `stop` (a process that outlives its parent is reparented and would be lost to a later walk;
    sampled while the run goes on, it is not). `gone_at()` waits for them all to end."""

    SAMPLE_S = 0.25

    def __init__(self, root_pid: int):
        self.root_pid = root_pid
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.sample_until_stopped, name="descendants", daemon=True)
        self.thread.start()

    def sample(self) -> bool:
        """Take a sample now; False once the root is gone (its orphans are someone else's)."""
        try:
            self.add(psutil.Process(self.root_pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return False
        return True

    def sample_until_stopped(self) -> None:
        while not self.stopped.wait(self.SAMPLE_S) and self.sample():
            pass

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()

    def add(self, processes: list[psutil.Process]) -> None:
        for process in processes:
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault((process.pid, process.create_time()), process)

    def running(self) -> list[psutil.Process]:
        """Those still running (a zombie has ended: its reaping is its parent's)."""
        alive = []
        for process in list(self.seen.values()):
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        return alive

    def gone_at(self, timeout_s: float) -> float | None:
        """When the last of them had ended (polled every 50 ms), or None if some still run after
        `timeout_s`; our own children among them are reaped."""
        deadline = time.monotonic() + timeout_s
        while alive := self.running():
            if time.monotonic() >= deadline:
                return None
            psutil.wait_procs([p for p in alive if p.ppid() == os.getpid()], timeout=0)
            time.sleep(0.05)
        return time.time()


def ray_processes_of(driver_pid: int) -> list[psutil.Process]:
    """Ray daemons and workers of the session a driver started (its session directory and its
    actors' names end in the driver's pid), and every process of a `fleetrl train` run, whose
    supervisor marks their environment with its pid (`FLEETRL_SUPERVISOR_PID`); other sessions
    on this machine are not ours."""
    mark = re.compile(rf"(session_[0-9_-]+_{driver_pid}\b|fleetrl-\w+-\d+-{driver_pid}\b)")
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if mark.search(" ".join(process.info["cmdline"] or [])) or run_mark(process) == str(driver_pid):
            found.append(process)
    return found


def run_mark(process: psutil.Process) -> str | None:
    try:
        return process.environ().get("FLEETRL_SUPERVISOR_PID")
    except psutil.Error:
        return None


@dataclass(frozen=True)
class Finished:
    """What an ended `python -m fleetrl` left: its exit code and output, and, where it was given a
    runs folder, its one run directory (None where it made none) with what that holds then."""

    code: int
    stdout: str
    stderr: str
    run_dir: Path | None
    metrics: list[dict]
    summary: dict | None
    hang_report: dict | None
    ended_at: float | None = None  # when the test saw the driver exit (time.time())
    gone_at: float | None = None  # when every process the driver started had ended, as the test saw

    def succeeded(self) -> Finished:
        """Assert a clean finish (exit 0, a run directory, no incident report); returns self."""
        assert self.code == 0, self.stderr[-4000:]
        assert self.run_dir is not None and self.hang_report is None, (self.run_dir, self.hang_report)
        return self


class Fleetrl:
    """`python -m fleetrl ARGS` running in a subprocess (cwd `cwd`, `env` added to its environment,
    run directories under `runs` when the caller points it there). Use it as a context manager:
    whatever happens in the block, the driver and every process it started are ended when it
    leaves."""

    def __init__(
        self, *args: str, cwd: Path = REPO, runs: Path | None = None, env: Mapping[str, str] = {}, shell: bool = False
    ):
        """With `shell`, `args` is one command line as a user types it (`fleetrl ...`, with its own
        environment assignments), run by bash, which execs it: the driver's pid is fleetrl's."""
        self.args, self.runs, self.ended = args, runs, False
        self.ended_at: float | None = None
        self.gone_at: float | None = None
        self.stdout, self.stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # no pipe fills up
        self.process = subprocess.Popen(
            ["bash", "-c", *args] if shell else [*FLEETRL, *args],
            cwd=cwd,
            env={**subprocess_env(), **env},
            stdout=self.stdout,
            stderr=self.stderr,
        )
        self.descendants = Descendants(self.process.pid)

    def __enter__(self) -> Fleetrl:
        return self

    def __exit__(self, *exc_info) -> None:
        if not self.ended:  # the block failed before `finish`: end the run, whatever its state
            self.kill()
        self.descendants.stop()
        self.stdout.close()
        self.stderr.close()

    def finish(self, timeout: float) -> Finished:
        """Wait for the exit; fail the test (its processes killed) after `timeout` seconds, or
        when a process it started is still running `TEARDOWN_BOUND_S` after it."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(
                f"fleetrl {' '.join(self.args)} still running after {timeout:g} s (killed); stderr:\n"
                + self.output(self.stderr)[-3000:],
                pytrace=False,
            )
        self.ended_at = time.time()
        self.ended = True
        self.wait_for_the_rest()
        return self.finished()

    def wait_for_the_rest(self) -> None:
        """Every process the driver started ends within TEARDOWN_BOUND_S of its exit, or the test
        fails naming them (killed)."""
        self.descendants.stop()
        self.descendants.add(ray_processes_of(self.process.pid))
        self.gone_at = self.descendants.gone_at(TEARDOWN_BOUND_S)
        if self.gone_at is None:
            end_leftovers(self.descendants.running(), f"fleetrl {self.args[0]}", grace_s=0)

    def kill_9(self) -> list[str]:
        """`kill -9` of the driver alone, as a user's would be: what it started is left to the run's
        own guards (the janitor). Returns the processes the test saw of the run — every descendant
        sampled up to the kill — still running `TEARDOWN_PROMISE_S` and the loaded host's margin
        later (the test's own account, not the janitor's scanner); the test's exit kills those."""
        self.descendants.sample()
        self.process.kill()
        self.process.wait()
        self.ended_at, self.ended = time.time(), True
        self.descendants.stop()
        self.gone_at = self.descendants.gone_at(TEARDOWN_BOUND_S)
        return [describe(p) for p in self.descendants.running()]

    def kill(self) -> None:
        """SIGKILL the driver and every process it started (its descendants, Ray's daemons)."""
        try:
            family = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        self.process.kill()
        self.process.wait()
        self.descendants.stop()
        end(family + ray_processes_of(self.process.pid) + self.descendants.running())
        self.ended = True

    def finished(self) -> Finished:
        run_dir = None
        if self.runs is not None and self.runs.is_dir():
            made = [path for path in self.runs.iterdir() if path.is_dir()]
            assert len(made) <= 1, f"more than one run directory under {self.runs}: {made}"
            run_dir = made[0] if made else None
        return Finished(
            self.process.returncode,
            self.output(self.stdout),
            self.output(self.stderr),
            run_dir,
            read_metrics(run_dir) if run_dir else [],
            read_json(run_dir / SUMMARY_FILE) if run_dir else None,
            read_json(run_dir / REPORT_JSON) if run_dir else None,
            self.ended_at,
            self.gone_at,
        )

    def stderr_so_far(self) -> str:
        """What the run has written to stderr up to now (it may still be running)."""
        return self.output(self.stderr)

    @staticmethod
    def output(file) -> str:
        """The file's whole content, read at explicit offsets: the child shares the file's
        position, so a seek here would move where its next write lands."""
        size = os.fstat(file.fileno()).st_size
        return os.pread(file.fileno(), size, 0).decode(errors="replace")


def fleetrl(
    *args: str, timeout: float = 300, cwd: Path = REPO, runs: Path | None = None, env: Mapping[str, str] = {}
) -> Finished:
    """Run `python -m fleetrl ARGS` to its end (see `Fleetrl`)."""
    with Fleetrl(*args, cwd=cwd, runs=runs, env=env) as running:
        return running.finish(timeout)


def train(
    config: str, *overrides: str, runs: Path, timeout: float = 300, cwd: Path = REPO, env: Mapping[str, str] = {}
) -> Finished:
    """`fleetrl train CONFIG OVERRIDES` with its run directory under `runs`."""
    return fleetrl(
        "train", str(config), f"runner.run_dir={runs}", *overrides, timeout=timeout, cwd=cwd, runs=runs, env=env
    )


def sft_then_train(tmp_path: Path, sft: tuple[str, ...], rl: tuple[str, ...]) -> tuple[Finished, Finished]:
    """The two-stage pipeline as a user runs it: `fleetrl sft SFT…`, then `fleetrl train RL…
    runner.init_from=<the SFT run>`, each in its own run directory (tmp_path/sft, tmp_path/rl),
    each required to succeed. `sft`, `rl`: each command's config and overrides."""
    first = fleetrl(
        "sft", *sft, f"runner.run_dir={tmp_path / 'sft'}", "--skip-doctor", runs=tmp_path / "sft", timeout=300
    ).succeeded()
    second = fleetrl(
        "train",
        *rl,
        f"runner.init_from={first.run_dir}",
        f"runner.run_dir={tmp_path / 'rl'}",
        "--skip-doctor",
        runs=tmp_path / "rl",
        timeout=300,
    ).succeeded()
    return first, second


def wait_for_watch_file(runs, running: Fleetrl, timeout_s: float = 180):
    """The run's watch.json, once the run has logged its first iteration (its workers listed)."""
    deadline = time.monotonic() + timeout_s
    while not (metrics := list(runs.glob("*/metrics.jsonl"))) or not metrics[0].read_text().strip():
        assert running.process.poll() is None, running.stderr_so_far()[-3000:]
        assert time.monotonic() < deadline, "no iteration logged: " + running.stderr_so_far()[-3000:]
        time.sleep(0.5)
    return metrics[0].parent / "watch.json"


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def controller_of(running: Fleetrl) -> psutil.Process | None:
    """The supervisor's child running `python -m fleetrl.controller`, once it has started."""
    for child in psutil.Process(running.process.pid).children():
        try:
            if "fleetrl.controller" in child.cmdline():
                return child
        except psutil.Error:
            pass
    return None


def processes_alive(pids: list[int]) -> list[str]:
    """Those of `pids` still running (a zombie has ended), described; ends them, so that a failed
    test leaves none behind."""
    alive = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    described = [describe(process) for process in alive]
    end(alive)
    return described


def end(processes: list[psutil.Process]) -> None:
    """SIGKILL each of `processes` (gone already is fine) and reap them."""
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(processes, timeout=10)


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size: str):
    """A real tmpfs of `size` (e.g. '4m') at `mount_point` (a test that uses it is marked
    `needs("root", ...)`), unmounted afterwards even when the test fails."""
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    assert mounted.returncode == 0, f"cannot mount a tmpfs at {mount_point}: {mounted.stderr.strip()}"
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(directory: Path) -> None:
    """Write into `directory` until its file system says ENOSPC, down to the last partial block."""
    chunk = b"\0" * (64 * 1024)
    with open(directory / "ballast", "wb") as ballast:
        try:
            while True:
                ballast.write(chunk)
                ballast.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC
    for size in (4096, 512, 1):  # the last partial blocks
        try:
            with open(directory / f"crumb-{size}", "wb") as crumb:
                while True:
                    crumb.write(b"\0" * size)
                    crumb.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC


def run_janitor(train: Fleetrl, timeout_s: float = 120, other_than: int | None = None) -> tuple[str, psutil.Process]:
    """The run token of a running `fleetrl train` and the janitor it started (supervise/janitor.py),
    found as its child `python -m fleetrl.supervise.janitor TOKEN PID`; `other_than`: not the one
    of that pid (a janitor that replaced it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert train.process.poll() is None, train.stderr_so_far()[-3000:]
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(train.process.pid).children():
                if "fleetrl.supervise.janitor" in child.cmdline() and child.pid != other_than:
                    return child.cmdline()[-2], child
        time.sleep(0.2)
    raise AssertionError("fleetrl train started no janitor")


def host_lacks(need: str) -> str | None:
    """Why this host cannot run a test that needs `need` (`pytest.mark.needs`; tests/conftest.py),
    or None: the test's own probe of the host, never the product's checks (a skip decided by the
    code under test would hide its regression)."""
    if need == "root":
        return None if os.geteuid() == 0 else f"runs as uid {os.geteuid()}"
    if need == "namespaces":  # network, PID and mount namespaces, made with ip and unshare
        missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
        return host_lacks("root") or (f"no {', '.join(missing)} on PATH" if missing else None)
    if need in ("cuda", "no_cuda"):
        import torch

        return (
            None if torch.cuda.is_available() == (need == "cuda") else f"torch sees {torch.cuda.device_count()} GPU(s)"
        )
    if need == "sched_idle":
        return None if hasattr(os, "SCHED_IDLE") else "no SCHED_IDLE scheduling policy (not Linux)"
    if need == "two_cpus":
        return None if len(os.sched_getaffinity(0)) >= 2 else f"{len(os.sched_getaffinity(0))} CPU(s) to run on"
    raise ValueError(f"pytest.mark.needs({need!r}): not a need tests/support.py host_lacks knows")

"""The sweep process: one Ray Tune experiment whose trials are `fleetrl train` runs.

Tune does the scheduling: as many trials at once as their resources (grid.trial_resources) and
`--max-concurrent` allow, a failed trial recorded while the others go on (`max_failures=0`: a
trial is never retried behind the user's back). `Board`, a Tune callback, prints one line per
trial start and end and a periodic status line, and keeps `sweep.json` current.

Invariant: whatever ends the sweep — every trial done, Ctrl-C, SIGTERM — nothing of it is left
running when it returns. The first SIGINT/SIGTERM asks Tune to stop every trial (`StopOnSignal`);
a stopped trial's Tune worker exits and its `fleetrl train` gets SIGTERM (lifetime.py): a clean
stop with a checkpoint. Then Ray is shut down, and the sweep — the subreaper of everything it
started — waits for the trials' last processes and kills whatever outlives the grace period. A
second signal kills everything at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
from ray import tune

from fleetrl import exit_codes
from fleetrl.run_dir import create_run_dir
from fleetrl.sweep.grid import SweepPlan
from fleetrl.sweep.lifetime import become_subreaper
from fleetrl.sweep.outcome import ended_record, failed_in_ray, trial_record
from fleetrl.sweep.table import describe, write_curves, write_table
from fleetrl.sweep.trial import Launch, run_trial
from fleetrl.teardown import kill_own_children

SWEEP_FILE = "sweep.json"
STOP_GRACE_S = 30.0  # for the trials' clean stop (checkpoint, teardown) after Ray is gone
_stop_requested = threading.Event()  # module-level: Tune pickles its stopper and callbacks
_signals: list[int] = []


class StopOnSignal(tune.Stopper):
    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return _stop_requested.is_set()


class Board(tune.Callback):
    """Every trial's record, as Tune reports its start, progress and end; printed and saved."""

    def __init__(self, plan: SweepPlan, sweep_dir: Path, status_interval_s: float):
        self.plan, self.sweep_dir, self.status_interval_s = plan, sweep_dir, status_interval_s
        self.records = [trial_record(spec, "waiting") for spec in plan.trials]
        self.progress: dict[int, dict] = {}
        self.last_status = time.monotonic()
        self.save()

    def on_trial_start(self, iteration, trials, trial, **info):
        spec = self.plan.trials[trial.config["trial"]]
        self.records[spec.index - 1] = trial_record(spec, "running")
        overrides = " ".join(f"{key}={value}" for key, value in spec.swept.items())
        say(f"{spec.name} started: {overrides} ({spec.cpus} CPU" + (f", {spec.gpus} GPU" if spec.gpus else "") + ")")
        self.save()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "global_step" in result:
            self.progress[trial.config["trial"]] = result

    def on_trial_complete(self, iteration, trials, trial, **info):
        spec = self.plan.trials[trial.config["trial"]]
        result = trial.last_result or {}
        if "exit_code" in result:
            self.ended(spec.index, ended_record(spec, result))
        elif not _stop_requested.is_set():
            self.ended(spec.index, failed_in_ray(spec, "it ended without reporting an exit code"))

    def on_trial_error(self, iteration, trials, trial, **info):
        spec = self.plan.trials[trial.config["trial"]]
        error = trial.get_error()
        self.ended(spec.index, failed_in_ray(spec, str(error).strip().splitlines()[-1] if error else "unknown error"))

    def ended(self, index: int, record: dict) -> None:
        self.records[index - 1] = record
        self.progress.pop(index - 1, None)
        if record["status"] == "finished":
            final, best = record["final_return"], record["best_return"]
            say(
                f"{record['trial']} finished: return(100) {fmt(final)} (best {fmt(best)}) at "
                f"{record['steps']:,} steps, {record['seconds']:.0f} s"
            )
        else:
            say(describe(record))
        self.save()

    def on_step_end(self, iteration, trials, **info):
        if time.monotonic() - self.last_status < self.status_interval_s:
            return
        self.last_status = time.monotonic()
        counts = {status: sum(r["status"] == status for r in self.records) for status in ("running", "waiting")}
        done = {status: sum(r["status"] == status for r in self.records) for status in ("finished", "failed")}
        line = ", ".join(f"{n} {status}" for status, n in {**counts, **done}.items())
        for index, result in sorted(self.progress.items()):
            line += f" | {self.plan.trials[index].name} {result['global_step']:,} steps, return(100) {fmt(result.get('episode_return_last100'))}"
        say(line)

    def finish(self) -> None:
        """After a stop: trials that were running were stopped, the others never started."""
        for index, record in enumerate(self.records):
            if record["status"] in ("running", "waiting"):
                status = "stopped" if record["status"] == "running" else "not started"
                self.records[index] = {**record, "status": status}
        self.save()

    def save(self) -> None:
        path = self.sweep_dir / SWEEP_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"config": str(self.plan.config_path), "trials": self.records}, indent=2))
        temporary.replace(path)


def run_sweep(
    plan: SweepPlan,
    max_concurrent: int | None = None,
    ray_address: str | None = None,
    train_flags: tuple[str, ...] = (),
    status_interval_s: float = 30.0,
) -> int:
    # Absolute: Ray Tune reads storage_path as a URI (a relative one has no scheme), and every trial,
    # whatever its working directory, writes its run directory under it.
    sweep_dir = create_run_dir(plan.sweep_dir_config()).resolve()
    say(f"sweep directory {sweep_dir}: {len(plan.trials)} trials")
    launch = Launch(plan.config_path, sweep_dir, os.getcwd(), dict(os.environ), train_flags, plan.trials)
    become_subreaper()
    board = Board(plan, sweep_dir, status_interval_s)
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # ours stops the trials, SIGTERM too
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # with verbose=0: Tune prints nothing; Board does
    try:
        start_ray(ray_address)
        install_stop_handlers()
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, launch=launch),
            lambda config: {"cpu": plan.trials[config["trial"]].cpus, "gpu": plan.trials[config["trial"]].gpus},
        )
        tuner = tune.Tuner(
            trainable,
            param_space={"trial": tune.grid_search(list(range(len(plan.trials))))},
            tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent, reuse_actors=False),
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str(sweep_dir),
                stop=StopOnSignal(),
                callbacks=[board],
                failure_config=tune.FailureConfig(max_failures=0),
                verbose=0,
            ),
        )
        tuner.fit()
    finally:
        end_everything()
    board.finish()
    records = board.records
    print(write_table(records, sweep_dir))
    say(f"wrote {sweep_dir / SWEEP_FILE}, {sweep_dir / 'sweep.md'} and {write_curves(records, sweep_dir)}")
    if _signals:
        finished = sum(r["status"] == "finished" for r in records)
        say(f"stopped by {signal.Signals(_signals[0]).name}: {finished} of {len(records)} trials had finished")
        return exit_codes.stopped_by(_signals[0])
    return exit_codes.TRIALS_FAILED if any(r["status"] == "failed" for r in records) else exit_codes.OK


def start_ray(address: str | None) -> None:
    import ray

    if address is not None:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        return
    from fleetrl.cluster.ray.nodes import set_ray_loopback

    set_ray_loopback(True)
    # Ray would SIGKILL a stopped Tune worker's children at once; a trial gets SIGTERM instead
    # (lifetime.py) and stops cleanly, and this process waits for it (end_everything).
    os.environ["RAY_kill_child_processes_on_worker_exit"] = "0"
    ray.init(
        address="local",
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        logging_level=logging.WARNING,
    )


def install_stop_handlers() -> None:
    def handler(signum, frame):
        _signals.append(signum)
        if len(_signals) > 1:
            say(f"second {signal.Signals(signum).name}: killing every trial now")
            kill_own_children()
            os._exit(exit_codes.stopped_by(_signals[0]))
        say(f"{signal.Signals(signum).name}: stopping every trial (each saves a checkpoint); again to kill them now")
        _stop_requested.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def end_everything() -> None:
    """Ray shut down; then the trials' own processes, adopted by this subreaper, given
    `STOP_GRACE_S` to finish their clean stop before what is left is killed."""
    import ray

    ray.shutdown()
    _, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=STOP_GRACE_S)
    if alive:
        say(f"killing {len(alive)} process(es) still running {STOP_GRACE_S:.0f} s after the stop")
        kill_own_children()


def say(text: str) -> None:
    print(f"[sweep] {text}", file=sys.stderr, flush=True)


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"

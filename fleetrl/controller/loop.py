"""The training loop (`Trainer`): sync weights → collect → train → log → checkpoint, until the env-step
budget is spent. The same loop drives every backend (cluster/backends/base.py: where the components run);
every call to a worker names the worker class's own method (`ActorBase.state_dict`).
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from fleetrl.checkpoint import initial_weights
from fleetrl.cluster.backends.base import Backend
from fleetrl.cluster.groups import NotAWorkerMethod
from fleetrl.cluster.start import start_backend
from fleetrl.controller.async_updates import CONSOLE_METRICS, AsyncUpdates
from fleetrl.controller.policy_versions import PolicyVersions
from fleetrl.controller.updates import SyncUpdates, Update, Updates, staleness_fields
from fleetrl.errors import ConfigError, UserError
from fleetrl.evaluate import EvalSchedule
from fleetrl.plan.run_plan import RunPlan
from fleetrl.probe.flight_recorder import beat_soon, phase
from fleetrl.probe.recorded_calls import WorkerError
from fleetrl.progress import ConsoleProgress
from fleetrl.run_dir import SUMMARY_FILE, open_run, owner_only, resume_dir, setup_logging
from fleetrl.run_state import RunState, load_resumed, save_resume_config
from fleetrl.signals import hold_stops, install_stop_handlers, stop_gate
from fleetrl.tracking.jsonl import REPLACED_FILE, set_aside_after
from fleetrl.tracking.trackers import Trackers
from fleetrl.watch.respond import IncidentStop
from fleetrl.watch.session import WatchSession
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.env_worker import EnvWorker, success_metrics

log = logging.getLogger("fleetrl")
# What env.nan_policy replaced or skipped, summed over env ranks (workers/nan_policy.py)
NON_FINITE_COUNTS = ("non_finite_replaced", "non_finite_skipped")


class Trainer:
    """The training loop of a checked `RunPlan`, resolved where the run was asked for:
    `Trainer(resolve(config))` (plan/resolve.py) for a test or a library user, which it then
    opens (`run_dir.open_run`: the same step as the supervisor's) and watches in-process. Under
    `fleetrl train` the supervisor gives it the plan `fleetrl train` resolved, `run_dir` (opened
    there), the `session` linking it to the supervisor's watchdog, and `restart` when it
    continues after an incident (recorded with the first iteration it trains)."""

    def __init__(
        self,
        plan: RunPlan,
        live_progress: bool | None = None,
        run_dir: Path | None = None,
        session: WatchSession | None = None,
        restart: dict | None = None,
    ):
        if not isinstance(plan, RunPlan):  # a Config: resolving it is the caller's, where the run is asked for
            raise TypeError(f"Trainer takes a RunPlan, not {type(plan).__name__}: Trainer(resolve(config))")
        self.plan = plan
        self.config = config = plan.config
        runner = config.runner
        if run_dir is None:  # alone: this process opens the run
            self.run_dir, resumed = open_run(config)
        else:  # under the supervisor, which opened it (runner.resume names it when it continues)
            resumed = resume_dir(config) is not None
            self.run_dir = owner_only(Path(run_dir))
            setup_logging(self.run_dir)
        self.restart = restart
        if runner.torch_threads:
            torch.set_num_threads(runner.torch_threads)
        with phase("startup.resume"):
            saved = load_resumed(self.run_dir, runner.resume) if resumed else None
            if saved is not None and config.model.id == "hf":  # adapters on another base: exit 2 before any worker
                from fleetrl.models.hf.lora import HASH_KEY, check_resumed_base
                from fleetrl.parallel import dcp

                # a sharded checkpoint's .pt holds no policy: the fingerprint is read from its shards
                policy = saved["actor"].get("policy") or dcp.model_tensors(Path(saved["shards_path"]), HASH_KEY)
                check_resumed_base(config.model, policy)
        self.state = RunState()  # its counters and recent episodes (run_state.py): what a checkpoint saves
        self.non_finite = dict.fromkeys(NON_FINITE_COUNTS, 0)  # env.nan_policy's, over all env ranks
        self.target_reached_at: tuple[int, float] | None = None
        self.live_progress = live_progress
        self.evaluations = EvalSchedule(runner.eval_interval, self.run_dir)
        with phase("startup.backend"):
            self.backend: Backend = start_backend(self.plan, self.run_dir, session)
        try:
            if saved is not None:
                with phase("startup.load_state"):
                    self.state.load(self.backend, saved)
                replaced = set_aside_after(self.run_dir, self.state.iteration)
                if replaced:
                    log.warning(
                        "iterations %d-%d were logged after the checkpoint and are trained again: their first "
                        "records are in %s",
                        replaced[0],
                        replaced[-1],
                        REPLACED_FILE,
                    )
                kept = save_resume_config(config, self.run_dir)
                log.info(
                    "resumed %s at iteration %d, %d env steps (this resume's config: %s)",
                    self.run_dir,
                    self.state.iteration,
                    self.state.global_step,
                    kept.name,
                )
                if self.state.global_step >= runner.total_env_steps:  # e.g. a config file's total, re-applied
                    log.warning(
                        "the resumed run has taken %d env steps and runner.total_env_steps is %d: nothing "
                        "left to train (raise runner.total_env_steps to train it further)",
                        self.state.global_step,
                        runner.total_env_steps,
                    )
            else:
                random.seed(runner.seed)
                np.random.seed(runner.seed)
                if runner.init_from is not None:
                    with phase("startup.init_from"):
                        self.init_from(runner.init_from)
        except BaseException:
            self.backend.shutdown()
            raise
        versions = PolicyVersions.of_run(self.backend, config, self.state.iteration)
        self.updates: Updates = (
            AsyncUpdates.of_run(self.backend, config, versions, self.state.global_step)
            if runner.asynchronous
            else SyncUpdates(self.backend, config, versions, self.state)
        )

    def init_from(self, source: str) -> None:
        """`runner.init_from`: every actor rank starts from `source`'s policy weights."""
        weights = initial_weights(source)
        actor = self.backend.actor
        try:
            actor.get(actor.call_all(ActorBase.load_policy_weights, weights))
        except WorkerError as error:  # weights of another model: the user's to fix, not an incident
            if error.error_type != ConfigError.__name__:
                raise
            raise UserError(error.message) from None
        log.info("policy weights from %s (runner.init_from); optimizer and counters start fresh", source)

    def train(self) -> dict:
        config = self.config
        total = config.runner.total_env_steps
        startup_s = time.time() - psutil.Process().create_time()
        log.info(
            "run directory %s; %s, %d envs, batch %d, %s backend, actor on %s, rollout on %s",
            self.run_dir,
            config.env.id,
            config.env.num_envs,
            config.batch_size,
            self.plan.layout.runs_on,
            config.actor.device,
            config.rollout.device,
        )
        install_stop_handlers()
        trackers = self.start_trackers()
        progress = ConsoleProgress(
            total,
            self.state.global_step,
            config.runner.log_interval,
            self.live_progress,
            (*self.plan.spec.console_metrics, *(CONSOLE_METRICS if config.runner.asynchronous else ())),
        )
        beat_soon()  # start-up is over: the watcher's view of this process must not still say so
        try:
            self.backend.collector.start(
                self.state.iteration
            )  # the first resets: a worker's error here is an incident too
            while not self.stop_for_target():
                with stop_gate():  # a stop once the iteration has trained waits for its record (run_iteration)
                    record = self.run_iteration()
                    if record is None:  # the env-step budget is spent
                        break
                    trackers.log_metrics(record, record["global_step"])
                if record.get("eval_video"):  # an evaluation's film, uploaded where the trackers keep files
                    trackers.log_file(Path(record["eval_video"]), f"video/{Path(record['eval_video']).name}")
                progress.update(record)
                if self.state.iteration % config.runner.checkpoint_interval == 0:
                    self.checkpoint()
            self.checkpoint()
        except KeyboardInterrupt:
            settled = self.updates.settle()
            if settled is not None:  # the update in flight, done: counted, so that the checkpoint's weights match
                record = self.record(settled, time.perf_counter(), self.state.global_step)
                trackers.log_metrics(record, record["global_step"])
            log.warning("interrupted at iteration %d: saving a checkpoint", self.state.iteration)
            self.checkpoint()
            raise
        except (UserError, IncidentStop, NotAWorkerMethod):
            raise
        except Exception as error:  # a worker failed: report, tear down, raise IncidentStop
            progress.close()
            self.backend.fail(error)
        finally:  # on any other error the last periodic checkpoint stays the newest
            progress.close()
            summary = self.write_summary(startup_s)
            trackers.log_summary(summary)
            trackers.close()  # before the backend's teardown, which ends this process's children
            self.backend.shutdown()
        return summary

    def start_trackers(self) -> Trackers:
        """The trackers of runner.loggers, started on this run; on an incident they attach the
        hang report to their runs before the process exits (bounded: runner.tracker_timeout_s)."""
        runner = self.config.runner
        names = [name for name in runner.loggers if runner.tensorboard or name != "tensorboard"]
        trackers = Trackers(names, runner.tracker_timeout_s)
        trackers.start(self.config, self.run_dir)
        self.backend.session.on_report(trackers.attach_report, runner.tracker_timeout_s)
        return trackers

    def run_iteration(self) -> dict | None:
        """The next update (controller/updates.py) and its record; None once the env-step budget
        is spent."""
        started, steps_before = time.perf_counter(), self.state.global_step
        update = self.updates.next()
        return None if update is None else self.record(update, started, steps_before)

    def record(self, update: Update, started: float, steps_before: int) -> dict:
        """Count `update` as the next iteration (its env workers' reports, its samples' ages) and
        make its record, evaluations and restarts included."""
        updated = time.perf_counter()
        hold_stops()  # trained: the checkpoint a stop takes must have this iteration's record beside it
        self.state.iteration += 1
        self.state.train_s += updated - started
        interval = self.config.runner.param_check_interval
        if interval and self.state.iteration % interval == 0:  # raises ReplicaDivergenceError naming tensors and ranks
            self.backend.actor.get(self.backend.actor.call_all(ActorBase.verify_replicas))
        returns, lengths, games, successes = self.gather_env_reports(update.reports)
        self.state.count_update(update.ages, self.updates.take_dropped(), self.updates.in_flight_samples)
        record = {
            "iteration": self.state.iteration,
            "global_step": self.state.global_step,
            "episodes": self.state.episodes,
            "wall_s": self.state.train_s,
            "episode_return_mean": float(np.mean(returns)) if returns else None,
            "episode_return_last100": self.state.mean_recent_return(),
            "episode_length_last100": float(np.mean(self.state.recent_lengths)) if self.state.recent_lengths else None,
            **({"game_return_mean": float(np.mean(games)), "games": len(games)} if games else {}),
            **success_metrics(successes),  # of this iteration's episodes, where the env reports success
            "steps_per_s": (self.state.global_step - steps_before) / (updated - started),
            **update.timings,
            **staleness_fields(update.ages),
            "samples_dropped": self.state.samples_dropped,
            **(self.non_finite if self.config.env.nan_policy != "error" else {}),
            **update.metrics,
        }
        if self.target_reached_at is None and self.target_met():
            self.target_reached_at = (self.state.global_step, self.state.train_s)
        last = self.state.global_step >= self.config.runner.total_env_steps or self.target_reached_at is not None
        with phase("evaluation"):
            record.update(
                self.evaluations.after_iteration(self.backend, self.state.iteration, self.state.global_step, last)
            )
        if self.restart is not None:  # the first iteration trained after a restart: what it cost
            record.update(restarts=self.restart["number"], restart_s=time.time() - self.restart["incident_at"])
            self.restart = None
        return record

    def gather_env_reports(
        self, reports: list[dict] | None = None
    ) -> tuple[list[float], list[int], list[float], list[tuple[str, bool]]]:
        """Sum the counters of all env workers (global steps and episodes); merge episodes, the
        raw scores of whole games where the env reports them (Atari: an episode is a life), and
        each episode's (task, success) where the env reports success (robot manipulation).
        `reports`: the env workers' reports taken when the batch trained on was collected
        (asynchronous training); None: ask them now."""
        if reports is None:
            env = self.backend.env
            reports = env.get(env.call_all(EnvWorker.report))
        self.state.env_counters = [{"env_steps": r["env_steps"], "episodes": r["episodes"]} for r in reports]
        self.state.global_step = sum(r["env_steps"] for r in reports)
        self.state.episodes = sum(r["episodes"] for r in reports)
        returns = [x for r in reports for x in r["returns"]]
        lengths = [x for r in reports for x in r["lengths"]]
        self.state.recent_returns.extend(returns)
        self.state.recent_lengths.extend(lengths)
        games = [x for r in reports for x in r["game_returns"]]
        self.non_finite = {key: sum(r[key] for r in reports) for key in NON_FINITE_COUNTS}
        return returns, lengths, games, [tuple(x) for r in reports for x in r["successes"]]

    def target_met(self) -> bool:
        target = self.config.runner.target_return
        return (
            target is not None
            and len(self.state.recent_returns) == self.state.recent_returns.maxlen
            and self.state.mean_recent_return() >= target
        )

    def stop_for_target(self) -> bool:
        if self.target_reached_at is None:
            return False
        log.info(
            "last-100-episode mean return %.1f reached runner.target_return=%s at %d env steps",
            self.state.mean_recent_return(),
            self.config.runner.target_return,
            self.state.global_step,
        )
        return True

    def checkpoint(self) -> None:
        self.state.save(self.backend, self.run_dir, self.config)

    def write_summary(self, startup_s: float) -> dict:
        reached = self.target_reached_at
        summary = {
            "run_dir": str(self.run_dir),
            "iterations": self.state.iteration,
            "global_step": self.state.global_step,
            "episodes": self.state.episodes,
            "startup_s": startup_s,
            "train_s": self.state.train_s,
            "episode_return_last100": self.state.mean_recent_return(),
            "target_return": self.config.runner.target_return,
            "target_reached": reached is not None,
            "target_reached_step": reached[0] if reached else None,
            "target_reached_s": reached[1] if reached else None,
            "staleness": {str(age): samples for age, samples in sorted(self.state.staleness.items())},
            "samples_dropped": self.state.samples_dropped,
            **(self.non_finite if self.config.env.nan_policy != "error" else {}),
        }
        path = self.run_dir / SUMMARY_FILE
        try:
            path.write_text(json.dumps(summary, indent=2))
        except OSError as error:  # a full disk: say so, without hiding why the run is ending
            path.unlink(missing_ok=True)
            log.error("could not write %s: %s", path, error)
        return summary

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
from fleetrl.errors import UserError
from fleetrl.evaluate import EvalSchedule
from fleetrl.plan.run_plan import RunPlan
from fleetrl.probe.flight_recorder import beat_soon, phase
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
from fleetrl.workers.rollout_worker import RolloutWorker

log = logging.getLogger("fleetrl")


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
        self.synced = False  # the rollout workers hold a full copy of the weights (this process's)
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

    def init_from(self, source: str) -> None:
        """`runner.init_from`: every actor rank starts from `source`'s policy weights."""
        weights = initial_weights(source)
        actor = self.backend.actor
        actor.get(actor.call_all(ActorBase.load_policy_weights, weights))
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
            self.plan.spec.console_metrics,
        )
        beat_soon()  # start-up is over: the watcher's view of this process must not still say so
        try:
            self.backend.collector.start(
                self.state.iteration
            )  # the first resets: a worker's error here is an incident too
            while self.state.global_step < total and not self.stop_for_target():
                with stop_gate():  # a stop once the iteration has trained waits for its record (run_iteration)
                    record = self.run_iteration()
                    trackers.log_metrics(record, record["global_step"])
                if record.get("eval_video"):  # an evaluation's film, uploaded where the trackers keep files
                    trackers.log_file(Path(record["eval_video"]), f"video/{Path(record['eval_video']).name}")
                progress.update(record)
                if self.state.iteration % config.runner.checkpoint_interval == 0:
                    self.checkpoint()
            self.checkpoint()
        except KeyboardInterrupt:
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

    def run_iteration(self) -> dict:
        started = time.perf_counter()
        steps_before = self.state.global_step
        with phase("weight_sync"):
            weight_syncs = self.sync_weights()
        synced = time.perf_counter()
        if self.config.algorithm.resets_envs_each_iteration:  # group-seeded resets (reset_group_size)
            self.backend.collector.start(self.state.iteration)
        # The schedule position is taken before this iteration's steps, so the last iteration
        # still learns (lr > 0) rather than running with an annealed-to-zero rate.
        with phase("collect_and_train"):
            metrics, collect_s = self.backend.collector.collect_and_train(
                steps_before / self.config.runner.total_env_steps
            )
        updated = time.perf_counter()
        hold_stops()  # trained: the checkpoint a stop takes must have this iteration's record beside it
        self.state.iteration += 1
        self.state.train_s += updated - started
        interval = self.config.runner.param_check_interval
        if interval and self.state.iteration % interval == 0:  # raises ReplicaDivergenceError naming tensors and ranks
            self.backend.actor.get(self.backend.actor.call_all(ActorBase.verify_replicas))
        returns, lengths, games, successes = self.gather_env_reports()
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
            "time_weight_sync_s": synced - started,
            "weight_syncs": weight_syncs,
            "time_collect_s": collect_s,
            "time_update_s": updated - synced - collect_s,
            **metrics,
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

    def sync_weights(self) -> int:
        """Actor rank 0's weights → every rollout worker, unless they share the policy object;
        with `runner.weight_sync: trainable` only the first sync is full, later ones patches;
        with `changed` later ones only the changed values (parallel/changed_values.py).
        Every actor rank is asked (FSDP gathers shards collectively); the rollout workers receive
        rank 0's copy by reference, and run the load before their next `act` (call order).
        Returns how many rollout workers were sent weights (0: none needed them this iteration)."""
        backend = self.backend
        if backend.shares_policy or self.state.iteration % self.config.runner.weight_sync_interval:
            return 0
        if self.config.runner.weight_sync == "changed":  # the first full, then changed values only
            payload = backend.actor.call_all(ActorBase.changed_weights)[0]
            sent = backend.rollout.call_all(RolloutWorker.load_changed, payload)
        elif self.config.runner.weight_sync == "trainable" and self.synced:  # frozen tensors are there already
            patch = backend.actor.call_all(ActorBase.trainable_weights)[0]
            sent = backend.rollout.call_all(RolloutWorker.load_patch, patch)
        else:
            weights = backend.actor.call_all(ActorBase.policy_weights)[0]
            sent = backend.rollout.call_all(RolloutWorker.load_weights, weights)
        self.synced = True
        return len(sent)

    def gather_env_reports(self) -> tuple[list[float], list[int], list[float], list[tuple[str, bool]]]:
        """Sum the counters of all env workers (global steps and episodes); merge episodes, the
        raw scores of whole games where the env reports them (Atari: an episode is a life), and
        each episode's (task, success) where the env reports success (robot manipulation)."""
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
        }
        path = self.run_dir / SUMMARY_FILE
        try:
            path.write_text(json.dumps(summary, indent=2))
        except OSError as error:  # a full disk: say so, without hiding why the run is ending
            path.unlink(missing_ok=True)
            log.error("could not write %s: %s", path, error)
        return summary

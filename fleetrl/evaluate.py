"""Evaluation from the controller's side: `fleetrl eval` on a checkpoint, and the schedule of
evaluations during training. Both play their episodes on an `EvalWorker` (workers/eval_worker.py:
the one episode loop, own envs, same seeds), so a checkpoint's `fleetrl eval` reproduces the
evaluation its weights got during training.

During training (`runner.eval_interval` > 0) an evaluation is due after every `eval_interval`-th
iteration, of the weights that iteration trained. Its result goes into the metrics record of the
iteration at whose end it is found finished (`eval_iteration` / `eval_global_step` say which
weights it evaluated):
- inline, the eval worker is an object of the controller's process and the evaluation runs at
  once, between iterations (training waits for it): the result is in the record of the iteration
  it evaluated;
- on Ray it is a worker of its own; the controller submits the evaluation and picks the result up
  at a later iteration without waiting (training goes on). At most one is in flight: one due while
  the previous is still running is skipped and counted (`eval_skipped`). At the last iteration
  the controller waits for the one in flight (or the one due), so none is lost; a record holds one
  evaluation, so there a due one is skipped when another's result fills the record.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fleetrl.checkpoint import load_latest
from fleetrl.errors import UserError
from fleetrl.parallel import dcp
from fleetrl.plan.load import load_run_config
from fleetrl.run_dir import CONFIG_FILE
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.eval_worker import EVAL_SEED, EvalWorker, save_gif

if TYPE_CHECKING:
    from fleetrl.cluster.backends.base import Backend

log = logging.getLogger("fleetrl")
VIDEO_DIR = "video"
EVAL_DIR = "eval"  # fleetrl eval's results, one JSON file per evaluation (`evaluation_name`)


def evaluate(
    run_dir: Path,
    episodes: int,
    deterministic: bool = True,
    seed: int = EVAL_SEED,
    video_dir: Path | None = None,
    overrides: list[str] = (),
) -> dict:
    """`fleetrl eval`: the latest checkpoint's policy over `episodes` episodes; with `video_dir`,
    the first one filmed as `<video_dir>/episode.gif`. `overrides`: `env.` keys of the run's
    config changed for the evaluation only (`env.kwargs.instructions=held_out`), and
    `model.token_readout`, which reads the same weights; the policy's other keys are the
    checkpoint's."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise UserError(f"{run_dir} is not a fleetrl run directory (no {CONFIG_FILE})")
    if episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {episodes}")
    foreign = [item for item in overrides if not item.startswith(("env.", "model.token_readout="))]
    if foreign:
        raise UserError(
            f"fleetrl eval overrides only env keys (env.kwargs.instructions=held_out) and "
            f"model.token_readout, got {foreign}: the policy is the checkpoint's"
        )
    readout = [item for item in overrides if item.startswith("model.token_readout=")]
    if readout and not deterministic:
        raise UserError(f"{readout[0]} is the deterministic action's readout: --stochastic samples, and reads none")
    config = load_run_config(run_dir / CONFIG_FILE, list(overrides))
    if config.runner.torch_threads:
        torch.set_num_threads(config.runner.torch_threads)
    state = load_latest(run_dir)
    worker = EvalWorker(config, episodes, seed, video=video_dir is not None)
    try:  # env rank 0's normaliser statistics
        if "shards_path" in state:  # a sharded checkpoint: the policy's shards read into one copy
            weights = dcp.load_model_weights(Path(state["shards_path"]), worker.rollout.policy)
        else:
            weights = state["actor"]["policy"]
        result = worker.run(weights, state["env"][0], deterministic)
    finally:
        worker.close()
    if result["gif"] is not None:
        save_gif(result["gif"], Path(video_dir) / "episode.gif")
    evaluation = {
        "run_dir": str(run_dir),
        "episodes": result["episodes"],
        "unit": result["unit"],
        "mean": result["return_mean"],
        "std": result["return_std"],
        "min": result["return_min"],
        "max": result["return_max"],
        "deterministic": deterministic,
        "eval_s": result["eval_s"],
        "seed": seed,
        "overrides": list(overrides),
        **{key: value for key, value in result.items() if key.startswith("success_rate")},
        "per_episode": result["per_episode"],
    }
    path = run_dir / EVAL_DIR / evaluation_name(episodes, deterministic, seed, overrides)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(evaluation, indent=1))
    return {**evaluation, "written": str(path)}


def evaluation_name(episodes: int, deterministic: bool, seed: int, overrides: list[str]) -> str:
    """The file an evaluation is written to in `<run>/eval/`: its seed, episodes, mode and overrides
    (`seed50000_episodes500_instructions-held_out.json`, `seed50000_episodes500_token_readout-expected.json`),
    so different evaluations keep their own."""
    parts = [f"seed{seed}", f"episodes{episodes}", *([] if deterministic else ["stochastic"])]
    parts += [
        re.sub(r"[^A-Za-z0-9_.=-]+", "-", item.removeprefix("env.kwargs.").removeprefix("model.")).replace("=", "-")
        for item in overrides
    ]
    return "_".join(parts) + ".json"


def task_table(result: dict) -> str:
    """Per-task success rates and their mean over tasks (Meta-World's figure), one line each; ''
    when the env reports no tasks."""
    tasks = {key.split("/", 1)[1]: rate for key, rate in result.items() if key.startswith("success_rate/")}
    if not tasks:
        return ""
    counts = {task: sum(1 for e in result["per_episode"] if e.get("task") == task) for task in tasks}
    width = max(map(len, tasks))
    lines = [f"  {task:<{width}}  {rate:.3f}  ({counts[task]} episodes)" for task, rate in sorted(tasks.items())]
    lines.append(f"  {'mean over tasks':<{width}}  {result['success_rate_task_mean']:.3f}")
    return "success per task:\n" + "\n".join(lines)


@dataclass
class Submitted:
    future: Any  # the eval worker's `run` (an ObjectRef on Ray, the result inline)
    iteration: int
    global_step: int


class EvalSchedule:
    """The controller's evaluations during training (module docstring)."""

    def __init__(self, interval: int, run_dir: Path):
        self.interval: int = interval
        self.run_dir: Path = Path(run_dir)
        self.pending: Submitted | None = None
        self.skipped: int = 0

    def after_iteration(self, backend: Backend, iteration: int, global_step: int, last: bool) -> dict:
        """Submit the evaluation due after `iteration`; the eval keys of a finished one (waiting
        for it only at the `last` iteration), for this iteration's metrics record."""
        evaluator = backend.evaluator
        if evaluator is None:
            return {}
        record = self.pick_up(evaluator, wait=last)
        if self.interval and iteration % self.interval == 0:
            if self.pending is not None or (last and record):
                self.skipped += 1
                log.info("evaluation of iteration %d skipped: the previous one is still running", iteration)
            else:
                self.submit(backend, iteration, global_step)
        record = record or self.pick_up(evaluator, wait=last)
        return {**record, "eval_skipped": self.skipped} if record else {}

    def submit(self, backend: Backend, iteration: int, global_step: int) -> None:
        """Actor rank 0's weights (every rank asked: FSDP gathers collectively) and env rank 0's
        normaliser statistics, passed on as futures: the controller waits for neither."""
        weights = backend.actor.call_all(ActorBase.policy_weights)[0]
        env_state = backend.env.call(0, EnvWorker.state_dict)
        future = backend.evaluator.call(0, EvalWorker.run, weights, env_state)
        self.pending = Submitted(future, iteration, global_step)

    def pick_up(self, evaluator, wait: bool) -> dict:
        pending = self.pending
        if pending is None or not (wait or evaluator.ready(pending.future)):
            return {}
        self.pending = None
        result = evaluator.get(pending.future)  # a worker's error raises here: an incident naming it
        log.info(
            "evaluation of iteration %d (%d env steps): return %.2f ± %.2f over %d %ss",
            pending.iteration,
            pending.global_step,
            result["return_mean"],
            result["return_std"],
            result["episodes"],
            result["unit"],
        )
        record = {
            "eval_return_mean": result["return_mean"],
            "eval_return_std": result["return_std"],
            "eval_length_mean": result["length_mean"],
            "eval_episodes": result["episodes"],
            "eval_iteration": pending.iteration,
            "eval_global_step": pending.global_step,
            "eval_s": result["eval_s"],
            **{f"eval_{key}": value for key, value in result.items() if key.startswith("success_rate")},
        }
        if result["gif"] is not None:
            path = save_gif(result["gif"], self.run_dir / VIDEO_DIR / f"eval-{pending.iteration}.gif")
            record["eval_video"] = str(path)
        return record

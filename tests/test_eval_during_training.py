"""Evaluation during training (`runner.eval_interval`): the eval component's placement and checks,
then real runs — inline (evaluations between iterations, equal to `fleetrl eval` on the same
weights, training untouched; a filmed episode), on Ray (an eval worker of its own whose
evaluations run while the iterations go on) and a fault in the eval worker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from fleetrl.algos.registry import algorithm_spec
from fleetrl.checkpoint import checkpoint_dir, list_checkpoints
from fleetrl.cli import main
from fleetrl.errors import ConfigError
from fleetrl.plan.layout import worker_processes
from fleetrl.plan.load import load_config
from fleetrl.plan.resolve import resolve
from fleetrl.run_dir import CONFIG_FILE
from fleetrl.workers.eval_worker import EvalWorker
from tests.support import TWO_ACTOR_RANKS_ON_RAY, train

CARTPOLE = "configs/ppo_cartpole.yaml"
SMALL = [
    "env.num_envs=4",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=32",
    "algorithm.update_epochs=2",
    "runner.tensorboard=false",
    "--skip-doctor",
]
EVAL_KEYS = {
    "eval_return_mean",
    "eval_return_std",
    "eval_length_mean",
    "eval_episodes",
    "eval_iteration",
    "eval_global_step",
    "eval_skipped",
    "eval_s",
}


def layout(*overrides: str):
    return resolve(load_config(CARTPOLE, [*overrides])).layout


class TestPlacement:
    def test_placed_only_when_the_run_evaluates_and_by_default_with_env_rank_0(self):
        placement = ["cluster.component_placement={actor: 0, env: 1-2}", "cluster.devices_per_node=3"]
        assert not layout(*placement).placement.placed("eval")
        (evaluator,) = layout(*placement, "runner.eval_interval=5").placement.ranks("eval")
        assert (evaluator.device, evaluator.world_size) == (1, 1)

    def test_eval_on_a_device_of_its_own_in_the_dry_run(self, capsys):
        overrides = ["cluster.devices_per_node=3", "cluster.component_placement={env: 0-1, eval: 2}"]
        assert main(["train", CARTPOLE, *overrides, "runner.eval_interval=1", "--dry-run"]) == 0
        rows = [line.split() for line in capsys.readouterr().out.splitlines()]
        assert ["eval", "0", "0", "2", "2", "2"] == [row[:6] for row in rows if row[0] == "eval"][0]

    def test_fused_ranks_keep_an_eval_worker_of_their_own(self):
        fused = layout(
            "cluster.backend=ray",
            "cluster.devices_per_node=2",
            "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}",
            "cluster.fuse_collocated=true",
            "runner.eval_interval=1",
        )
        assert [(a.component, a.rank, a.device) for a in worker_processes(fused)] == [
            ("fused", 0, 0),
            ("fused", 1, 1),
            ("eval", 0, 0),
        ]

    @pytest.mark.parametrize("spec", ["0-1", "{devices: 0, processes_per_device: 2}"])
    def test_one_eval_process(self, spec):
        with pytest.raises(ConfigError) as caught:
            layout("cluster.devices_per_node=2", f"cluster.component_placement={{eval: {spec}}}")
        assert caught.value.key == "cluster.component_placement.eval"
        assert "one device" in str(caught.value)

    def test_a_fault_in_the_eval_worker_needs_a_run_that_evaluates(self):
        fault = "debug.fault={kind: kill, component: eval}"
        with pytest.raises(ConfigError) as caught:
            layout(fault)
        assert caught.value.key == "debug.fault.component" and "runner.eval_interval" in str(caught.value)
        assert layout(fault, "runner.eval_interval=1").placement.placed("eval")


@pytest.mark.parametrize("name", ["ppo_cartpole", "ppg_cartpole", "ppo_pendulum_tokens", "sac_pendulum"])
def test_every_algorithm_evaluates_its_published_weights_as_its_checkpointed_policy(name):
    """What the actor publishes during training (`policy_weights`; SAC's still in its warm-up of
    random actions) and what a checkpoint holds for `fleetrl eval` play the same deterministic
    episodes: the policy's mode (SAC: tanh of the mean)."""
    config = load_config(f"configs/{name}.yaml")
    worker = EvalWorker(config, episodes=2, seed=3)
    try:
        actor = algorithm_spec(config.algorithm.name).actor_class()(config, *worker.env.spaces())
        env_state = worker.env.state_dict()
        published, saved = (worker.run(w, env_state) for w in (actor.policy_weights(), actor.state_dict()["policy"]))
    finally:
        worker.close()
    assert published.pop("eval_s") >= 0 and saved.pop("eval_s") >= 0
    assert published == saved and published["episodes"] == 2 and published["gif"] is None


def train_inline(runs: Path, *overrides: str) -> tuple[Path, list[dict]]:
    result = train(CARTPOLE, *SMALL, *overrides, runs=runs).succeeded()
    return result.run_dir, result.metrics


def training_keys(record: dict) -> dict:
    """What training computed: every key but the evaluation's and the clocks'."""
    return {k: v for k, v in record.items() if k not in EVAL_KEYS and k != "wall_s" and not k.endswith("_s")}


def eval_checkpoint(run: Path, iteration: int, folder: Path, capsys) -> dict:
    """`fleetrl eval --json` on the checkpoint of `iteration` alone (it evaluates the newest)."""
    copy = folder / f"at-{iteration}"
    checkpoint_dir(copy).mkdir(parents=True)
    shutil.copy(run / CONFIG_FILE, copy / CONFIG_FILE)
    shutil.copy(checkpoint_dir(run) / f"ckpt_{iteration:08d}.pt", checkpoint_dir(copy))
    capsys.readouterr()
    assert main(["eval", str(copy), "--episodes", "3", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_inline_evaluations_equal_fleetrl_eval_of_their_weights_and_leave_training_alone(tmp_path, capsys):
    """10 iterations, an evaluation every 2nd: in the records of iterations 2, 4, ... 10, of those
    iterations' weights, with the returns `fleetrl eval` gives on those iterations' checkpoints;
    training's records are those of the same run without evaluation."""
    common = ["runner.total_env_steps=640", "runner.checkpoint_interval=2", "runner.keep_checkpoints=5"]
    run, records = train_inline(tmp_path / "with", *common, "runner.eval_interval=2", "runner.eval_episodes=3")
    _, plain = train_inline(tmp_path / "without", *common)
    assert [training_keys(r) for r in records] == [training_keys(r) for r in plain]
    evaluated = [r for r in records if "eval_return_mean" in r]
    assert [r["iteration"] for r in evaluated] == [2, 4, 6, 8, 10]
    assert all(set(r) >= EVAL_KEYS for r in evaluated) and not any(set(r) & EVAL_KEYS for r in plain)
    for record in evaluated:
        assert record["eval_iteration"] == record["iteration"]
        assert record["eval_global_step"] == record["global_step"]
        assert (record["eval_episodes"], record["eval_skipped"]) == (3, 0)
    assert len(list_checkpoints(run)) == 5
    returns = set()
    for record in evaluated:
        result = eval_checkpoint(run, record["iteration"], tmp_path, capsys)
        assert (result["mean"], result["std"]) == (record["eval_return_mean"], record["eval_return_std"])
        returns.add(result["mean"])
    assert len(returns) > 1  # the policy changed between evaluations: the weights were the current ones


def test_eval_video_films_the_first_episode(tmp_path):
    run, (record,) = train_inline(
        tmp_path,
        "env.id=tests.envs:FilmedCartPole",
        "runner.total_env_steps=64",
        "runner.eval_interval=1",
        "runner.eval_episodes=1",
        "runner.eval_video=true",
    )
    assert record["eval_video"] == str(run / "video" / "eval-1.gif")
    with Image.open(record["eval_video"]) as gif:
        assert gif.format == "GIF" and gif.n_frames == record["eval_length_mean"]  # a frame per step


def test_on_ray_evaluations_run_while_training_goes_on(tmp_path):
    """One actor, one rollout, two env workers, the eval worker on a device of its own; every
    iteration due for an evaluation of 2 episodes (up to 100 steps) on 2 slowed envs, each
    iteration 8 steps of 2 envs per env worker: an evaluation outlasts several iterations. The controller never waits for an evaluation but at the end: results
    arrive iterations after the weights they evaluated, and evaluations due meanwhile are skipped
    and counted."""
    run = train(
        CARTPOLE,
        *TWO_ACTOR_RANKS_ON_RAY,
        *SMALL,
        "cluster.devices_per_node=3",
        "cluster.component_placement={actor: 0, rollout: 0, env: 0-1, eval: 2}",
        "env.id=fleetrl.envs.slow:SlowCartPole",
        "env.kwargs={step_time_s: 0.005}",
        "env.max_episode_steps=100",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=16",
        "runner.total_env_steps=960",
        "runner.eval_interval=1",
        "runner.eval_episodes=2",
        runs=tmp_path,
    ).succeeded()
    records = run.metrics
    evaluated = [r for r in records if "eval_return_mean" in r]
    assert len(records) == 30 and len(evaluated) >= 2
    assert evaluated[-1] is records[-1]  # the last one waited for
    # picked up later, never waited for, but the last: the end waits for the one in flight, which may
    # have started at the last iteration itself (a quiet host finishes the one before in time)
    assert all(r["iteration"] > r["eval_iteration"] for r in evaluated[:-1])
    assert evaluated[-1]["iteration"] >= evaluated[-1]["eval_iteration"]
    assert any(r["iteration"] - r["eval_iteration"] >= 2 for r in evaluated)  # an iteration ran meanwhile
    skipped = [r["eval_skipped"] for r in evaluated]
    assert skipped == sorted(skipped) and skipped[-1] == len(records) - len(evaluated)  # one per iteration
    assert all(r["eval_episodes"] == 2 for r in evaluated)


def test_eval_worker_killed_is_an_incident_naming_it(tmp_path):
    result = train(
        CARTPOLE,
        *TWO_ACTOR_RANKS_ON_RAY,
        *SMALL,
        "cluster.component_placement={actor: 0, env: 0}",
        "runner.total_env_steps=1000000",
        "runner.eval_interval=1",
        "watchdog.heartbeat_timeout_s=3",
        "debug.fault={kind: kill, component: eval}",
        runs=tmp_path,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert (report["cause"], report["culprit"]) == ("worker_died", ["eval", 0]), report["summary"]

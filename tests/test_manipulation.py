"""Robot manipulation (fleetrl.envs.manipulation, docs/guides/manipulation.md) on the real
simulator: panda-gym's arm in PyBullet, camera images rendered by its TinyRenderer.

The Dict observations and their spaces, each task's scripted expert succeeding, the two-stage
pipeline as a user runs it (`fleetrl record` → `fleetrl sft` → `fleetrl train` with
runner.init_from) with success_rate per task in training and evaluation, and the user errors of
the new keys and commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker  # noqa: E402
from fleetrl.checkpoint import initial_weights, load_latest  # noqa: E402
from fleetrl.cli import main  # noqa: E402
from fleetrl.config.schema import EnvConfig  # noqa: E402
from fleetrl.envs.experts import expert_action  # noqa: E402
from fleetrl.envs.make import env_factory  # noqa: E402
from fleetrl.envs.manipulation import DENSE_SCALE, INSTRUCTIONS, PandaTasks  # noqa: E402
from fleetrl.errors import ConfigError  # noqa: E402
from fleetrl.plan.load import load_config  # noqa: E402
from fleetrl.plots import write_plots  # noqa: E402
from fleetrl.workers.env_worker import success_metrics  # noqa: E402
from tests.support import fleetrl, sft_then_train  # noqa: E402

ENV_ID = "fleetrl.envs.manipulation:PandaTasks"
# Small enough for CI: 32×32 images, 2 envs, 8-step episodes (a push rarely ends in 8: truncations
# are episodes too, so every iteration reports success rates).
SMALL = [
    "env.kwargs={tasks: [reach, push], image_size: 32, max_steps: 8, sim_state: true}",
    "env.num_envs=2",
    "env.vectorization=sync",
    "algorithm.num_steps=8",
    "algorithm.minibatch_size=8",
    "model.patch_size=8",
    "runner.total_env_steps=32",
    "runner.tensorboard=false",
    "runner.eval_interval=2",
    "runner.eval_episodes=4",
]


def small_env(**kwargs):
    config = EnvConfig(id=ENV_ID, kwargs={"tasks": ["reach", "push"], "image_size": 32, **kwargs})
    return env_factory(config)()


def test_dict_observations_image_instruction_state():
    env = small_env()
    try:
        space = env.observation_space
        assert set(space.spaces) == {"image", "instruction", "state"}
        assert (space["image"].shape, space["image"].dtype) == ((32, 32, 3), np.uint8)
        assert space["instruction"].dtype == np.int64 and space["instruction"].shape == (8,)
        assert (space["state"].shape, space["state"].dtype) == ((7,), np.float32)
        vocabulary = env.vocabularies["instruction"]
        seen = {}
        for seed in range(6):
            obs, info = env.reset(seed=seed)
            assert space.contains(obs)
            seen[info["task"]] = vocabulary.decode(obs["instruction"])
        assert seen == {task: INSTRUCTIONS[task] for task in ("reach", "push")}
        first, _ = env.reset(seed=3)
        again, _ = env.reset(seed=3)  # one seed, one task and one start: what a GRPO group shares
        assert np.array_equal(first["image"], again["image"]) and np.array_equal(first["state"], again["state"])
        assert first["image"].std() > 0  # a rendered scene, not a blank frame
        obs, reward, terminated, truncated, info = env.step(np.zeros(4, np.float32))
        assert set(info) == {"task", "success"} and space.contains(obs)
    finally:
        env.close()


def red_pixels(image: np.ndarray) -> int:
    r, g, b = (image[..., channel].astype(int) for channel in range(3))
    return int(((r > 150) & (g < 80) & (b < 80)).sum())


@pytest.mark.parametrize("task", ["reach", "push"])
def test_the_goal_is_in_the_image(task):
    """The target is drawn red and opaque (panda-gym's translucent green came out as the cube's
    green), reach's rests on the table; moving it moves its red pixels."""
    env = PandaTasks([task], image_size=64)
    try:
        for seed in range(4):
            obs, _ = env.reset(seed=seed)
            goal = env.task.task.get_goal()
            assert goal[2] == pytest.approx(0.02)  # on the table: a pixel fixes the point
            sim = env.task.sim
            seen = red_pixels(obs["image"])
            assert seen >= 4, f"seed {seed}: the target is {seen} red pixels"
            sim.set_base_pose("target", np.array([0.0, 0.0, -1.0]), np.array([0.0, 0.0, 0.0, 1.0]))  # under the table
            assert red_pixels(env.camera()) == 0
    finally:
        env.close()


@pytest.mark.parametrize("task", ["reach", "push"])
def test_sim_state_is_the_target_and_the_object_where_the_simulator_has_them(task):
    """`sim_state=True` adds the critic's key (the target's position, then the cube's, or the end
    effector's for reach, which is its own object); it follows the object as the expert moves it."""
    assert "sim_state" not in PandaTasks([task], image_size=16).observation_space.spaces
    env = PandaTasks([task], image_size=16, sim_state=True)
    try:
        obs, _ = env.reset(seed=2)
        assert env.observation_space.contains(obs)
        for _ in range(6):
            goal, ee = env.task.task.get_goal(), env.task.robot.get_ee_position()
            cube = ee if task == "reach" else env.task.sim.get_base_position("object")
            assert np.allclose(obs["sim_state"], np.concatenate([goal, cube]), atol=1e-6)
            obs, *_ = env.step(expert_action(env))
        assert not np.allclose(obs["sim_state"][3:], cube, atol=1e-3)  # the object moved
    finally:
        env.close()


@pytest.mark.parametrize("task", ["reach", "push", "pick_and_place"])
def test_scripted_expert_succeeds(task):
    env = PandaTasks([task], image_size=32, max_steps=50)
    try:
        env.reset(seed=1)
        for _ in range(50):
            _, reward, terminated, truncated, info = env.step(expert_action(env))
            if terminated or truncated:
                break
        assert (info, reward, terminated) == ({"task": task, "success": True}, 1.0, True)
    finally:
        env.close()


def distance_to_go(env: PandaTasks) -> float:
    """The object's distance to the target plus the gripper's to where a push starts (behind the
    cube, 5 cm from its centre, away from the target; the object itself for other tasks), from
    the simulator."""
    task, ee = env.task.task, env.task.robot.get_ee_position()
    achieved, goal = task.get_achieved_goal(), task.get_goal()
    hold = achieved
    if env.task_name == "push":
        away = (achieved[:2] - goal[:2]) / np.linalg.norm(achieved[:2] - goal[:2])
        hold = np.append(achieved[:2] + 0.05 * away, achieved[2])
    return float(np.linalg.norm(achieved - goal) + np.linalg.norm(ee - hold))


@pytest.mark.parametrize("task", ["reach", "push"])
def test_dense_reward_is_progress_plus_success(task):
    """`reward: dense`: each step's reward is DENSE_SCALE × the metres it closed, plus 1 on success;
    the expert's episode gains exactly its whole progress (potential-based shaping telescopes)."""
    env = PandaTasks([task], image_size=32, max_steps=50, reward="dense")
    try:
        env.reset(seed=1)
        start = before = distance_to_go(env)
        total = 0.0
        for _ in range(50):
            _, reward, terminated, truncated, info = env.step(expert_action(env))
            after = distance_to_go(env)
            assert reward == float(info["success"]) + DENSE_SCALE * (before - after)
            total, before = total + reward, after
            if terminated or truncated:
                break
        assert info["success"] and terminated
        assert total == pytest.approx(1.0 + DENSE_SCALE * (start - after), abs=1e-9)
        assert after < start  # the expert made progress, and was paid for it
    finally:
        env.close()


def test_time_limits_per_task():
    """`max_steps: {task: steps}`: each task's episodes are truncated at its own limit."""
    env = PandaTasks(["reach", "push"], image_size=32, max_steps={"reach": 2, "push": 3})
    still = np.zeros(4, np.float32)  # the arm stays put: nothing succeeds
    try:
        lengths = {}
        for seed in range(6):
            _, info = env.reset(seed=seed)
            ends = [env.step(still)[2:4] for _ in range(env.limits[env.active])]
            assert ends[:-1] == [(False, False)] * (len(ends) - 1) and ends[-1] == (False, True)
            lengths.setdefault(info["task"], set()).add(len(ends))
        assert lengths == {"reach": {2}, "push": {3}}
    finally:
        env.close()


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"reward": "shaped"}, "env.kwargs.reward"),
        ({"max_steps": {"reach": 5}}, "env.kwargs.max_steps"),  # push has none
        ({"max_steps": 0}, "env.kwargs.max_steps"),
    ],
)
def test_bad_env_kwargs_name_the_key(kwargs, key):
    with pytest.raises(ConfigError) as raised:
        PandaTasks(["reach", "push"], image_size=32, **kwargs)
    assert f"'{key}'" in str(raised.value)


def test_success_metrics_per_task_and_overall():
    assert success_metrics([("reach", True), ("push", False), ("reach", False), ("reach", True)], "eval_") == {
        "eval_success_rate": 0.5,
        "eval_success_rate/push": 0.0,
        "eval_success_rate/reach": 2 / 3,
        "eval_success_rate_task_mean": 1 / 3,  # each task weighs the same: Meta-World's mean
    }
    assert success_metrics([("all", True), ("all", False)]) == {"success_rate": 0.5}
    assert success_metrics([]) == {}


def test_record_sft_then_train_from_it(tmp_path):
    demos = tmp_path / "demos"
    recorded = fleetrl(
        "record", "configs/sft_manipulation.yaml", *SMALL[:1], "--episodes", "3", "--out", str(demos), timeout=120
    )
    assert recorded.code == 0, recorded.stderr
    # a LeRobotDataset v3.0 (tests/test_lerobot_datasets.py); PyBullet prints its options on stdout first
    assert recorded.stdout.splitlines()[-1].startswith("3 successful episodes of "), recorded.stdout
    info = json.loads((demos / "meta/info.json").read_text())
    assert info["total_episodes"] == 3 and info["features"]["observation.images.image"]["shape"] == [32, 32, 3]

    wrong = fleetrl(
        "train", "configs/sft_manipulation.yaml", *SMALL[:1], f"algorithm.demonstrations={demos}", "--dry-run"
    )
    assert wrong.code == 2 and "'algorithm.name': got 'bc'" in wrong.stderr and "fleetrl sft" in wrong.stderr

    sft, rl = sft_then_train(
        tmp_path,
        (
            "configs/sft_manipulation.yaml",
            *SMALL,
            f"algorithm.demonstrations={demos}",
            "algorithm.updates_per_iteration=3",
        ),
        ("configs/ppo_manipulation.yaml", *SMALL, "algorithm.update_epochs=1"),
    )
    assert [record["iteration"] for record in sft.metrics] == [1, 2]
    assert all(record["grad_steps"] == 3 and record["bc_loss"] > 0 for record in sft.metrics)
    # both configs' model.predict_keys: the keypoints' error on sim_state, in both stages
    assert all(0 < record["prediction_error"] < 1 for record in (*sft.metrics, *rl.metrics))
    assert {"success_rate", "eval_success_rate"} <= set(sft.metrics[-1])

    assert f"policy weights from {sft.run_dir} (runner.init_from)" in rl.stderr
    assert [record["iteration"] for record in rl.metrics] == [1, 2]
    assert [record["policy_trained"] for record in rl.metrics] == [0, 0]  # the config's critic warm-up
    # Every iteration ends episodes (8-step limit); which tasks they were follows from the seeds.
    assert all("success_rate" in record for record in rl.metrics)
    per_task = {key for record in rl.metrics for key in record if key.startswith("success_rate/")}
    assert per_task == {"success_rate/reach", "success_rate/push"}
    evaluated = {key for key in rl.metrics[-1] if key.startswith("eval_success_rate")}
    assert evaluated == {
        "eval_success_rate",
        "eval_success_rate/reach",
        "eval_success_rate/push",
        "eval_success_rate_task_mean",
    }
    # Held-out play as a script reads it: stdout is the JSON alone (PyBullet prints its connect
    # options from C; they go to stderr)
    played = fleetrl("eval", str(rl.run_dir), "--episodes", "2", "--seed", "50000", "--json", timeout=120)
    assert played.code == 0, played.stderr
    report = json.loads(played.stdout)
    assert report["episodes"] == 2 and 0 <= report["success_rate"] <= 1, report

    # What init_from loads is exactly the SFT checkpoint's policy (weights only).
    assert [path.name for path in write_plots(rl.run_dir)] == [
        "learning_curve.png",
        "time_per_phase.png",
        "success_rate.png",
        "success_per_task.png",
    ]
    assert (rl.run_dir / "success_rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    config = load_config("configs/ppo_manipulation.yaml", SMALL[:6])
    env = small_env(max_steps=8, sim_state=True)
    actor = ActorWorker(config, env.observation_space, env.action_space)
    env.close()
    weights = initial_weights(str(sft.run_dir))
    actor.load_policy_weights(weights)
    assert all(torch.equal(actor.policy.state_dict()[key], value) for key, value in weights.items())
    assert weights.keys() == load_latest(sft.run_dir)["actor"]["policy"].keys()


@pytest.mark.parametrize(
    "args, named",
    [
        (["train", "configs/ppo_manipulation.yaml", "runner.init_from=/nowhere/run"], "'runner.init_from'"),
        (["sft", "configs/ppo_manipulation.yaml"], "'algorithm.name': got 'ppo'"),
        (
            ["sft", "configs/sft_manipulation.yaml", "algorithm.demonstrations=/nowhere/demos"],
            "'algorithm.demonstrations'",
        ),
    ],
)
def test_bad_stage_inputs_exit_2_naming_the_key(args, named, tmp_path, capsys):
    assert main([*args, f"runner.run_dir={tmp_path}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())

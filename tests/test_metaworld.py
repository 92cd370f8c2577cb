"""Meta-World v3 as one env (fleetrl.envs.metaworld_tasks, docs/guides/manipulation.md), on the real
suite: MuJoCo's physics, Meta-World's tasks, rewards and scripted policies, camera images rendered
off-screen through EGL (Mesa's llvmpipe on a machine without a GPU).

The suites and their task order, what one reset seed fixes (a GRPO group's task and start), the
observations of both kinds, the instructions and the held-out phrasing, success from Meta-World's
`info["success"]`, time limits per task, both rewards, and the user errors of the new keys."""

from __future__ import annotations

import numpy as np
import pytest

from fleetrl.config.schema import EnvConfig  # noqa: E402
from fleetrl.envs import metaworld_tasks  # noqa: E402
from fleetrl.envs.make import env_factory  # noqa: E402
from fleetrl.envs.metaworld_instructions import INSTRUCTIONS, TRAINING_PHRASINGS  # noqa: E402
from fleetrl.envs.metaworld_tasks import DENSE_MAX, MetaWorldTasks, TaskEnvPool, suite  # noqa: E402
from fleetrl.errors import ConfigError  # noqa: E402

ENV_ID = "fleetrl.envs.metaworld_tasks:MetaWorldTasks"
MT10 = [
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
]


def wrapped(**kwargs):
    """The env as fleetrl's env workers build it (the instruction as word ids)."""
    return env_factory(EnvConfig(id=ENV_ID, kwargs=kwargs))()


def play(env: MetaWorldTasks, policy, seed: int | None) -> tuple[list[float], bool, bool, dict, int]:
    """One episode from reset seed `seed` (None: the env's next): its rewards, whether it
    terminated / truncated, its last info, and its length."""
    env.reset(seed=seed)
    rewards: list[float] = []
    while True:
        _, reward, terminated, truncated, info = env.step(policy(env))
        rewards.append(reward)
        if terminated or truncated:
            return rewards, terminated, truncated, info, len(rewards)


def test_suites_are_meta_worlds_own():
    assert suite("MT10") == (MT10, True)
    tasks, observed = suite("MT50")
    assert len(tasks) == 50 and set(tasks) == set(INSTRUCTIONS) and observed
    train, hidden = suite("ML10-train")
    test, _ = suite("ML10-test")
    assert (len(train), len(test), hidden) == (10, 5, False) and not set(train) & set(test)
    assert test == ["drawer-open-v3", "door-close-v3", "shelf-place-v3", "sweep-into-v3", "lever-pull-v3"]
    assert len(suite("ML45-train")[0]) == 45 and len(suite("ML45-test")[0]) == 5


def test_a_round_plays_every_task_once_and_a_seed_fixes_task_and_start():
    """A round of resets of one env plays each task once (MT10 is the default suite: three of its
    tasks here, to build three scenes, not ten); one seed gives two envs the same task, start state
    and instruction (a GRPO group's members), and the episodes after it too; another seed another."""
    assert MetaWorldTasks().task_names == MT10
    tasks = MT10[:3]
    env, twin = MetaWorldTasks(tasks=tasks), MetaWorldTasks(tasks=tasks)
    try:
        env.reset(seed=7)
        rounds = [env.task_name] + [env.reset()[1]["task"] for _ in range(5)]
        assert sorted(rounds[:3]) == sorted(rounds[3:]) == sorted(tasks)
        first, info = env.reset(seed=7)
        same, twin_info = twin.reset(seed=7)
        assert info == twin_info and first["instruction"] == same["instruction"]
        assert all(np.array_equal(first[key], same[key]) for key in ("proprio", "state"))
        for _ in range(3):  # and the episodes after it, unseeded, go on together
            later, twin_later = env.reset()[0], twin.reset()[0]
            assert np.array_equal(later["state"], twin_later["state"])
        other = [env.reset(seed=seed)[0]["state"] for seed in (8, 9)]
        assert not np.array_equal(other[0], other[1])
    finally:
        env.close()
        twin.close()


def test_envs_of_a_process_share_each_task_s_scene_and_a_reused_scene_plays_an_episode_alike(monkeypatch):
    """An env holds only its active task's scene and gives it back when its task changes; the next
    env of the process to play that task takes it instead of building one (MT10 on 128 envs would
    otherwise hold 1,280 scenes), and the episode a seed fixes is the same on a scene that played
    others before. The last env to close closes the idle scenes."""
    pool = TaskEnvPool()
    monkeypatch.setattr(metaworld_tasks, "POOL", pool)
    tasks = ["reach-v3", "push-v3"]

    def episode(env: MetaWorldTasks, seed: int) -> np.ndarray:
        obs, _ = env.reset(seed=seed)
        states = [obs["state"]]
        for _ in range(5):
            states.append(env.step(np.full(4, 0.5, np.float32))[0]["state"])
        return np.stack(states)

    x, y, z = (MetaWorldTasks(tasks=tasks) for _ in range(3))
    first = {}  # task → a seed whose first episode plays it
    for seed in range(20):
        first.setdefault(x.reset(seed=seed)[1]["task"], seed)
    reach, push = first["reach-v3"], first["push-v3"]
    x.reset(seed=reach)
    reference = episode(y, reach)  # on another reach scene: x holds one
    reach_scenes = [x.task_env, y.task_env]
    assert reach_scenes[0] is not reach_scenes[1]
    x.reset(seed=push)  # x gives its reach scene back
    episode(y, push)  # and y its own
    again = episode(z, reach)
    assert any(z.task_env is scene for scene in reach_scenes)  # taken, not built
    assert np.array_equal(again, reference)  # the seed's episode, on a scene that played others first
    for env in (x, y, z):
        env.close()
    assert pool.users == 0 and not pool.idle  # every idle scene closed


def test_state_observation_proprio_and_instruction_words():
    env = wrapped(tasks=["push-v3"])
    try:
        space = env.observation_space
        assert set(space.spaces) == {"instruction", "proprio", "state"}
        assert (space["proprio"].shape, space["state"].shape) == ((4,), (35,))
        obs, info = env.reset(seed=3)
        assert space.contains(obs) and info == {"task": "push-v3"}
        words = env.vocabularies["instruction"].decode(obs["instruction"])
        assert words in INSTRUCTIONS["push-v3"][:TRAINING_PHRASINGS]
        hand = env.unwrapped.task_env.tcp_center
        assert np.allclose(obs["proprio"][:3], env.unwrapped.task_env.get_endeff_pos(), atol=1e-6)
        assert np.linalg.norm(obs["proprio"][:3] - hand) < 0.05
        goal = env.unwrapped.task_env._target_pos
        assert np.allclose(obs["state"][-3:], goal, atol=1e-6)  # MT: the goal is observed
    finally:
        env.close()


def test_phrasings_vary_in_training_and_the_held_out_one_only_in_evaluation():
    train, held_out = MetaWorldTasks(tasks=["reach-v3"]), MetaWorldTasks(tasks=["reach-v3"], instructions="held_out")
    try:
        said = {train.reset(seed=seed)[0]["instruction"] for seed in range(12)}
        assert said == set(INSTRUCTIONS["reach-v3"][:TRAINING_PHRASINGS])
        first, _ = held_out.reset(seed=0)
        assert first["instruction"] == INSTRUCTIONS["reach-v3"][TRAINING_PHRASINGS]
        assert np.array_equal(first["state"], train.reset(seed=0)[0]["state"])  # the same start
    finally:
        train.close()
        held_out.close()


def test_ml_splits_hide_the_goal():
    env = MetaWorldTasks(tasks="ML10-test")
    try:
        obs, info = env.reset(seed=0)
        assert info["task"] in suite("ML10-test")[0]
        assert np.array_equal(obs["state"][-3:], np.zeros(3))
        assert np.linalg.norm(env.raw[-3:]) > 0  # the expert still knows it
    finally:
        env.close()


@pytest.mark.parametrize("task", ["reach-v3", "button-press-topdown-v3"])
def test_scripted_policy_succeeds_by_meta_worlds_own_test(task):
    """Meta-World's scripted policy ends the episode on the step its `info["success"]` holds: a
    sparse reward of 1 there and only there."""
    env = MetaWorldTasks(tasks=[task], max_steps=150)
    try:
        rewards, terminated, truncated, info, length = play(env, MetaWorldTasks.expert_action, seed=11)
        assert (terminated, truncated, info) == (True, False, {"task": task, "success": True})
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0 and length < 150
    finally:
        env.close()


def test_time_limit_per_task():
    """Doing nothing is truncated at each task's own limit."""
    limits = {"reach-v3": 12, "drawer-close-v3": 7}
    env = MetaWorldTasks(tasks=list(limits), max_steps=limits)
    try:
        env.reset(seed=0)
        for _ in range(2):  # one round: both tasks
            rewards, terminated, truncated, info, length = play(env, lambda _: np.zeros(4, np.float32), seed=None)
            assert (terminated, truncated, length, sum(rewards)) == (False, True, limits[info["task"]], 0.0)
    finally:
        env.close()


def test_dense_reward_is_meta_worlds_and_success_pays_the_steps_left():
    """The dense reward is Meta-World's own /10, and the success step adds 1 for each step left to
    the limit (what staying at the goal would have paid)."""
    env = MetaWorldTasks(tasks=["reach-v3"], max_steps=150, reward="dense")
    try:
        env.reset(seed=0)
        task_env, steps = env.task_env, 0
        while True:
            action = env.expert_action()
            _, reward, terminated, truncated, info = env.step(action)
            expected, _ = task_env.evaluate_state(env.raw, action)  # Meta-World's reward for the step
            steps += 1
            if terminated or truncated:
                break
            assert 0 <= reward <= 1 and reward == pytest.approx(expected / DENSE_MAX)
        assert terminated and reward == pytest.approx(expected / DENSE_MAX + 150 - steps)
    finally:
        env.close()


def test_pixels_render_the_scene_from_two_cameras():
    """`observation: pixels` renders `corner` and a second camera off-screen (EGL): images of the
    configured size that change as the arm moves; `critic_state` adds the state for a critic."""
    env = wrapped(tasks=["reach-v3"], observation="pixels", image_size=32, cameras=["corner", "gripperPOV"])
    try:
        space = env.observation_space
        assert set(space.spaces) == {"instruction", "proprio", "image", "image2"}
        first, _ = env.reset(seed=0)
        assert space.contains(first) and first["image"].shape == (32, 32, 3)
        assert first["image"].std() > 10 and not np.array_equal(first["image"], first["image2"])
        for _ in range(10):
            later, *_ = env.step(np.array([1.0, 0.0, -1.0, 0.0], np.float32))
        assert np.abs(later["image"].astype(int) - first["image"]).sum() > 0  # the arm moved in view
    finally:
        env.close()
    critic = MetaWorldTasks(tasks=["reach-v3"], observation="pixels", image_size=16, critic_state=True)
    try:
        assert set(critic.observation_space.spaces) == {"instruction", "proprio", "image", "state"}
    finally:
        critic.close()


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"tasks": "MT11"}, "env.kwargs.tasks"),
        ({"tasks": ["push-v2"]}, "env.kwargs.tasks"),
        ({"observation": "image"}, "env.kwargs.observation"),
        ({"reward": "shaped"}, "env.kwargs.reward"),
        ({"instructions": "test"}, "env.kwargs.instructions"),
        ({"max_steps": {"push-v3": 10}}, "env.kwargs.max_steps"),
        ({"cameras": ["corner", "top", "side"]}, "env.kwargs.cameras"),
        ({"image_size": 4}, "env.kwargs.image_size"),
    ],
)
def test_bad_kwargs_name_the_key(kwargs, key):
    with pytest.raises(ConfigError) as error:
        MetaWorldTasks(**kwargs)
    assert error.value.key == key


def test_an_unknown_camera_names_the_key_and_the_cameras():
    env = MetaWorldTasks(tasks=["reach-v3"], observation="pixels", cameras=["top"])
    try:
        with pytest.raises(ConfigError) as error:
            env.reset(seed=0)
        assert error.value.key == "env.kwargs.cameras" and "corner" in str(error.value)
    finally:
        env.close()

"""Demonstrations in LeRobot's dataset format (issue 40, must-have 2), on real folders:

- what `fleetrl record` writes is a LeRobotDataset v3.0 whose frames are the simulator's own (the
  expert's episodes replayed from their seeds give the same observations, rewards and ends), and
  the same recording writes the same bytes;
- the tiny datasets in tests/data/lerobot/ were written by LeRobot's own writers (0.4.4: v3.0,
  0.3.3: v2.1, the camera an AV1 video) and read back by LeRobot's own reader into
  `lerobot_frames.npz` (benchmarks/compare/lerobot_datasets.py regenerates both): fleetrl's reader
  returns exactly those frames, and `fleetrl sft` trains from them through `algorithm.features`;
- a folder that cannot be used exits 2 naming the key, the value and what is valid.

That LeRobot's reader loads what fleetrl writes is checked by the same script, against LeRobot
itself (its venv is not CI's): docs/benchmarks/lerobot-datasets.json.
"""

from __future__ import annotations

import json
import shutil

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest

from fleetrl.cli import main
from fleetrl.config.schema import EnvConfig
from fleetrl.envs import demonstrations
from fleetrl.envs.make import env_factory, simulator_factory
from fleetrl.envs.recorder import RECORDING, record
from fleetrl.errors import ConfigError
from fleetrl.lerobot.reader import TASK, read_frames
from tests.support import LEROBOT_DATASETS, fleetrl

ENV = EnvConfig(
    id="fleetrl.envs.manipulation:PandaTasks",
    kwargs={"tasks": ["reach", "push"], "image_size": 32, "max_steps": 8, "reward": "dense", "sim_state": True},
)
RECORDED = [
    "observation.images.image",
    "observation.sim_state",
    "observation.state",
    "action",
    "next.reward",
    "next.done",
    "next.success",
]
# LeRobot's usual names, under which the fixtures hold the camera and the simulator's state
LEROBOT_NAMES = "algorithm.features={image: observation.images.front, sim_state: observation.environment_state}"
SMALL_SFT = [
    "env.kwargs={tasks: [reach, push], image_size: 32, max_steps: 8, reward: dense, sim_state: true}",
    "env.num_envs=2",
    "env.vectorization=sync",
    "algorithm.num_steps=8",
    "algorithm.minibatch_size=8",
    "algorithm.updates_per_iteration=3",
    "runner.total_env_steps=32",
    "runner.tensorboard=false",
    "runner.eval_interval=0",
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Three expert episodes recorded twice from the same seeds, into two folders."""
    first, second = (tmp_path_factory.mktemp("recorded") / name for name in ("a", "b"))
    record(ENV, 3, first, seed=0)
    record(ENV, 3, second, seed=0)
    return first, second


def test_record_writes_lerobot_v30(recorded):
    folder, _ = recorded
    info = json.loads((folder / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 25  # panda-gym: 20 × 2 ms a step
    assert list(info["features"]) == [*RECORDED, "timestamp", "frame_index", "episode_index", "index", "task_index"]
    assert info["features"]["observation.images.image"] == {
        "dtype": "image",
        "shape": [32, 32, 3],
        "names": ["height", "width", "channels"],
    }
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["total_episodes"] == 3 and info["splits"] == {"train": "0:3"}
    episodes = pq.read_table(folder / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    lengths = [episode["length"] for episode in episodes]
    assert [e["dataset_from_index"] for e in episodes] == [0, *np.cumsum(lengths)[:-1]]
    assert [e["dataset_to_index"] for e in episodes] == list(np.cumsum(lengths))
    assert sum(lengths) == info["total_frames"]
    assert all(e["stats/action/count"] == [e["length"]] for e in episodes)
    tasks = pq.read_table(folder / "meta/tasks.parquet").to_pandas()  # LeRobot's table: the text is the index
    assert set(tasks.index) == {task for episode in episodes for task in episode["tasks"]}
    assert info["total_tasks"] == len(tasks)
    stats = json.loads((folder / "meta/stats.json").read_text())
    assert np.array(stats["observation.images.image"]["mean"]).shape == (3, 1, 1)
    assert stats["action"]["count"] == [info["total_frames"]]


def test_recorded_frames_are_the_simulators_own(recorded):
    """Playing the recording again — every attempted seed in order in one simulator, as `record`
    played them (PyBullet carries solver state across resets), the kept episodes with their
    recorded actions — gives the recorded observations, rewards, ends and successes, bit for bit:
    PNG frames and all, nothing lost or shifted."""
    folder, _ = recorded
    frames = read_frames(folder, [*RECORDED, TASK], "demos")
    recording = json.loads((folder / RECORDING).read_text())
    starts = frames.episode_starts()
    kept = dict(zip(recording["episode_seeds"], zip(starts[:-1], starts[1:])))
    assert len(kept) == len(starts) - 1 == 3
    env = simulator_factory(ENV)()
    try:
        for seed in range(recording["first_seed"], recording["first_seed"] + recording["attempted"]):
            obs, _ = env.reset(seed=seed)
            if seed not in kept:  # a failed attempt, played again by the expert
                while not any(env.step(env.unwrapped.expert_action())[2:4]):
                    pass
                continue
            begin, end = kept[seed]
            for t in range(begin, end):
                assert frames.values[TASK][t] == obs["instruction"]
                for key in ("image", "state", "sim_state"):
                    name = "observation.images.image" if key == "image" else f"observation.{key}"
                    np.testing.assert_array_equal(frames.values[name][t], obs[key])
                obs, reward, terminated, truncated, info = env.step(frames.values["action"][t])
                assert frames.values["next.reward"][t, 0] == np.float32(reward)
                assert frames.values["next.done"][t, 0] == (terminated or truncated) == (t == end - 1)
                assert frames.values["next.success"][t, 0] == info["success"]
            assert info["success"]
    finally:
        env.close()


def test_the_same_recording_writes_the_same_bytes(recorded):
    first, second = recorded
    files = sorted(path.relative_to(first) for path in first.rglob("*") if path.is_file())
    assert files == sorted(path.relative_to(second) for path in second.rglob("*") if path.is_file())
    assert all((first / name).read_bytes() == (second / name).read_bytes() for name in files), files


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_lerobot_written_datasets_read_as_lerobot_reads_them(version):
    folder = LEROBOT_DATASETS / version / "dataset"
    assert json.loads((folder / "meta/info.json").read_text())["codebase_version"] == version
    with np.load(LEROBOT_DATASETS / version / "lerobot_frames.npz") as saved:
        theirs = {key: saved[key] for key in saved.files if key != "meta"}
        meta = json.loads(str(saved["meta"]))
    assert meta["cameras"] == {"observation.images.front": "video"}  # an AV1 mp4, decoded by PyAV here
    ours = read_frames(folder, list(theirs), "demos").values
    for key, expected in theirs.items():
        if key == TASK:
            assert list(ours[key]) == list(expected)
        else:
            np.testing.assert_array_equal(ours[key].reshape(expected.shape), expected, err_msg=key)


def test_sft_loads_a_lerobot_dataset_through_the_feature_mapping():
    """The BC actor's load: the fixture's frames as the env's observations (the task's words as
    the env's word ids), its actions, and returns of its rewards."""
    env = env_factory(ENV)()
    spaces = env.observation_space, env.action_space
    vocabulary = env.observation_space["instruction"].vocabulary
    env.close()
    features = {"image": "observation.images.front", "sim_state": "observation.environment_state"}
    folder = LEROBOT_DATASETS / "v3.0" / "dataset"
    demos = demonstrations.load(str(folder), features, "action", *spaces, gamma=0.9)
    frames = read_frames(folder, ["observation.images.front", "observation.state", "next.reward", TASK], "demos")
    np.testing.assert_array_equal(demos.obs["image"], frames.values["observation.images.front"])
    np.testing.assert_array_equal(demos.obs["state"], frames.values["observation.state"])
    assert [vocabulary.decode(ids) for ids in demos.obs["instruction"]] == list(frames.values[TASK])
    last = frames.episode_starts()[1] - 1  # an episode's last step: its return is its reward
    assert demos.returns[last] == frames.values["next.reward"][last, 0] and demos.episodes == 2
    with pytest.raises(ConfigError, match=r"'algorithm.features.image': got 'observation.images.image'"):
        demonstrations.load(str(folder), {}, "action", *spaces, gamma=0.9)  # fleetrl's default names
    wider = gym.spaces.Dict({**spaces[0].spaces, "image": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)})
    with pytest.raises(ConfigError, match=r"the env's shape \(64, 64, 3\).*the dataset's is \(32, 32, 3\)"):
        demonstrations.check_spaces(str(folder), features, "action", 0.5, wider, spaces[1])


def test_sft_trains_from_a_v21_dataset_lerobot_wrote_and_evaluates_once_the_dataset_is_gone(tmp_path, capsys):
    """The SFT run trains from a copy of the v2.1 fixture. Once that copy is removed (moved or
    re-recorded since), `fleetrl eval` of the finished run still plays its weights (it reads no
    demonstrations), while a new `fleetrl sft` of the same config still exits 2 naming the folder."""
    folder = tmp_path / "dataset"
    shutil.copytree(LEROBOT_DATASETS / "v2.1" / "dataset", folder)
    run = fleetrl(
        "sft",
        "configs/sft_manipulation.yaml",
        *SMALL_SFT,
        f"algorithm.demonstrations={folder}",
        LEROBOT_NAMES,
        f"runner.run_dir={tmp_path / 'runs'}",
        "--skip-doctor",
        runs=tmp_path / "runs",
        timeout=300,
    ).succeeded()
    frames = json.loads((folder / "meta/info.json").read_text())["total_frames"]
    assert [record["demonstration_steps"] for record in run.metrics] == [frames, frames]
    assert all(record["grad_steps"] == 3 and record["bc_loss"] > 0 for record in run.metrics)
    shutil.rmtree(folder)
    assert main(["eval", str(run.run_dir), "--episodes", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    assert main(["sft", str(run.run_dir / "config.yaml"), "--dry-run"]) == 2
    assert "'algorithm.demonstrations'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, override, named",
    [
        ("v2.0", [], ["'algorithm.demonstrations'", "v3.0 or v2.1", "codebase_version 'v2.0'"]),
        (
            None,
            ["algorithm.features={image: observation.images.top}"],
            ["'algorithm.features.image'", "'observation.images.top'", "observation.images.front"],
        ),
        (None, ["algorithm.action_feature=actions"], ["'algorithm.action_feature'", "did you mean 'action'?"]),
        (None, ["algorithm.features={image: 3}"], ["'algorithm.features.image'", "a value of type str"]),
    ],
)
def test_an_unusable_dataset_exits_2_naming_the_key(tmp_path, capsys, change, override, named):
    folder = tmp_path / "dataset"
    shutil.copytree(LEROBOT_DATASETS / "v2.1" / "dataset", folder)
    if change:
        info = json.loads((folder / "meta/info.json").read_text())
        (folder / "meta/info.json").write_text(json.dumps({**info, "codebase_version": change}))
    code = main(["sft", "configs/sft_manipulation.yaml", f"algorithm.demonstrations={folder}", *override, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert all(part in err for part in named), err

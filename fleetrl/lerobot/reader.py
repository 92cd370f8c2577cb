"""A local LeRobotDataset folder (v3.0 or v2.1) → its frames as NumPy arrays, the features asked for.

What `read_frames` returns is what LeRobot's `LeRobotDataset[i]` gives for frame i, as arrays over
all frames at once: each feature (N, *shape) in its declared dtype — cameras (N, H, W, 3) uint8,
whether stored as images in the Parquet files or as mp4 videos — and each frame's task text. The
frames come in the dataset's order, episode after episode; each episode's frames must be
contiguous and numbered 0, 1, ... (`frame_index`), as every LeRobot writer leaves them.

Only the columns asked for are read (a published dataset's other cameras stay on disk), and the
whole of each is held in memory: this is for the datasets a behaviour-cloning run trains from,
not for streaming a large corpus.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fleetrl.errors import ConfigError
from fleetrl.lerobot import layout
from fleetrl.lerobot.features import IMAGE, STRING, VIDEO, column_values, decode_image
from fleetrl.lerobot.video import FrameTimeError, decode_at

TASK = "task"  # the frame's task text: LeRobot's `task`, from `task_index` and the tasks table


@dataclass
class Frames:
    """Every frame of a dataset, the features asked for (`values` by feature key)."""

    values: dict[str, np.ndarray]  # (N, *shape) per feature; TASK: (N,) str
    episode_index: np.ndarray  # (N,) int64
    frame_index: np.ndarray  # (N,) int64: the frame's step within its episode
    info: dict  # meta/info.json

    def __len__(self) -> int:
        return len(self.episode_index)

    def episode_starts(self) -> np.ndarray:
        """Where each episode's frames start, and the end: (episodes + 1,) offsets."""
        starts = np.flatnonzero(self.frame_index == 0)
        return np.append(starts, len(self))


def read_frames(folder: str | Path, keys: list[str], key: str) -> Frames:
    """The frames of the dataset in `folder` with the features `keys` (feature keys of its
    `info.json`, and TASK). A folder that is no readable dataset, or one whose frames are out of
    order or whose videos miss frames, is a `ConfigError` at `key` (the config key naming it)."""
    folder = Path(folder)
    info = layout.read_info(folder, key)
    features = info["features"]
    unknown = [name for name in keys if name != TASK and name not in features]
    if unknown:
        raise ConfigError(key, str(folder), f"a dataset with the features {unknown}", f"it has {sorted(features)}")
    stored = [name for name in keys if name != TASK and features[name]["dtype"] != VIDEO]
    columns = list(dict.fromkeys([*stored, "timestamp", "frame_index", "episode_index", "task_index"]))
    table = read_table(folder, columns, key)
    frame_index = column_values(table["frame_index"], features["frame_index"]).reshape(-1).astype(np.int64)
    episode_index = column_values(table["episode_index"], features["episode_index"]).reshape(-1).astype(np.int64)
    check_order(episode_index, frame_index, folder, key)
    values: dict[str, np.ndarray] = {}
    for name in keys:
        if name == TASK:
            tasks = read_tasks(folder, info)
            task_index = column_values(table["task_index"], features["task_index"]).reshape(-1)
            values[name] = np.array([tasks[int(index)] for index in task_index], dtype=object)
        elif features[name]["dtype"] == VIDEO:
            timestamps = column_values(table["timestamp"], features["timestamp"]).reshape(-1).astype(np.float64)
            values[name] = read_video(folder, info, name, episode_index, timestamps, key)
        elif features[name]["dtype"] == IMAGE:
            values[name] = np.stack([decode_image(cell["bytes"]) for cell in table[name].to_pylist()])
        elif features[name]["dtype"] == STRING:
            values[name] = np.array(table[name].to_pylist(), dtype=object)
        else:
            values[name] = column_values(table[name], features[name]).astype(features[name]["dtype"], copy=False)
    return Frames(values, episode_index, frame_index, info)


def read_table(folder: Path, columns: list[str], key: str) -> pa.Table:
    """The frames' columns `columns`, the data files concatenated in path order (LeRobot's order:
    chunk by chunk, file by file — v2.1's per-episode files sort by episode the same way)."""
    paths = sorted((folder / "data").glob("*/*.parquet"))
    if not paths:
        raise ConfigError(key, str(folder), "a dataset with frames in data/chunk-*/ (*.parquet)", "there are none")
    # read as written, without the `datasets` types of the schema metadata
    tables = [pq.read_table(path, columns=columns) for path in paths]
    return pa.concat_tables([table.replace_schema_metadata(None) for table in tables])


def check_order(episode_index: np.ndarray, frame_index: np.ndarray, folder: Path, key: str) -> None:
    """Each episode's frames contiguous and numbered 0, 1, ...: what the episode boundaries (and
    action chunks, returns) are read from."""
    starts = np.flatnonzero(frame_index == 0)
    expected = np.arange(len(frame_index)) - np.repeat(starts, np.diff(np.append(starts, len(frame_index))))
    new_episode = np.diff(episode_index) != 0
    if (
        len(starts) == 0
        or starts[0] != 0
        or not np.array_equal(frame_index, expected)
        or not np.array_equal(np.flatnonzero(new_episode) + 1, starts[1:])
    ):
        raise ConfigError(
            key,
            str(folder),
            "a dataset whose episodes' frames are contiguous and numbered from 0 (frame_index)",
            "its data files hold them otherwise",
        )


def read_tasks(folder: Path, info: dict) -> dict[int, str]:
    """task_index → task text: v3.0's tasks.parquet (the text is the pandas index), v2.1's tasks.jsonl."""
    if info["codebase_version"] == layout.V21:
        lines = (folder / layout.TASKS_V21).read_text().splitlines()
        return {entry["task_index"]: entry["task"] for entry in map(json.loads, filter(None, lines))}
    table = pq.read_table(folder / layout.TASKS)
    text = next(name for name in table.column_names if name != "task_index")
    return dict(zip(table["task_index"].to_pylist(), table[text].to_pylist()))


def read_video(
    folder: Path, info: dict, name: str, episode_index: np.ndarray, timestamps: np.ndarray, key: str
) -> np.ndarray:
    """Camera `name`'s frames at each frame's timestamp, from its mp4 files: v3.0 concatenates
    episodes in a file (the episodes table gives each one's file and start time), v2.1 has a file
    per episode starting at 0."""
    where = video_files(folder, info, name)
    frames = np.empty((len(timestamps), *info["features"][name]["shape"]), np.uint8)
    by_file: dict[Path, list[int]] = {}
    for episode in np.unique(episode_index):
        by_file.setdefault(where[int(episode)][0], []).append(int(episode))
    for path, episodes in by_file.items():
        rows = np.flatnonzero(np.isin(episode_index, episodes))
        starts = np.array([where[int(episode)][1] for episode in episode_index[rows]])
        try:
            decoded = decode_at(path, starts + timestamps[rows])
        except FrameTimeError as error:
            raise ConfigError(
                key, str(folder), "videos holding a frame at every frame's timestamp", str(error)
            ) from None
        if decoded.shape[1:] != frames.shape[1:]:
            raise ConfigError(
                key,
                str(folder),
                f"{name}'s frames of the shape its info.json declares, {frames.shape[1:]}",
                f"{path} decodes to {decoded.shape[1:]}",
            )
        frames[rows] = decoded
    return frames


def video_files(folder: Path, info: dict, name: str) -> dict[int, tuple[Path, float]]:
    """episode → (its mp4 for camera `name`, the episode's start time in it)."""
    if info["codebase_version"] == layout.V21:
        chunk = info.get("chunks_size", layout.CHUNKS_SIZE)
        return {
            episode: (
                folder
                / info["video_path"].format(episode_chunk=episode // chunk, video_key=name, episode_index=episode),
                0.0,
            )
            for episode in range(info["total_episodes"])
        }
    columns = [f"videos/{name}/chunk_index", f"videos/{name}/file_index", f"videos/{name}/from_timestamp"]
    paths = sorted((folder / layout.EPISODES_DIR).glob("*/*.parquet"))
    table = pa.concat_tables([pq.read_table(path, columns=["episode_index", *columns]) for path in paths])
    return {
        episode: (folder / info["video_path"].format(video_key=name, chunk_index=chunk, file_index=file), start)
        for episode, chunk, file, start in zip(*(table[column].to_pylist() for column in ["episode_index", *columns]))
    }

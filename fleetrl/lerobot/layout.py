"""Where a LeRobotDataset keeps what, by version, and its `meta/info.json`.

Version 3.0 (LeRobot 0.4, written by fleetrl) packs many episodes into each file:

    meta/info.json                                   version, fps, features, totals, path templates
    meta/stats.json                                  statistics of every numeric and image feature
    meta/tasks.parquet                               one row per task: its text (the index) and task_index
    meta/episodes/chunk-000/file-000.parquet         one row per episode: length, tasks, its frames'
                                                     [dataset_from_index, dataset_to_index), its files, stats
    data/chunk-000/file-000.parquet                  one row per frame
    videos/<key>/chunk-000/file-000.mp4              a camera's frames, episodes one after another

Version 2.1 (what most published datasets still use) keeps one file per episode:

    meta/info.json, meta/tasks.jsonl, meta/episodes.jsonl, meta/episodes_stats.jsonl
    data/chunk-000/episode_000000.parquet
    videos/chunk-000/<key>/episode_000000.mp4

Both name a frame's columns alike: the features of `info.json`, plus `timestamp`, `frame_index`,
`episode_index`, `index` (the frame's place in the dataset) and `task_index`. Only the file
layout and the task and episode tables differ, so a reader differs only in how it lists files.
"""

from __future__ import annotations

import json
from pathlib import Path

from fleetrl.errors import ConfigError

V30, V21 = "v3.0", "v2.1"
READABLE = (V30, V21)

INFO = "meta/info.json"
STATS = "meta/stats.json"
TASKS = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
EPISODES_PATH = f"{EPISODES_DIR}/{CHUNK_FILE}.parquet"
DATA_PATH = f"data/{CHUNK_FILE}.parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
TASKS_V21 = "meta/tasks.jsonl"
EPISODES_V21 = "meta/episodes.jsonl"

# LeRobot's defaults for a new dataset: at most this many files in a chunk folder, and a file's size
# before the next one starts (v3.0).
CHUNKS_SIZE = 1000
DATA_FILES_SIZE_IN_MB = 100
VIDEO_FILES_SIZE_IN_MB = 200

# The columns every frame has besides the dataset's own features, as LeRobot declares them.
FRAME_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def new_info(fps: int, features: dict, robot_type: str | None = None) -> dict:
    """The `info.json` of an empty v3.0 dataset of `features` (FRAME_FEATURES added last, as
    LeRobot orders them); the totals grow as episodes are written."""
    return {
        "codebase_version": V30,
        "robot_type": robot_type,
        "total_episodes": 0,
        "total_frames": 0,
        "total_tasks": 0,
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": DATA_FILES_SIZE_IN_MB,
        "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB,
        "fps": fps,
        "splits": {},
        "data_path": DATA_PATH,
        "video_path": None,
        "features": {**features, **FRAME_FEATURES},
    }


def write_json(data: dict, path: Path) -> None:
    """JSON as LeRobot writes it: indented by 4, non-ASCII kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False))


def read_info(folder: str | Path, key: str) -> dict:
    """The `meta/info.json` of the dataset in `folder`, checked to be of a version fleetrl reads:
    a folder without one, or another version, is a `ConfigError` at `key`."""
    path = Path(folder) / INFO
    if not path.is_file():
        raise ConfigError(key, str(folder), f"a LeRobotDataset folder holding {INFO} (fleetrl record writes one)")
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(key, str(folder), f"a readable {INFO}", f"it is not JSON: {error}") from None
    version = info.get("codebase_version")
    if version not in READABLE:
        raise ConfigError(
            key,
            str(folder),
            f"a LeRobotDataset of version {' or '.join(READABLE)}",
            f"its {INFO} says codebase_version {version!r}"
            + (
                ": LeRobot's conversion scripts bring an older folder to v2.1 (lerobot 0.3's datasets/v2 and"
                " datasets/v21) and on to v3.0 (lerobot 0.4's datasets/v30/convert_dataset_v21_to_v30.py)"
                if isinstance(version, str) and version.startswith(("v1", "v2.0"))
                else ""
            ),
        )
    missing = [name for name in ("fps", "features", "data_path", "total_episodes") if name not in info]
    if missing:
        raise ConfigError(key, str(folder), f"a complete {INFO}", f"it lacks {', '.join(missing)}")
    return info

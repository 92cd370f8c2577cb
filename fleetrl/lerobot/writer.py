"""`DatasetWriter`: episodes in, a LeRobotDataset v3.0 folder out (`layout` shows the folder).

Each episode is appended to the current frames file as one Parquet row group, as LeRobot's own
writer does, and a new file starts (file-001, ...; a new chunk folder after `CHUNKS_SIZE` files)
once the current one holds `DATA_FILES_SIZE_IN_MB` of frames. The tasks, episodes and statistics
tables and `info.json` are written by `close`, so a folder with an `info.json` is complete: an
interrupted recording leaves none, and nothing reads it as a dataset.

Cameras are `image` features: every frame a lossless PNG inside the Parquet file. LeRobot's
reader takes them as it takes mp4 videos, behaviour cloning learns from exactly the pixels the
simulator rendered, and the bytes depend only on the pinned pyarrow and Pillow — the same
recording writes the same folder, byte for byte. (A 64×64 frame is ~6 KB as PNG; a video codec
would take a tenth of that, lossily, and its encoder's output varies with threads and builds.)

Every episode has one task (its instruction), as LeRobot's tasks table gives it an index.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fleetrl.errors import UserError
from fleetrl.lerobot import layout, stats
from fleetrl.lerobot.features import IMAGE, arrow_type, encode_png, huggingface_metadata

MEGABYTE = 1024 * 1024


class DatasetWriter:
    """A new LeRobotDataset v3.0 in `folder` (which must not hold one) of `features` (their
    declarations: `{"dtype", "shape", "names"}`), recorded at `fps` frames per second."""

    def __init__(self, folder: str | Path, fps: int, features: dict[str, dict], robot_type: str | None = None):
        self.folder = Path(folder)
        if (self.folder / layout.INFO).exists():
            raise UserError(f"{self.folder} already holds a dataset ({layout.INFO}): choose another folder")
        self.info = layout.new_info(fps, features, robot_type)
        self.features = self.info["features"]
        self.schema = pa.schema(
            [(key, arrow_type(feature)) for key, feature in self.features.items()],
            metadata=huggingface_metadata(self.features),
        )
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict] = []
        self.episode_stats: list[dict[str, dict[str, np.ndarray]]] = []
        self.chunk_index = self.file_index = 0
        self.file: pq.ParquetWriter | None = None
        self.file_bytes = 0

    def add_episode(self, frames: dict[str, np.ndarray], task: str) -> None:
        """Append one episode: `frames` maps every declared feature to its (T, *shape) values
        (cameras (T, H, W, 3) uint8); the frame columns (`layout.FRAME_FEATURES`) are made here."""
        own = {key: feature for key, feature in self.features.items() if key not in layout.FRAME_FEATURES}
        if set(frames) != set(own):
            raise ValueError(f"an episode needs exactly the features {sorted(own)}; got {sorted(frames)}")
        length = len(frames["action"] if "action" in frames else next(iter(frames.values())))
        for key, values in frames.items():
            shape = tuple(own[key]["shape"])
            scalar = shape == (1,) and values.shape == (length,)
            if len(values) != length or (values.shape[1:] != shape and not scalar):
                raise ValueError(f"feature {key!r}: frames of shape {values.shape}; {length} of shape {shape} declared")
        episode_index, start = len(self.episodes), self.info["total_frames"]
        task_index = self.tasks.setdefault(task, len(self.tasks))
        columns = {
            **frames,
            "timestamp": (np.arange(length) / self.info["fps"]).astype(np.float32),
            "frame_index": np.arange(length, dtype=np.int64),
            "episode_index": np.full(length, episode_index, np.int64),
            "index": np.arange(start, start + length, dtype=np.int64),
            "task_index": np.full(length, task_index, np.int64),
        }
        self.write_frames(columns)
        self.episode_stats.append(
            {
                key: stats.feature_stats(np.asarray(values), self.features[key]["dtype"] == IMAGE)
                for key, values in columns.items()
                if self.features[key]["dtype"] != "string"
            }
        )
        self.episodes.append(
            {
                "episode_index": episode_index,
                "tasks": [task],
                "length": length,
                "data/chunk_index": self.chunk_index,
                "data/file_index": self.file_index,
                "dataset_from_index": start,
                "dataset_to_index": start + length,
            }
        )
        self.info["total_episodes"] += 1
        self.info["total_frames"] += length

    def write_frames(self, columns: dict[str, np.ndarray]) -> None:
        """One episode's frames as one row group of the current frames file (a new file first when
        the current one is full)."""
        if self.file is not None and self.file_bytes >= self.info["data_files_size_in_mb"] * MEGABYTE:
            self.file.close()
            self.file, self.file_bytes = None, 0
            self.file_index += 1
            if self.file_index == self.info["chunks_size"]:
                self.chunk_index, self.file_index = self.chunk_index + 1, 0
        if self.file is None:
            path = self.folder / self.info["data_path"].format(chunk_index=self.chunk_index, file_index=self.file_index)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = pq.ParquetWriter(path, self.schema, compression="snappy", use_dictionary=True)
        arrays = [self.column(key, columns[key], field.type) for key, field in zip(self.schema.names, self.schema)]
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        self.file.write_table(table)
        self.file_bytes += table.nbytes

    def column(self, key: str, values: np.ndarray, kind: pa.DataType) -> pa.Array:
        if self.features[key]["dtype"] == IMAGE:
            # `path` names the frame as LeRobot's PNGs are named before it embeds them
            paths = [f"frame-{index:06d}.png" for index in range(len(values))]
            return pa.StructArray.from_arrays(
                [pa.array([encode_png(frame) for frame in values], pa.binary()), pa.array(paths, pa.string())],
                fields=list(kind),
            )
        if pa.types.is_fixed_size_list(kind):
            flat = pa.array(np.ascontiguousarray(values).reshape(-1), kind.value_type)
            return pa.FixedSizeListArray.from_arrays(flat, kind.list_size)
        return pa.array(np.asarray(values).reshape(len(values)), kind)

    def close(self) -> dict:
        """Write the tables and `info.json` (last: its presence marks the folder complete); the info."""
        if self.file is not None:
            self.file.close()
            self.file = None
        if not self.episodes:
            raise ValueError("a dataset needs at least one episode")
        self.write_tasks()
        self.write_episodes()
        merged = {
            key: stats.aggregate([episode[key] for episode in self.episode_stats]) for key in self.episode_stats[0]
        }
        layout.write_json(stats.as_json(merged), self.folder / layout.STATS)
        self.info["total_tasks"] = len(self.tasks)
        self.info["splits"] = {"train": f"0:{self.info['total_episodes']}"}
        layout.write_json(self.info, self.folder / layout.INFO)
        return self.info

    def write_tasks(self) -> None:
        """`meta/tasks.parquet`: LeRobot's pandas table, the task's text as its index."""
        import pandas as pd

        path = self.folder / layout.TASKS
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"task_index": list(self.tasks.values())}, index=list(self.tasks)).to_parquet(path)

    def write_episodes(self) -> None:
        """The episodes table (one file: ~1 KB an episode, so a hundred thousand episodes before
        LeRobot's 100 MB would start a second), each row with its episode's statistics."""
        rows = []
        for episode, episode_stats in zip(self.episodes, self.episode_stats):
            row = dict(episode)
            for key, values in episode_stats.items():
                row.update({f"stats/{key}/{name}": value.tolist() for name, value in values.items()})
            row["meta/episodes/chunk_index"] = 0
            row["meta/episodes/file_index"] = 0
            rows.append(row)
        table = pa.Table.from_pylist(rows)
        path = self.folder / layout.EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="snappy", use_dictionary=True)

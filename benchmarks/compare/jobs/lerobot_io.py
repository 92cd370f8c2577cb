"""LeRobot's own dataset code, run in LeRobot's venv (`bash benchmarks/setup_venvs.sh lerobot`) by
benchmarks/compare/lerobot_datasets.py. Two commands:

    python lerobot_io.py read DATASET OUT.npz [BACKEND]
        LeRobotDataset(root=DATASET)[i] for every frame i, as LeRobot's reader gives them (its
        videos decoded by BACKEND: torchcodec, LeRobot's default, or pyav), saved as
        arrays: every feature (cameras back to (N, H, W, 3) uint8 from LeRobot's [0, 1] floats),
        `task` (each frame's text) and, under `meta.*`, what its metadata says.
    python lerobot_io.py write FRAMES.npz OUT_DIR SPEC.json
        LeRobotDataset.create, then add_frame for every frame and save_episode for every episode:
        a dataset written by LeRobot's own writer from the frames of FRAMES.npz (a `read` output),
        its features renamed and typed as SPEC.json says ({"rename": {old: new}, "camera": "video"
        or "image", "fps": n}).

With lerobot 0.4.4 installed these read and write LeRobotDataset v3.0; with lerobot 0.3.3 first
on PYTHONPATH (the venv's lerobot-0.3.3/), v2.1. Nothing here is fleetrl's: it runs on LeRobot's
packages alone, and is not imported by fleetrl or its tests.
"""

from __future__ import annotations

import inspect
import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np


def lerobot_version() -> str:
    import lerobot

    # lerobot 0.3.3 unpacked on PYTHONPATH has no installed metadata of its own: its folder says
    where = Path(lerobot.__file__).resolve()
    return "0.3.3" if "lerobot-0.3.3" in str(where) else version("lerobot")


def read(dataset: Path, out: Path, backend: str | None = None) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("fleetrl/check", root=dataset, video_backend=backend)
    features = ds.meta.features
    cameras = set(ds.meta.camera_keys)
    items = [ds[i] for i in range(len(ds))]
    arrays = {}
    for key in features:
        values = [item[key] for item in items]
        if key in cameras:  # LeRobot's images and video frames: float (3, H, W) in [0, 1]
            stacked = np.stack([value.numpy() for value in values])
            arrays[key] = np.rint(stacked * 255).astype(np.uint8).transpose(0, 2, 3, 1)
        else:
            arrays[key] = np.stack(
                [np.asarray(value.numpy()).reshape(tuple(features[key]["shape"])) for value in values]
            )
    arrays["task"] = np.array([item["task"] for item in items])
    meta = {
        "lerobot": lerobot_version(),
        "codebase_version": ds.meta.info["codebase_version"],
        "fps": ds.fps,
        "total_episodes": ds.meta.total_episodes,
        "total_frames": ds.meta.total_frames,
        "total_tasks": ds.meta.total_tasks,
        "cameras": {key: features[key]["dtype"] for key in sorted(cameras)},
        "video_backend": getattr(ds, "video_backend", None),
        "stats_keys": sorted(ds.meta.stats) if ds.meta.stats else [],
    }
    np.savez_compressed(out, **arrays, meta=np.array(json.dumps(meta)))
    print(json.dumps(meta))


def write(frames_path: Path, out: Path, spec_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    spec = json.loads(spec_path.read_text())
    rename = spec["rename"]
    with np.load(frames_path) as data:
        frames = {key: data[key] for key in data.files if key != "meta"}
    skip = {"timestamp", "frame_index", "episode_index", "index", "task_index", "task"}
    features = {}
    for key, values in frames.items():
        if key in skip:
            continue
        name = rename.get(key, key)
        if values.dtype == np.uint8 and values.ndim == 4:
            features[name] = {
                "dtype": spec["camera"],
                "shape": values.shape[1:],
                "names": ["height", "width", "channels"],
            }
        else:
            features[name] = {"dtype": values.dtype.name, "shape": values.shape[1:] or (1,), "names": None}
    ds = LeRobotDataset.create(
        "fleetrl/check", fps=spec["fps"], features=features, root=out, use_videos=spec["camera"] == "video"
    )
    task_in_frame = "task" not in inspect.signature(ds.add_frame).parameters  # 0.4: the task is part of the frame
    episodes = frames["episode_index"].reshape(-1)
    for episode in np.unique(episodes):
        for i in np.flatnonzero(episodes == episode):
            frame = {rename.get(key, key): np.asarray(frames[key][i]) for key in frames if key not in skip}
            if task_in_frame:
                ds.add_frame({**frame, "task": str(frames["task"][i])})
            else:
                ds.add_frame(frame, task=str(frames["task"][i]))
        ds.save_episode()
    if hasattr(ds, "finalize"):
        ds.finalize()
    print(json.dumps({"lerobot": lerobot_version(), "written": str(out), "episodes": int(len(np.unique(episodes)))}))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "read":
        read(Path(args[0]), Path(args[1]), *args[2:])
    else:
        write(*map(Path, args))

"""Atomic checkpoints: a crash while saving never damages the checkpoint before it.

Each checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
over its final name (rename is atomic on POSIX). Only the newest `keep` are kept.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from fleetrl.errors import UserError

PATTERN = re.compile(r"^ckpt_(\d{8})\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, iteration: int, state: dict, keep: int) -> Path:
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"ckpt_{iteration:08d}.pt"
    temporary = folder / f".{final.name}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, final)
    except BaseException:  # a full disk, a signal: leave no half file taking the space
        temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink()
    return final


def _fsync_dir(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary files of interrupted saves are ignored)."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if PATTERN.match(path.name))


def load_latest(run_dir: Path) -> dict:
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise UserError(f"no checkpoint in {checkpoint_dir(run_dir)}: nothing to resume or evaluate")
    return torch.load(checkpoints[-1], weights_only=False)

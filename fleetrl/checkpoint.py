"""Checkpoints you can trust: a crash while saving never damages the checkpoint before it, and a
damaged checkpoint is never loaded.

Each checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
over its final name (rename is atomic on POSIX). Its sha256 goes to `<name>.sha256` beside it,
written (atomically too) before the rename, so every checkpoint of this format has its sum; one
without (older runs) is verified by loading alone. Only the newest `keep` are kept.

Loading (`load_latest`) takes the newest checkpoint that matches its sum and loads; newer damaged
ones (a truncated file, a disk that lied) are skipped with one warning naming each and why, and
when none is intact the error names every file and what is wrong with it.

Only finite state is saved: `save_checkpoint` looks at every float tensor and array of the state
first, and a NaN or infinity anywhere (weights, optimizer moments, normaliser statistics) raises
`NonFiniteError` naming it, writing nothing — so every checkpoint on disk is finite, and rotation,
which deletes only checkpoints older than the newest `keep`, never deletes the newest finite one.
Loading skips a checkpoint that holds non-finite values (one an older fleetrl wrote) as it skips a
damaged one. The actor's updates check their parameters themselves (algos/common/finite.py), which
covers the shards of a sharded checkpoint, written by the ranks.

Sharded checkpoints (`actor.checkpoint_format: sharded`, fleetrl/parallel/dcp.py): the actor
ranks write their shards into a staging folder; `save_checkpoint` records each file's sha256 in
the state under `shards`, renames the folder to `ckpt_<n>.dcp` beside `ckpt_<n>.pt`, and only
then writes the .pt — so an intact .pt vouches for its shards' sums, and a shard damaged later
makes the whole checkpoint damaged (skipped like any other). Pruning takes the folder along.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os
import re
import shutil
from pathlib import Path

from fleetrl.errors import UserError

log = logging.getLogger("fleetrl")
PATTERN = re.compile(r"^ckpt_(\d{8})\.pt$")
SUM_SUFFIX = ".sha256"


class NoIntactCheckpoint(UserError):
    """Every checkpoint of a run is damaged; `problems` maps each file to what is wrong with it."""

    def __init__(self, run_dir: Path, problems: dict[Path, str]):
        self.problems = problems
        listed = "; ".join(f"{path}: {why}" for path, why in problems.items())
        super().__init__(f"no intact checkpoint in {checkpoint_dir(run_dir)}: {listed}")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def sum_file(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + SUM_SUFFIX)


def shards_dir(checkpoint: Path) -> Path:
    """The folder of a sharded checkpoint's shards, beside its .pt."""
    return checkpoint.with_suffix(".dcp")


def staging_dir(run_dir: Path, iteration: int) -> Path:
    """Where the actor ranks write checkpoint `iteration`'s shards before `save_checkpoint`."""
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f".ckpt_{iteration:08d}.dcp.tmp-{os.getpid()}"


def save_checkpoint(run_dir: Path, iteration: int, state: dict, keep: int, shards: Path | None = None) -> Path:
    """Write `state` as checkpoint `iteration`, with the shards staged in `shards` (a sharded
    checkpoint) moved beside it. A full disk raises OSError(ENOSPC) naming the file."""
    folder = checkpoint_dir(run_dir)
    final = folder / f"ckpt_{iteration:08d}.pt"
    temporary = folder / f".{final.name}.tmp-{os.getpid()}"
    import torch  # here, not at the top: `fleetrl train`'s supervisor lists checkpoints without torch

    found = non_finite_entry(state)
    if found is not None:
        from fleetrl.non_finite import NonFiniteError

        if shards is not None:
            shutil.rmtree(shards, ignore_errors=True)
        key, value = found
        raise NonFiniteError("checkpoint state", key, value, f"checkpoint {final.name} was not written")

    try:
        folder.mkdir(parents=True, exist_ok=True)
        if shards is not None:
            state = {**state, "shards": {name: sha256(shards / name) for name in sorted(os.listdir(shards))}}
            shutil.rmtree(shards_dir(final), ignore_errors=True)  # a resumed run's older attempt
            os.replace(shards, shards_dir(final))
        with open(temporary, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        _write_atomically(sum_file(final), f"{sha256(temporary)}  {final.name}\n".encode())
        os.replace(temporary, final)
    except BaseException as error:  # a full disk, a signal: leave no half file taking the space
        temporary.unlink(missing_ok=True)
        if shards is not None:
            shutil.rmtree(shards, ignore_errors=True)
        if full_disk(error):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final)) from error
        raise
    _fsync_dir(folder)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink()
        sum_file(old).unlink(missing_ok=True)
        shutil.rmtree(shards_dir(old), ignore_errors=True)
    return final


def non_finite_entry(state, key: str = "") -> tuple[str, float] | None:
    """(dotted key, value) of the first NaN or infinity in a state's float tensors and arrays
    (dicts, lists and tuples walked in order), or None."""
    import numpy as np  # here, not at the top: `fleetrl train`'s supervisor imports this module
    import torch

    from fleetrl.non_finite import all_finite, first_non_finite

    if isinstance(state, dict):
        entries = state.items()
    elif isinstance(state, list | tuple):
        entries = enumerate(state)
    elif isinstance(state, torch.Tensor) and state.is_floating_point() and not bool(torch.isfinite(state).all()):
        return key, float(state[~torch.isfinite(state)].flatten()[0])
    elif isinstance(state, np.ndarray) and not all_finite(state):
        return key, first_non_finite(state)[1]
    elif isinstance(state, float) and not math.isfinite(state):
        return key, state
    else:
        return None
    for name, value in entries:
        found = non_finite_entry(value, f"{key}.{name}" if key else str(name))
        if found is not None:
            return found
    return None


def full_disk(error: BaseException | None) -> bool:
    """Whether `error` or one it came from is ENOSPC (torch wraps a failed write in RuntimeError)."""
    return any(
        (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e)
        for e in causes(error)
    )


def causes(error: BaseException | None) -> list[BaseException]:
    """`error` and the exceptions it came from (raised from, or while handling), nearest first."""
    found: list[BaseException] = []
    while error is not None and len(found) < 10:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def check_sum(checkpoint: Path) -> None:
    """ValueError saying so when the checkpoint's sha256 differs from the sum beside it."""
    expected = sum_file(checkpoint)
    if expected.is_file():
        want = expected.read_text().split()[0] if expected.read_text().split() else "(empty sum file)"
        got = sha256(checkpoint)
        if got != want:
            size = checkpoint.stat().st_size
            raise ValueError(f"sha256 {got[:12]}… of its {size} bytes does not match {expected.name} ({want[:12]}…)")


def newest_intact(run_dir: Path) -> Path | None:
    """The newest checkpoint whose sum matches (without loading it), or None."""
    for checkpoint in reversed(list_checkpoints(run_dir)):
        try:
            check_sum(checkpoint)
        except (ValueError, OSError):
            continue
        return checkpoint
    return None


def verified_load(checkpoint: Path) -> dict:
    """The checkpoint's state; ValueError saying what is wrong when its sum differs or it does not load."""
    import torch  # here, not at the top: `fleetrl train`'s supervisor lists checkpoints without torch

    check_sum(checkpoint)
    try:
        state = torch.load(checkpoint, weights_only=False)
    except Exception as error:  # torch raises several kinds for a damaged file
        raise ValueError(f"does not load: {type(error).__name__}: {str(error).splitlines()[0]}") from error
    if "shards" in state:
        check_shards(shards_dir(checkpoint), state["shards"])
        state["shards_path"] = str(shards_dir(checkpoint))
    return state


def check_shards(folder: Path, sums: dict[str, str]) -> None:
    """ValueError naming the first shard file that is missing or differs from its recorded sum."""
    for name, want in sums.items():
        path = folder / name
        if not path.is_file():
            raise ValueError(f"its shard {path} is missing")
        got = sha256(path)
        if got != want:
            raise ValueError(f"its shard {path}: sha256 {got[:12]}… does not match the recorded {want[:12]}…")


def load_latest(run_dir: Path) -> dict:
    """The newest intact checkpoint's state (see the module docstring)."""
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise UserError(f"no checkpoint in {checkpoint_dir(run_dir)}: nothing to resume or evaluate")
    problems: dict[Path, str] = {}
    for checkpoint in reversed(checkpoints):
        try:
            state = verified_load(checkpoint)
        except (ValueError, OSError) as error:
            problems[checkpoint] = str(error)
            continue
        found = non_finite_entry(state)
        if found is not None:  # written before checkpoints were checked: never resumed from
            problems[checkpoint] = f"it holds a non-finite value: {found[0]} is {found[1]}"
            continue
        if problems:
            skipped = "; ".join(f"{path}: {why}" for path, why in problems.items())
            log.warning("skipping damaged checkpoint(s), using %s instead. %s", checkpoint.name, skipped)
        return state
    raise NoIntactCheckpoint(run_dir, problems)


def initial_weights(source: str) -> dict:
    """`runner.init_from`: the policy weights of a run directory's newest intact checkpoint, or
    of one checkpoint file; anything else is a `ConfigError` naming the key and the path."""
    from fleetrl.errors import ConfigError

    path = Path(source)
    valid = "a fleetrl run directory holding an intact checkpoint, or a checkpoint file (ckpt_*.pt)"
    try:
        if path.is_dir():
            state = load_latest(path)
        elif path.is_file():
            state = verified_load(path)
        else:
            raise ConfigError("runner.init_from", source, valid, "no such file or directory")
    except (UserError, ValueError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError("runner.init_from", source, valid, str(error)) from None
    weights = state.get("actor", {}).get("policy") if isinstance(state, dict) else None
    if not weights:
        raise ConfigError("runner.init_from", source, valid, "it holds no actor policy weights")
    return weights

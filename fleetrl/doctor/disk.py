"""Free space where the run writes: the run directory, Ray's temp (session) and spill directories.

The seed's dual-node freeze began with "/tmp/ray/session... is over 95% full": past 95% Ray stops
creating objects and callers wait. A path that does not exist yet is measured on the filesystem that
will hold it (its nearest existing parent).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fleetrl.doctor.context import Context
from fleetrl.doctor.on_nodes import START_UP_S, live_nodes, on_every_node
from fleetrl.doctor.options import DoctorOptions
from fleetrl.doctor.resources import ray_connected
from fleetrl.doctor.result import Check, failed, passed, warned


@dataclass(frozen=True)
class Usage:
    path: str  # the directory asked about
    measured: str  # the existing directory actually measured
    total: int
    free: int  # bytes available to unprivileged users (root-reserved blocks count as used)

    @property
    def used_percent(self) -> float:
        """(capacity - available) / capacity: the measure behind Ray's 'over 95% full'."""
        used = self.total - self.free
        return 100.0 * used / max(self.total, 1)


def measure(path: str | os.PathLike) -> Usage:
    existing = nearest_existing(Path(path))
    stats = os.statvfs(existing)
    return Usage(str(path), str(existing), stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize)


def nearest_existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def check_directory(name: str, role: str, path: str | os.PathLike, options: DoctorOptions, remedy_hint: str) -> Check:
    """One directory against the thresholds; `remedy_hint` says how to move it elsewhere."""
    try:
        usage = measure(path)
    except OSError as error:
        return failed(
            name,
            f"{role} {path}: cannot read its filesystem: {error}",
            f"make {path} (or its parent) readable, or {remedy_hint}",
        )
    return judge(name, role, usage, options, remedy_hint)


def judge(name: str, role: str, usage: Usage, options: DoctorOptions, remedy_hint: str) -> Check:
    """A measured directory against the thresholds (`check_directory`, or measured on a node)."""
    path = usage.path
    where = path if usage.measured == path else f"{path} (on {usage.measured})"
    detail = f"{role} {where}: {human(usage.free)} free of {human(usage.total)}, {usage.used_percent:.0f}% used"
    remedy = (
        f"free space on the filesystem of {usage.measured} (delete old runs, old "
        f"/tmp/ray/session_* folders, core dumps), or {remedy_hint}"
    )
    if usage.used_percent >= options.max_used_percent:
        return failed(
            name,
            f"{detail} (at or over {options.max_used_percent:g}%: Ray stops creating objects and the run stalls)",
            remedy,
        )
    if usage.free < options.min_free_bytes:
        return failed(name, f"{detail} (under the {human(options.min_free_bytes)} minimum)", remedy)
    if usage.used_percent >= options.warn_used_percent:
        return warned(name, f"{detail} (over {options.warn_used_percent:g}%)", remedy)
    return passed(name, detail)


def check_disk(context: Context) -> list[Check]:
    view, options = context.view, context.options
    runner = getattr(context.config, "runner", None)
    run_dir = getattr(runner, "run_dir", "runs")
    checks = [
        check_directory("disk.run_dir", "run directory", run_dir, options, "point runner.run_dir at a larger disk"),
        check_directory(
            "disk.ray_temp",
            "Ray temp directory",
            view.ray_temp_dir(),
            options,
            "start Ray with a temp dir on a larger disk: RAY_TMPDIR=/big/disk (or "
            "`ray start --temp-dir`) on every node",
        ),
    ]
    if ray_connected():
        checks += check_node_temp_dirs(options)
    for index, spill_dir in enumerate(view.ray_spill_dirs()):
        suffix = "" if index == 0 else f".{index}"
        checks.append(
            check_directory(
                f"disk.ray_spill{suffix}",
                "Ray object spill directory",
                spill_dir,
                options,
                "point Ray's object spilling at a larger disk (object_spilling_config directory_path)",
            )
        )
    return checks


def node_temp_usage(_node: int) -> tuple[str, Usage]:
    """Runs on a node: its host name, and its Ray temp directory (as its own Ray has it) measured there."""
    import socket

    from ray._private.worker import global_worker

    return socket.gethostname(), measure(global_worker.node.get_temp_dir_path())


def check_node_temp_dirs(options: DoctorOptions) -> list[Check]:
    """Every node's own Ray temp directory, measured on that node (`on_nodes.py`): the seed's
    full /tmp/ray was on the node that was not the driver's."""
    checks = []
    for outcome in on_every_node(live_nodes(), node_temp_usage, (), START_UP_S):
        name = f"disk.ray_temp.node{outcome.index}"
        if outcome.error:
            checks.append(outcome.did_not_run(name))
            continue
        hostname, usage = outcome.result
        remedy = f"restart Ray on {outcome.source} with a temp dir on a larger disk (`ray start --temp-dir`)"
        checks.append(judge(name, f"{outcome.source}, host {hostname}: Ray temp directory", usage, options, remedy))
    return checks

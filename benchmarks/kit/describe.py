"""What a result ran on: the machine, the versions, the commit, and each worker's torch threads."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

from kit.places import ROOT


def cpu_model() -> str:
    return next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )


def machine() -> dict:
    import torch

    info = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "loadavg": os.getloadavg(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    for package in ("ray", "gymnasium", "mujoco", "numpy"):
        try:
            info[package] = __import__(package).__version__
        except Exception:  # noqa: BLE001 - optional
            info[package] = "absent"
    try:
        from importlib.metadata import version

        info["fleetrl"] = version("fleetrl")
    except Exception:  # noqa: BLE001
        info["fleetrl"] = "?"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "fleetrl"], cwd=ROOT, capture_output=True, text=True)
    info["commit"] = commit.stdout.strip() + (" + uncommitted changes in fleetrl/" if dirty.stdout.strip() else "")
    return info


def machine_line(info: dict) -> str:
    return (
        f"{info['date']}; {info['cpus']} × {info['cpu_model']} ({info.get('gpu') or 'no GPU'}), Linux "
        f"{info['kernel']}; Python {info['python']}, torch {info['torch']}, ray {info['ray']}, gymnasium "
        f"{info['gymnasium']}, mujoco {info['mujoco']}, numpy {info['numpy']}; fleetrl {info['fleetrl']} "
        f"at {info['commit']}; load average at start {info['loadavg'][0]:.2f}"
    )


def placement_threads(config: str, overrides: list[str]) -> str:
    """The torch thread count of each worker, as fleetrl's placement resolves it."""
    from fleetrl.plan.layout import worker_processes
    from fleetrl.plan.load import load_unchecked
    from fleetrl.plan.resolve import resolve

    plan = resolve(load_unchecked(ROOT / config, [o for o in overrides if "=" in o]))
    cfg, layout = plan.config, plan.layout
    if layout.backend == "inline":
        return f"inline: 1 process, runner.torch_threads={cfg.runner.torch_threads}"
    parts = [f"{a.component}{a.rank}@node{a.node}:{a.cpu_threads}" for a in worker_processes(layout)]
    return "ray: " + ", ".join(parts) + f"; controller runner.torch_threads={cfg.runner.torch_threads}"

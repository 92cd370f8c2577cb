"""The run directory: `runs/<name>-<time>/` with the resolved config, logs, metrics, checkpoints."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from fleetrl.config.loader import save_config
from fleetrl.config.schema import Config

CONFIG_FILE = "config.yaml"
LOG_FILE = "train.log"


def create_run_dir(config: Config) -> Path:
    name = config.runner.name or config.env.id.replace(":", "_").replace("/", "_")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(config.runner.run_dir) / f"{name}-{stamp}"
    suffix = 1
    while run_dir.exists():  # two runs started within the same second
        run_dir = Path(config.runner.run_dir) / f"{name}-{stamp}-{suffix}"
        suffix += 1
    run_dir.mkdir(parents=True)
    return run_dir


def write_config(config: Config, run_dir: Path) -> None:
    save_config(config, run_dir / CONFIG_FILE)


def setup_logging(run_dir: Path) -> None:
    """'fleetrl' logs to stderr and train.log; 'fleetrl.iterations' to train.log only (the live
    progress line already shows those on the terminal)."""
    file_handler = logging.FileHandler(run_dir / LOG_FILE)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("[fleetrl] %(message)s"))
    root = logging.getLogger("fleetrl")
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.INFO)
    root.propagate = False
    root.addHandler(console)
    root.addHandler(file_handler)
    iterations = logging.getLogger("fleetrl.iterations")
    for handler in list(iterations.handlers):
        iterations.removeHandler(handler)
    iterations.propagate = False
    iterations.addHandler(file_handler)

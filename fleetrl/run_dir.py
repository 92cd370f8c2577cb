"""The run directory: `runs/<name>-<time>/` with the resolved config, logs, metrics, checkpoints.

A run's folder is named `<name>-<YYYYmmdd-HHMMSS>[-<n>]` (`create_run_dir`), so the runs of one
config's name are found again by that pattern alone and ordered by their time stamp: that is what
`runner.resume: auto` continues (`resume_dir`), and why a job script that is preempted and started
again with the same config picks up its own run rather than starting over.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path

from fleetrl.checkpoint import checkpoint_dir, list_checkpoints
from fleetrl.config.loader import save_config
from fleetrl.config.redact import redact_text
from fleetrl.config.schema import RESUME_AUTO, Config
from fleetrl.errors import ConfigError

CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"  # what a run did, written as it ends (controller/loop.py `write_summary`)
LOG_FILE = "train.log"
STAMP_FORMAT = "%Y%m%d-%H%M%S"
log = logging.getLogger("fleetrl")


def run_name(config: Config) -> str:
    """`runner.name`, or the env id made safe for a folder name."""
    return config.runner.name or config.env.id.replace(":", "_").replace("/", "_")


def create_run_dir(config: Config) -> Path:
    name = run_name(config)
    stamp = time.strftime(STAMP_FORMAT)
    run_dir = Path(config.runner.run_dir) / f"{name}-{stamp}"
    suffix = 1
    while run_dir.exists():  # two runs started within the same second
        run_dir = Path(config.runner.run_dir) / f"{name}-{stamp}-{suffix}"
        suffix += 1
    run_dir.mkdir(parents=True)
    return owner_only(run_dir)


def owner_only(run_dir: Path) -> Path:
    """`run_dir`, readable by its owner alone (0700, whatever the umask): it holds the run's
    secret while the run is live (watch.json), its checkpoints and its logs."""
    run_dir.chmod(0o700)
    return run_dir


def runs_named(parent: Path, name: str) -> list[Path]:
    """The run directories of `name` under `parent`, oldest first (by time stamp, then suffix)."""
    pattern = re.compile(rf"^{re.escape(name)}-(\d{{8}}-\d{{6}})(?:-(\d+))?$")
    if not parent.is_dir():
        return []
    found = []
    for path in parent.iterdir():
        match = pattern.match(path.name)
        if match and path.is_dir():
            found.append(((match[1], int(match[2] or 0)), path))
    return [path for _, path in sorted(found)]


def resume_dir(config: Config) -> Path | None:
    """The run directory to continue, or None for a new run. `runner.resume` names one (it must
    hold a complete checkpoint), or is 'auto': the newest run of this config's name under
    `runner.run_dir`, None when there is none; a newest run without a complete checkpoint is a
    config error naming it (continuing an older one instead would silently drop the newer)."""
    resume = config.runner.resume
    if resume is None:
        return None
    if resume != RESUME_AUTO:
        if not list_checkpoints(Path(resume)):
            raise ConfigError(
                "runner.resume",
                resume,
                "a run directory that holds a complete checkpoint, or 'auto'",
                f"{checkpoint_dir(Path(resume))} holds no checkpoint",
            )
        return Path(resume)
    parent, name = Path(config.runner.run_dir), run_name(config)
    runs = runs_named(parent, name)
    if not runs:
        return None
    if list_checkpoints(runs[-1]):
        return runs[-1]
    intact = [run for run in runs if list_checkpoints(run)]
    older = f"; the newest that has one is {intact[-1]}" if intact else ""
    raise ConfigError(
        "runner.resume",
        resume,
        f"the newest run of {name!r} in {parent} to hold a complete checkpoint",
        f"{runs[-1]} has none in {checkpoint_dir(runs[-1])} (it stopped before its first checkpoint){older}. "
        f"Name the run to continue (runner.resume=<run dir>), or move {runs[-1]} away to start a new run",
    )


def open_run(config: Config) -> tuple[Path, bool]:
    """Open the run `config` asks for — the one way both `fleetrl train`'s supervisor and a
    `Trainer` used alone do it: the run directory `runner.resume` names or finds (True: the run
    continues there), else a new one with the config saved in it. This process logs into it from
    here on."""
    resumed = resume_dir(config)
    run_dir = owner_only(resumed) if resumed else create_run_dir(config)
    if resumed is None:
        save_config(config, run_dir / CONFIG_FILE)
    setup_logging(run_dir)
    if config.runner.resume is not None and resumed is None:
        log.info("runner.resume=auto: no run of this name in %s yet, starting %s", config.runner.run_dir, run_dir)
    return run_dir, resumed is not None


class Redacting(logging.Formatter):
    """A formatter that takes every secret from the environment out of what it formats, a
    traceback included (config/redact.py)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def setup_logging(run_dir: Path) -> None:
    """'fleetrl' logs to stderr and train.log; 'fleetrl.iterations' to train.log only (progress
    lines the console does not show: a live progress line shows them on a terminal, and off one
    the console shows one every few seconds, progress.py); 'fleetrl.console' to stderr only (a
    progress line already in train.log, shown at last). No secret is logged (`Redacting`)."""
    file_handler = logging.FileHandler(run_dir / LOG_FILE)
    file_handler.setFormatter(Redacting("%(asctime)s %(levelname)s %(message)s"))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(Redacting("[fleetrl] %(message)s"))
    root = logging.getLogger("fleetrl")
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.INFO)
    root.propagate = False
    root.addHandler(console)
    root.addHandler(file_handler)
    for name, handler in (("fleetrl.iterations", file_handler), ("fleetrl.console", console)):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = False
        logger.addHandler(handler)

"""Where a benchmark finds things and puts them: the repository, its results folder, the
`fleetrl` to run and the environment to run it in; how a benchmark speaks on the log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]  # benchmarks/
ROOT = BENCH.parent
RESULTS = BENCH / "results"  # git-ignored
VENVS = BENCH / ".venvs"  # the comparison libraries' venvs (setup_venvs.sh), git-ignored
FLEETRL = [sys.executable, "-m", "fleetrl"]


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def results_dir(name: str) -> Path:
    """A new benchmarks/results/<name>-<time>/ folder (-2, -3, ... for a second run started in
    the same second: two runs side by side once wrote one results.json), announced on the log."""
    stamp = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    path, copy = RESULTS / stamp, 1
    while True:
        try:
            path.mkdir()
            break
        except FileExistsError:
            copy += 1
            path = RESULTS / f"{stamp}-{copy}"
    log(f"results in {path}")
    return path


def fleetrl_executable(override: str | None = None) -> str:
    """The `fleetrl` console script: `override` if given, else the one beside this Python, else
    the repository's .venv's."""
    if override:
        return override
    candidate = Path(sys.executable).parent / "fleetrl"
    return str(candidate if candidate.exists() else ROOT / ".venv" / "bin" / "fleetrl")


def tiny_vla(folder: Path) -> Path:
    """A tiny randomly initialised PaliGemma in `folder` (nothing downloaded), as
    configs/ppo_minigrid_vla.yaml's comment makes it with `fleetrl init-model`; kept if there."""
    if not (folder / "config.json").exists():
        log(f"tiny PaliGemma in {folder}")
        command = [fleetrl_executable(), "init-model", "--family", "paligemma", "--size", "tiny", str(folder)]
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return folder


def subprocess_env(root: Path = ROOT) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.pop("PYTHONWARNINGS", None)
    return env


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))

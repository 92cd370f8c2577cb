"""The libraries fleetrl is compared with, each in its own venv under benchmarks/.venvs/
(setup_venvs.sh): where their Python is, which versions it has, and one job run there."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from kit.places import VENVS, log


def venv_python(name: str) -> Path:
    """The Python of benchmarks/.venvs/<name> (made by setup_venvs.sh)."""
    return VENVS / name / "bin" / "python"


VERSION_PROBES = {  # what each venv reports about itself, as one JSON line
    "fleetrl": "import torch, gymnasium, numpy; from importlib.metadata import version; "
    "print(json.dumps({'torch': torch.__version__, 'gymnasium': gymnasium.__version__, "
    "'numpy': numpy.__version__, 'fleetrl': version('fleetrl')}))",
    "sb3": "import torch, gymnasium, numpy, stable_baselines3; print(json.dumps({'torch': "
    "torch.__version__, 'gymnasium': gymnasium.__version__, 'numpy': numpy.__version__, "
    "'stable_baselines3': stable_baselines3.__version__}))",
    "cleanrl": "import warnings; warnings.filterwarnings('ignore'); import torch, gym, numpy; "
    "from importlib.metadata import version; print(json.dumps({'torch': torch.__version__, "
    "'gym': gym.__version__, 'numpy': numpy.__version__, 'cleanrl': version('cleanrl')}))",
}


def venv_versions(pythons: dict[str, tuple[str | Path, str]]) -> dict:
    """{key: (python, probe name in VERSION_PROBES)} → {key: that Python's versions, or why not}."""
    found = {}
    for key, (python, probe) in pythons.items():
        try:
            code = "import json; " + VERSION_PROBES[probe]
            done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
            found[key] = json.loads(done.stdout.strip().splitlines()[-1])
        except Exception as error:  # noqa: BLE001 - recorded, not fatal
            found[key] = f"unavailable: {error!r}"
    return found


def library_versions(libraries: tuple[str, ...]) -> dict:
    """This Python's and each library venv's versions (`VERSION_PROBES`), as a result records them."""
    pythons = {"fleetrl": (sys.executable, "fleetrl")} | {lib: (venv_python(lib), lib) for lib in libraries}
    return {"python": platform.python_version(), **venv_versions(pythons)}


def library_job(library: str, script: Path, job_args: list[str], out_dir: Path, name: str, timeout: float) -> dict:
    """One job of another library: `script` run by the library's venv with `job_args`,
    `--spawn-time` (this process's time.time() at the start, from which the job times its own
    start-up) and `--out` (the JSON it writes, merged into the result); its output in
    out_dir/<name>.log. An exit other than 0, a timeout or no JSON is an `error` naming the log."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out, log_path = out_dir / f"{name}.json", out_dir / f"{name}.log"
    out.unlink(missing_ok=True)  # from an earlier attempt
    command = [str(venv_python(library)), str(script), *job_args, "--out", str(out)]
    with open(log_path, "w") as output:
        spawn = time.time()
        try:
            code = subprocess.run(
                [*command, "--spawn-time", f"{spawn:.6f}"],
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            ).returncode
        except subprocess.TimeoutExpired:  # run() has killed it
            code = "timeout"
        wall = time.time() - spawn
    result = {"library": library, "command": command, "returncode": code, "log": str(log_path), "total_wall_s": wall}
    if code != 0 or not out.exists():
        result["error"] = f"{library} job exited {code}; see {log_path}"
        log(result["error"])
        return result
    job = json.loads(out.read_text())
    job.pop("library", None)
    return result | job

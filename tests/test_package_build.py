"""fleetrl as a package: `python -m build` makes an sdist and, from it, a wheel; the wheel installs
into a fresh venv and runs from there, outside this source tree.

The venv gets the wheel alone (`--no-deps`); the dependencies it declares are this environment's,
made visible through a `.pth` file, so no torch is downloaded. Only `.pth` files in a venv's own
site-packages run, so this environment's editable install of fleetrl does not take part: the
fleetrl the venv imports is the wheel's (asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile

from tests.support import REPO

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def run(*command, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}  # no source tree leaks in
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def test_sdist_and_wheel_build_install_and_train_in_a_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    # --no-isolation: build with this environment's setuptools instead of downloading one
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, REPO, cwd=tmp_path)
    (sdist,) = dist.glob(f"fleetrl-{VERSION}.tar.gz")
    (wheel,) = dist.glob(f"fleetrl-{VERSION}-py3-none-any.whl")
    with tarfile.open(sdist) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
    assert {"pyproject.toml", "README.md", "fleetrl/cli.py", "fleetrl/tracking/trackers.py"} <= names
    assert {f"configs/{path.name}" for path in (REPO / "configs").glob("*.yaml")} <= names
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(f"fleetrl-{VERSION}.dist-info/entry_points.txt").decode()
    modules = {str(path.relative_to(REPO)) for path in (REPO / "fleetrl").rglob("*.py")}
    assert modules <= names
    assert "fleetrl = fleetrl.cli:main" in entry_points

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", wheel, cwd=tmp_path)
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (tmp_path / "venv" / site / "dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")

    where = run(python, "-c", "import fleetrl; print(fleetrl.__file__)", cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)), where
    fleetrl = venv / "bin" / "fleetrl"
    assert run(fleetrl, "--version", cwd=tmp_path).stdout.strip() == f"fleetrl {VERSION}"
    result = run(
        fleetrl,
        "train",
        REPO / "configs" / "ppo_cartpole.yaml",
        "runner.total_env_steps=2048",
        f"runner.run_dir={tmp_path / 'runs'}",
        "runner.loggers=[jsonl]",
        "--skip-doctor",
        cwd=tmp_path,
    )
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"run directory: {run_dir}" in result.stdout
    assert (run_dir / "summary.json").is_file()

"""Every `fleetrl` command the README and the docs show runs as written (tests/doc_commands.py
finds them): from a fresh working directory holding only what a checkout has at its root
(`configs/`, the `.venv`), with the default run directory (`runs/`), a relative config path and
the documented environment assignments, shortened only by `runner.total_env_steps` appended at
the end (to train, sft and sweep: `SHORT`), or run as a dry run where a test of its own trains the
config (`TRAINED_BY_A_TEST`). The commands run in the order the pages show them,
in one working directory, so a `runner.resume=auto` continues the run an earlier command made; a
command naming a run directory of its own (`runs/CartPole-v1-20261122-101500`) gets a copy of the
newest run of that name there.
Each must exit 0 and leave what it promises: a run directory with its summary, a resumed run
rather than a new one, a sweep of every combination finished, an evaluation's mean ± std.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from pathlib import Path

from fleetrl.cli import installed_version
from fleetrl.run_dir import runs_named
from fleetrl.sweep.driver import SWEEP_FILE
from fleetrl.sweep.grid import parse_grid
from tests.doc_commands import DocCommand, doc_commands
from tests.support import REPO, Finished, Fleetrl, read_json

# Appended to what trains: two CartPole iterations, one Atari iteration; one iteration of the
# supervised stage (4 envs x 16 steps and its 50 cloning updates: 512 steps were 8 iterations,
# 165 s of the suite's time, where one iteration runs everything the command promises)
SHORT = {
    "train": "runner.total_env_steps=512",
    "sweep": "runner.total_env_steps=512",
    "sft": "runner.total_env_steps=64",
}
# Configs that a test of their own trains through the CLI: their documented command runs as a dry
# run here (the config and its overrides load and the placement resolves, nothing starts), not as a
# second training of ~20 s (Atari's first iteration) and ~55 s (the VLA's model and first iteration)
TRAINED_BY_A_TEST = {
    "configs/ppo_atari.yaml": "tests/test_atari.py",
    "configs/ppo_manipulation_vla.yaml": "tests/test_manipulation_vla.py",
    "configs/ppo_manipulation_vla_flow.yaml": "tests/test_vla_heads_pipeline.py",
}
NAMED_RUN = re.compile(r"\bruns/([^\s/]+)-(\d{8}-\d{6})\b")
TIMEOUT_S = 600  # the 10-trial sweep on a loaded 2-core host


def test_the_extractor_finds_the_documented_sweep_and_no_placeholder():
    """The README's sweep example (the one that once ended in a traceback) is among the commands
    run below, and nothing with a placeholder or a comment is."""
    lines = [command.line for command in doc_commands(REPO)]
    assert any(line.startswith("fleetrl sweep configs/ppo_cartpole.yaml runner.seed=1,2") for line in lines), lines
    assert not any("<" in line or "#" in line or " ..." in line for line in lines), lines


def test_each_config_run_dry_here_is_trained_by_the_test_named_for_it():
    """A documented command runs as a dry run only while the test `TRAINED_BY_A_TEST` names still
    trains its config through the CLI: deleting that test would otherwise leave it untrained."""
    for config, test in TRAINED_BY_A_TEST.items():
        source = (REPO / test).read_text()
        assert Path(config).name in source and "train(" in source, (config, test)


def test_every_documented_command_runs_as_written(tmp_path, subtests):
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / ".venv").symlink_to(sys.prefix)
    path = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in doc_commands(REPO):
        with subtests.test(msg=f"{command.where}: {command.line}"):
            provide_named_runs(command, tmp_path / "runs")
            before = existing_runs(tmp_path / "runs")
            run = as_run(command)
            with Fleetrl(run.line, cwd=tmp_path, env=path, shell=True) as running:
                finished = running.finish(TIMEOUT_S)
            assert finished.code == 0, f"{run.line}\n{finished.stderr[-4000:]}"
            assert "Traceback" not in finished.stderr, finished.stderr[-4000:]
            check_promise(run, finished, tmp_path / "runs", before)


def as_run(command: DocCommand) -> DocCommand:
    """The command as this test runs it: shortened (`SHORT`), or a dry run (`TRAINED_BY_A_TEST`)."""
    words = command.words
    if words[1] == "train" and words[2] in TRAINED_BY_A_TEST and "--dry-run" not in words:
        return DocCommand(f"{command.line} --dry-run", command.where)
    if words[1] in SHORT:
        return DocCommand(f"{command.line} {SHORT[words[1]]}", command.where)
    return command


def provide_named_runs(command: DocCommand, runs: Path) -> None:
    for match in NAMED_RUN.finditer(command.line):
        target = runs / f"{match[1]}-{match[2]}"
        if not target.exists():
            newest = runs_named(runs, match[1])
            assert newest, f"{command.where} names {target.name}, and no earlier command made a {match[1]} run"
            shutil.copytree(newest[-1], target)


def existing_runs(runs: Path) -> set[Path]:
    return set(runs.iterdir()) if runs.is_dir() else set()


def check_promise(command: DocCommand, finished: Finished, runs: Path, before: set[Path]) -> None:
    words = command.words
    made = existing_runs(runs) - before
    if words[1] == "--version":
        assert finished.stdout.strip() == f"fleetrl {installed_version()}"
    elif words[1] == "train" and "--dry-run" in words:
        assert not made, f"a dry run made run directories: {made}"
    elif words[1] == "train" and any(word.startswith("runner.resume=") for word in words):
        assert not made, f"a resume made new run directories: {made}"
        assert "resumed runs/" in finished.stderr, finished.stderr[-2000:]
    elif words[1] in ("train", "sft"):
        assert len(made) == 1, made
        (run_dir,) = made
        assert read_json(run_dir / "summary.json") is not None and (run_dir / "config.yaml").is_file()
    elif words[1] == "sweep":
        assert len(made) == 1, made
        (sweep_dir,) = made
        trials = read_json(sweep_dir / SWEEP_FILE)["trials"]
        _, grid = parse_grid([word for word in words[3:] if not word.startswith("--") and "=" in word])
        assert len(trials) == math.prod(len(values) for values in grid.values())
        assert [trial["status"] for trial in trials] == ["finished"] * len(trials), trials
    elif words[1] == "eval":
        assert "±" in finished.stdout + finished.stderr, finished.stdout[-2000:]

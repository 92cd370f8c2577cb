"""Before and after: another commit's `fleetrl` extracted beside this tree, and a measurement run
in child processes alternating between the two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kit.places import BENCH, ROOT


def base_tree(ref: str, into: Path, paths: tuple[str, ...] = ("fleetrl",)) -> Path:
    """`ref`'s `fleetrl` package (and `paths`) extracted under `into` (for PYTHONPATH=into): the 'before'."""
    archive = subprocess.run(["git", "archive", ref, *paths], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def before_after(base: str, rounds: int, script: Path, call: str, drop_env: tuple = ()) -> dict[str, list[dict]]:
    """`{"before": [...], "after": [...]}`: `call` (a function call in the benchmark `script`,
    returning JSON-able data) run `rounds` times in child processes, alternating between `base`'s
    fleetrl and this tree's, without the variables `drop_env`."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        trees = {"before": base_tree(base, Path(folder)), "after": ROOT}
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(rounds):
            for name, tree in trees.items():
                env = {k: v for k, v in os.environ.items() if k not in drop_env}
                folders = [str(BENCH), str(Path(script).resolve().parent)]
                code = f"import json, sys; sys.path[:0] = {folders!r}; import {Path(script).stem} as m; print(json.dumps(m.{call}))"
                done = subprocess.run(
                    [sys.executable, "-c", code],
                    cwd=tree,
                    env={**env, "PYTHONPATH": str(tree)},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs

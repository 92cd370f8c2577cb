"""A slice of the fault matrix that moves with every commit: CI runs two cells of
`fault_cells.rotation` — the cells at positions 2n and 2n+1, n the number of commits HEAD has — so
any four consecutive commits run every fault kind and every backend, and the walk reaches every
feasible worker cell (the controller's cells need a signal from outside the run: the benchmark's
runner and tests/test_supervisor.py send them). Each cell is a real `fleetrl train` whose report
must name the cell's cause and culprit within the cell's bound and a loaded host's margin.

A failed cell is named in the test's id; run it again at any commit with
`FLEETRL_MATRIX_CELLS=hang/env/steady/ray pytest tests/test_matrix_slice.py` (comma-separated
names; the whole matrix: benchmarks/diagnosis/fault_matrix.py).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from fleetrl.config.schema import WatchdogConfig
from tests.fault_cells import BACKENDS, KINDS, MARGIN_S, Cell, all_cells, assert_named, make_cell, rotation
from tests.support import REPO, train

CELLS_PER_COMMIT = 2
# The start-up step allowance and the first-call bound shortened (defaults 60 s and 15 s) to keep
# a cell's run short: the rules are the same, and the cell's bound follows the allowance.
SHORT = WatchdogConfig(startup_step_allowance_s=20.0, first_call_bound_s=5.0)
SHORTENED = (
    f"watchdog.startup_step_allowance_s={SHORT.startup_step_allowance_s}",
    f"watchdog.first_call_bound_s={SHORT.first_call_bound_s}",
)


def worker_cells() -> list[Cell]:
    """Every feasible cell but the controller's, with the shortened thresholds."""
    cells = [make_cell(c.kind, c.where, c.when, c.backend, SHORT) for c in all_cells()]
    return [c.with_overrides(*SHORTENED) for c in cells if not c.infeasible and c.where != "controller"]


def commit_number() -> int:
    done = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    return int(done.stdout)


def this_commit_s_slice() -> list[Cell]:
    cells = worker_cells()
    named = os.environ.get("FLEETRL_MATRIX_CELLS")
    if named:
        wanted = named.split(",")
        by_name = {c.name: c for c in cells}
        unknown = [name for name in wanted if name not in by_name]
        assert not unknown, f"FLEETRL_MATRIX_CELLS names no feasible worker cell: {unknown}"
        return [by_name[name] for name in wanted]
    walk = rotation(cells)
    start = commit_number() * CELLS_PER_COMMIT
    return [walk[(start + j) % len(walk)] for j in range(CELLS_PER_COMMIT)]


def test_the_rotation_runs_every_kind_and_backend_in_four_commits_and_reaches_every_cell():
    cells = worker_cells()
    walk = rotation(cells)
    assert {c.name for c in walk} == {c.name for c in cells}
    window = 4 * CELLS_PER_COMMIT
    for start in range(len(walk)):
        seen = [walk[(start + j) % len(walk)] for j in range(window)]
        assert {c.kind for c in seen} == set(KINDS), [c.name for c in seen]
        assert {c.backend for c in seen} == set(BACKENDS), [c.name for c in seen]


@pytest.mark.parametrize("cell", this_commit_s_slice(), ids=lambda cell: cell.name)
def test_this_commit_s_cells_of_the_matrix_are_named_right(tmp_path, cell):
    result = train(cell.config, *cell.overrides, runs=tmp_path, timeout=300)
    assert_named(result, cell, cell.bound_s + MARGIN_S)

"""A slice of the fault matrix that moves with the tree: CI runs the cells of one window of
`fault_cells.rotation` (CELLS_PER_COMMIT consecutive cells), the window chosen by the hash of the
tree being tested — what a shallow clone still has (a commit count does not move there: a depth-1
clone has one commit, whatever the history). Any change to the tree moves the slice, each window
equally likely; every feasible worker cell is in one window, so the whole matrix is covered after
`expected_commits_to_cover()` changed trees on average (the coupon collector's W·H(W) for W
windows), and with 99 % probability within `commits_to_cover(0.99)` — the figures
docs/reference/promises.md states, checked below. The controller's cells need a signal from outside
the run: the benchmark's runner and tests/test_supervisor.py send them.

Each cell is a real `fleetrl train` whose report must name the cell's cause and culprit (the data
of tests/fault_cells.csv) within the cell's bound, and leave nothing behind within the teardown
promise. A failed cell is named in the test's id; run it again at any tree with
`FLEETRL_MATRIX_CELLS=hang/env/steady/ray pytest tests/test_matrix_slice.py` (comma-separated
names; the whole matrix: benchmarks/diagnosis/fault_matrix.py).
"""

from __future__ import annotations

import math
import os
import subprocess

import pytest

from tests.fault_cells import EXPECTED, Cell, all_cells, assert_named, expectations, hf_cells, make_cell, rotation
from tests.support import REPO, train

CELLS_PER_COMMIT = 2
# The start-up step allowance and the first-call bound shortened (defaults 60 s and 15 s) to keep
# a cell's run short: the rules are the same, and the cell's promise follows them.
SHORT = {"startup_step_allowance_s": 20.0, "first_call_bound_s": 5.0}
# What docs/reference/promises.md says of the slice (checked against the walk below)
PROMISED_WINDOWS, PROMISED_MEAN_COMMITS, PROMISED_99_COMMITS = 141, 780, 1342


def worker_cells() -> list[Cell]:
    """Every feasible cell but the controller's, with the shortened thresholds."""
    cells = [make_cell(c.kind, c.where, c.when, c.backend, **SHORT) for c in all_cells() if not c.infeasible]
    return [c for c in cells if c.where != "controller"]


def windows() -> list[list[Cell]]:
    walk = rotation(worker_cells())
    return [walk[i : i + CELLS_PER_COMMIT] for i in range(0, len(walk), CELLS_PER_COMMIT)]


def tree_hash() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD^{tree}"], cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def this_tree_s_slice() -> list[Cell]:
    named = os.environ.get("FLEETRL_MATRIX_CELLS")
    if named:
        by_name = {c.name: c for c in worker_cells()}
        unknown = [name for name in named.split(",") if name not in by_name]
        assert not unknown, f"FLEETRL_MATRIX_CELLS names no feasible worker cell: {unknown}"
        return [by_name[name] for name in named.split(",")]
    slices = windows()
    return slices[int(tree_hash(), 16) % len(slices)]


def expected_commits_to_cover(w: int) -> float:
    return w * sum(1 / k for k in range(1, w + 1))


def commits_to_cover(w: int, probability: float) -> int:
    """The fewest commits after which every one of `w` equally likely windows has been drawn with
    at least `probability` (inclusion-exclusion over the windows never drawn)."""
    n = w
    while True:
        missed = sum((-1) ** (k + 1) * math.comb(w, k) * (1 - k / w) ** n for k in range(1, w + 1))
        if 1 - missed >= probability:
            return n
        n += 1


def test_every_feasible_cell_has_exactly_one_row_of_expectations():
    """tests/fault_cells.csv holds what fleetrl must report, by hand: a row for every feasible cell
    of both tables (the CartPole MLP's and the Hugging Face VLA's) and no row for anything else."""
    feasible = {c.name for c in all_cells() + hf_cells("folder") if not c.infeasible}
    rows = set(expectations())
    assert not feasible - rows, f"feasible cells without a row in {EXPECTED.name}: {sorted(feasible - rows)}"
    assert not rows - feasible, f"rows of {EXPECTED.name} for no feasible cell: {sorted(rows - feasible)}"


def test_the_windows_cover_every_worker_cell_in_the_promised_number_of_commits():
    slices = windows()
    walked = [c.name for window in slices for c in window]
    assert sorted(walked) == sorted(c.name for c in worker_cells())  # every cell in exactly one window
    assert len(slices) == PROMISED_WINDOWS, len(slices)
    assert round(expected_commits_to_cover(len(slices))) == PROMISED_MEAN_COMMITS
    assert commits_to_cover(len(slices), 0.99) == PROMISED_99_COMMITS


@pytest.mark.parametrize("cell", this_tree_s_slice(), ids=lambda cell: cell.name)
def test_this_tree_s_cells_of_the_matrix_are_named_right(tmp_path, cell):
    result = train(cell.config, *cell.overrides, runs=tmp_path, timeout=300)
    assert_named(result, cell)

"""The planted regressions (tests/planted.py) keep up with the code between runs of
benchmarks/diagnosis/planted_regressions.py: each plant still applies to this tree (its text is in
its file exactly once), changes fleetrl's own code (never a test), and names CI tests (collected,
not marked slow). Whether the plants turn those tests red is the script's to show (minutes of
real runs: docs/benchmarks/planted-regressions.md), not this test's."""

from __future__ import annotations

import shutil

import pytest

from tests.planted import PLANTS, Plant, PlantMoved
from tests.support import REPO
from tests.test_promises import collected


@pytest.mark.parametrize("plant", PLANTS, ids=[plant.name for plant in PLANTS])
def test_the_plant_applies_to_this_tree_and_changes_only_its_product_file(tmp_path, plant):
    assert plant.file.startswith("fleetrl/") and plant.file.endswith(".py"), plant.file
    (tmp_path / plant.file).parent.mkdir(parents=True)
    shutil.copy(REPO / plant.file, tmp_path / plant.file)
    plant.apply(tmp_path)
    before, after = (REPO / plant.file).read_text(), (tmp_path / plant.file).read_text()
    assert after == before.replace(plant.old, plant.new) != before


def test_a_plant_whose_text_has_moved_fails_naming_it(tmp_path):
    moved = Plant("moved", "none", "fleetrl/checkpoint.py", "text fleetrl never holds\n", "", ())
    (tmp_path / "fleetrl").mkdir()
    shutil.copy(REPO / moved.file, tmp_path / moved.file)
    with pytest.raises(PlantMoved, match="plant moved: fleetrl/checkpoint.py holds its text 0 times, not once"):
        moved.apply(tmp_path)


def test_every_plant_runs_ci_tests():
    ids = [test for plant in PLANTS for test in plant.tests]
    suite = collected({test.split("::")[0] for test in ids})
    assert [test for test in ids if test not in suite] == [], "not tests of the suite"
    assert [test for test in ids if suite[test]] == [], "marked slow: not CI's"

"""The committed mutation run (docs/benchmarks/mutation.json, written by
benchmarks/diagnosis/mutation.sh) is of the modules that decide what an incident is and how a run
ends — each concern issue 45 names, in pyproject.toml's [tool.mutmut] and in the record — its
counts add up, every mutant it did not see killed is named and is a mutant of a function the module
defines, and docs/benchmarks/mutation.md shows the scores the record holds (computed here, not read
from the script that wrote it), naming every module below the 90 % target. The run takes hours and
is not CI's: when a mutated module or the tests it ran against have changed since, this warns,
naming what to run it again for."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import tomllib
import warnings

import pytest

from tests.support import REPO

RESULTS = json.loads((REPO / "docs" / "benchmarks" / "mutation.json").read_text())
PAGE = (REPO / "docs" / "benchmarks" / "mutation.md").read_text()
MUTMUT = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
TARGET = 0.90  # of each module's mutants, killed or timed out (issue 45)
# What the mutation run must cover, in the words of issue 45, and where that code is.
CONCERNS = {
    "judgement": "fleetrl/watch/judging/judgement.py",
    "alignment": "fleetrl/watch/judging/alignment.py",
    "classification": "fleetrl/watch/judging/classify.py",
    "the checks": "fleetrl/watch/judging/verdict.py",
    "the watchdog loop": "fleetrl/watch/watchdog.py",
    "the supervisor's response": "fleetrl/watch/respond.py",
    "checkpoint integrity": "fleetrl/checkpoint.py",
}
COUNTS = ("killed", "timeout", "survived", "no_tests", "suspicious", "segfault", "not_run")
NAMED = ("timeout", "survived", "no_tests", "suspicious", "segfault", "not_run")


def changed_since_the_run() -> list[str]:
    modules = [m for m in RESULTS["modules"] if (REPO / m).is_file()]
    changed = [
        m for m in modules if hashlib.sha256((REPO / m).read_bytes()).hexdigest() != RESULTS["modules"][m]["sha256"]
    ]
    if changed or RESULTS["tests"] != MUTMUT["pytest_add_cli_args_test_selection"]:
        warnings.warn(
            f"changed since the mutation run at {RESULTS['commit'][:10]} ({RESULTS['date']}): "
            f"{', '.join(changed) or 'the tests selected'}; run benchmarks/diagnosis/mutation.sh again",
            stacklevel=2,
        )
    return changed


def test_the_run_is_of_every_concern_the_issue_names_and_of_what_pyproject_mutates():
    for concern, module in CONCERNS.items():
        assert (REPO / module).is_file(), f"{concern}: {module} is not there (moved? update CONCERNS and pyproject)"
        assert module in MUTMUT["only_mutate"], f"{concern}: {module} is not mutated"
    assert sorted(RESULTS["modules"]) == sorted(MUTMUT["only_mutate"])
    assert all(RESULTS["modules"][m]["mutants"] > 0 for m in MUTMUT["only_mutate"])
    for selected in RESULTS["tests"]:
        assert (REPO / selected.split("::")[0]).is_file(), f"the run's tests: {selected} is not there"


def function_names(module: str) -> set[str]:
    """What mutmut names a module's mutants after: `x_f` for a function, `xǁCǁm` for a method."""
    names = set()
    for node in ast.parse((REPO / module).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(f"x_{node.name}")
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"xǁ{node.name}ǁ{f.name}" for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    return names


@pytest.mark.parametrize("module", sorted(RESULTS["modules"]))
def test_the_counts_add_up_and_each_mutant_not_killed_is_named(module):
    result = RESULTS["modules"][module]
    assert sum(result[count] for count in COUNTS) == result["mutants"]
    assert result["killed"] > 0
    named = [name for kind in NAMED for name in result["names"][kind]]
    assert len(named) == len(set(named)), "a mutant named under two verdicts"
    for kind in NAMED:
        assert len(result["names"][kind]) == result[kind], kind
    prefix = module.removesuffix(".py").replace("/", ".") + "."
    assert [name for name in named if not name.startswith(prefix)] == []
    if module in changed_since_the_run():
        return  # the names are of the module as it was run
    defined = function_names(module)
    strangers = sorted({re.sub(r"__mutmut_\d+$", "", name.removeprefix(prefix)) for name in named} - defined)
    assert strangers == [], f"mutants of functions {module} does not define"


def page_rows() -> dict[str, list[str]]:
    """The cells of the results table on docs/benchmarks/mutation.md, by its first cell."""
    rows = re.findall(r"^\| (`[\w/.]+\.py`|all) \|(.+)\|$", PAGE, flags=re.MULTILINE)
    return {first.strip("`"): [cell.strip().strip("*") for cell in rest.split("|")] for first, rest in rows}


def test_the_page_shows_the_recorded_scores_and_names_each_module_below_the_target():
    rows = page_rows()
    assert sorted(rows) == sorted([*RESULTS["modules"], "all"])
    totals = dict.fromkeys(("mutants", "run", "killed", "timeout", "survived", "no_tests"), 0)
    below = []
    for module, r in RESULTS["modules"].items():
        line = {
            "mutants": r["mutants"],
            "run": r["mutants"] - r["not_run"],
            "killed": r["killed"],
            "timeout": r["timeout"],
            "survived": r["survived"] + r["suspicious"] + r["segfault"],
            "no_tests": r["no_tests"],
        }
        totals = {key: totals[key] + line[key] for key in totals}
        assert r["score"] == pytest.approx((r["killed"] + r["timeout"]) / line["run"], abs=5e-5)
        assert rows[module] == [*map(str, line.values()), f"{100 * r['score']:.1f} %"], module
        if r["score"] < TARGET:
            below.append(module)
    overall = (totals["killed"] + totals["timeout"]) / totals["run"]
    assert rows["all"] == [*map(str, totals.values()), f"{100 * overall:.1f} %"]
    section = PAGE.split("\n## Below the target\n", 1)[1].split("\n## ", 1)[0]
    assert sorted(set(re.findall(r"`(fleetrl/[\w/]+\.py)`", section))) == sorted(below)

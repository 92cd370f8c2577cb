"""docs/reference/promises.md tells the truth about the tests: every test it names exists, every
test of a row it says is CI runs in CI (at least one case of it is not marked `slow`), every test
it lists as slow is, and every `slow` test of the suite is listed there with a reason. The tests
are pytest's own collection (tests/collected.py), not a reading of the source.

How the page names tests, in backticks: `tests/<module>::test_y[case]` (a case), `::test_z`
(another test of the file named last), `[other]` (another case of the test named last),
`tests/<module>` (a whole module: some test of it), and `tests/<support module>` `name` (a helper of a
support module: it must exist)."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass

from tests.collected import PREFIX
from tests.support import REPO, subprocess_env

PAGE = REPO / "docs" / "reference" / "promises.md"
SLOW_SECTION = "## Held only by slow tests"
TEST_MODULE = re.compile(r"^(tests/test_\w+\.py)(?:::(\w+))?(\[.+\])?$")
HELPER_MODULE = re.compile(r"^tests/(\w+)\.py$")


@dataclass(frozen=True)
class Named:
    """A test the page names: a module, a test of it, or one case; and the tier it claims."""

    module: str
    test: str | None
    case: str | None
    tier: str  # "CI" or "slow"
    line: int

    def matches(self, nodeid: str) -> bool:
        if self.test is None:
            return nodeid.startswith(f"{self.module}::")
        base = f"{self.module}::{self.test}"
        return nodeid == base + (self.case or "") or (self.case is None and nodeid.startswith(base + "["))

    def __str__(self) -> str:
        return f"{self.module}" + (f"::{self.test}" if self.test else "") + (self.case or "") + f" (line {self.line})"


def named_in(text: str, tier: str, line: int) -> tuple[list[Named], list[tuple[str, str, int]]]:
    """The tests a cell or list item names, and the helpers (module, name, line) it names."""
    tests, helpers = [], []
    module = test = helper_module = None
    for span in re.findall(r"`([^`]+)`", text):
        if found := TEST_MODULE.match(span):
            module, test, case = found.groups()
            helper_module = None
        elif span.startswith("::") and module and (found := re.match(r"^::(\w+)(\[.+\])?$", span)):
            test, case = found.groups()
        elif re.match(r"^\[.+\]$", span) and test:
            case = span
        elif found := HELPER_MODULE.match(span):
            helper_module = f"tests.{found[1]}"
            continue
        else:
            if helper_module and re.match(r"^\w+$", span):
                helpers.append((helper_module, span, line))
            continue
        tests.append(Named(module, test, case, tier, line))
    return tests, helpers


def page_names() -> tuple[list[Named], list[tuple[str, str, int]], list[tuple[str, int]]]:
    """Every test the page names with its tier, the helpers it names, and the slow section's items
    without a reason."""
    tests, helpers, unexplained = [], [], []
    in_slow, tier_column = False, None
    for number, line in enumerate(PAGE.read_text().splitlines(), 1):
        if line.startswith("## "):
            in_slow, tier_column = line.strip() == SLOW_SECTION, None
        if line.startswith("|") and not set(line) <= set("|- "):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if tier_column is None and "tier" in cells:
                tier_column = cells.index("tier")
                continue
            if cells[0] in ("promise", "component", "kind"):  # a header without a tier: CI throughout
                continue
            tier = cells[tier_column] if tier_column is not None else "CI"
            assert tier in ("CI", "slow"), f"line {number}: tier {tier!r} is neither CI nor slow"
            text = " | ".join(c for i, c in enumerate(cells) if i != tier_column)
            found, used = named_in(text, tier, number)
            tests += found
            helpers += used
        elif in_slow and line.startswith("- "):  # "- `test`, `[case]`: why it is slow"
            named, _, reason = line.partition("`: ")
            found, used = named_in(named + "`", "slow", number)
            tests += found
            helpers += used
            if not reason.strip():
                unexplained.append((line, number))
    return tests, helpers, unexplained


def collected(modules: set[str]) -> dict[str, bool]:
    """pytest's collection of `modules`, slow tests included: node id → marked slow."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
        + ["-p", "tests.collected", "-m", "slow or not slow", *sorted(modules)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SKIPPED" not in done.stdout, "a module skipped itself at collection: " + done.stdout[-3000:]
    return dict(json.loads(line[len(PREFIX) :]) for line in done.stdout.splitlines() if line.startswith(PREFIX))


def test_the_promises_page_names_tests_that_exist_in_the_tier_it_says_and_every_slow_test():
    tests, helpers, unexplained = page_names()
    with_slow = {
        str(path.relative_to(REPO)) for path in (REPO / "tests").glob("test_*.py") if "mark.slow" in path.read_text()
    }
    suite = collected({named.module for named in tests} | with_slow)
    wrong = []
    for named in tests:
        cases = [nodeid for nodeid in suite if named.matches(nodeid)]
        if not cases:
            wrong.append(f"{named}: no such test")
        elif named.tier == "CI" and all(suite[nodeid] for nodeid in cases):
            wrong.append(f"{named}: the page says CI, but it is marked slow")
        elif named.tier == "slow" and not all(suite[nodeid] for nodeid in cases):
            wrong.append(f"{named}: listed as slow, but it runs in CI")
    listed_slow = [named for named in tests if named.tier == "slow"]
    for nodeid, slow in suite.items():
        if slow and not any(named.matches(nodeid) for named in listed_slow):
            wrong.append(f"{nodeid}: marked slow, not listed in '{SLOW_SECTION}'")
    for module, name, number in helpers:
        if not hasattr(importlib.import_module(module), name):
            wrong.append(f"{module}.{name} (line {number}): no such helper")
    wrong += [f"line {number}: a slow test without its reason: {line}" for line, number in unexplained]
    assert not wrong, "docs/reference/promises.md:\n" + "\n".join(wrong)

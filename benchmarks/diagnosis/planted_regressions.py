"""Planted regressions of the three headline promises, each of which must turn CI red (issue 45):
a stop (Ctrl-C, SIGTERM) that does not save the iteration under way, a restart that starts from
scratch instead of the newest intact checkpoint, and an incident's teardown that takes 30 s.

For the unchanged tree and then for each plant, in a scratch copy of this commit's tracked files
(`git archive HEAD`, removed afterwards whatever happens): the plant (tests/planted.py: one exact
text substitution in one product file, not a test) applied — it fails loudly when the text is no
longer there exactly once, and tests/test_planted.py checks in CI that it is — and then the CI
tests that hold its promise, run as CI runs them (pyproject's addopts: `-m 'not slow'`, three
xdist workers) with this interpreter and PYTHONPATH at the copy:

    python -m pytest -q -p no:cacheprovider --junitxml=... <test ids>

Recorded per run: the exit code, the wall time, each test's outcome and time, and for each test
that failed its first error line (pytest's first `E` line) and where it was raised. The unchanged
tree runs every plant's tests and must pass them all (a skip is not a pass); each plant must fail
at least one of its tests, with pytest's exit code 1 (tests failed, not a usage or collection
error). Otherwise this script exits 1. Every process a run leaves (sampled while it ran) is
counted, then killed.

    .venv/bin/python benchmarks/diagnosis/planted_regressions.py [--plants NAME ...] [--timeout 1800]

Writes benchmarks/results/planted_regressions-<time>/results.json and table.md (and prints the
table); docs/benchmarks/planted-regressions.md shows the committed run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
import kit  # noqa: E402

from tests.planted import PLANTS  # noqa: E402
from tests.support import TEARDOWN_BOUND_S, Descendants, describe, end  # noqa: E402

UNCHANGED = "unchanged"
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
MESSAGE_CHARS = 400  # of a failure's first error line, in the record (the table shows fewer)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=kit.ROOT, capture_output=True, text=True, check=True).stdout.strip()


def outcomes(junit: Path) -> dict[str, dict]:
    """Each test of the run's JUnit XML by its id: passed, failed, error or skipped, its seconds,
    and for a failure or error its first error line and where it was raised."""
    tests = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        # a module's test function (the ids this script runs): its classname is the module's name
        test_id = f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}"
        outcome, first_line, raised_at = "passed", None, None
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "failed" if tag == "failure" else tag
                text = found.text or found.get("message") or ""
                first_line = first_error_line(text) if tag != "skipped" else found.get("message")
                raised_at = where_raised(text) if tag != "skipped" else None
                break
        tests[test_id] = {
            "outcome": outcome,
            "seconds": round(float(case.get("time") or 0), 1),
            "message": first_line[:MESSAGE_CHARS] if first_line else None,
            "raised_at": raised_at,
        }
    return tests


def first_error_line(traceback: str) -> str:
    """pytest's first `E` line: the assertion's message, or the exception."""
    for line in traceback.splitlines():
        if line.startswith("E "):
            return line[1:].strip()
    return traceback.strip().splitlines()[0] if traceback.strip() else ""


def where_raised(traceback: str) -> str | None:
    """The last `path.py:line: Error` line of a traceback: where the failing assertion or error is
    (a helper's line where a helper of the tests asserts)."""
    found = re.findall(r"^(\S+\.py:\d+): \w+", traceback, flags=re.MULTILINE)
    return found[-1] if found else None


def run_tests(tree: Path, tests: tuple[str, ...], scratch: Path, timeout_s: float) -> dict:
    """`tests` run by pytest in `tree`; every process it leaves is killed (and counted)."""
    junit = scratch / "junit.xml"
    junit.unlink(missing_ok=True)
    command = [*PYTEST, f"--junitxml={junit}", f"--basetemp={scratch / 'basetemp'}", *tests]
    env = {**kit.subprocess_env(tree), "PYTHONPATH": str(tree)}  # this tree's fleetrl, not the installed one
    started = time.time()
    with open(scratch / "pytest.txt", "w") as output:
        pytest = subprocess.Popen(command, cwd=tree, env=env, stdout=output, stderr=subprocess.STDOUT)
        descendants = Descendants(pytest.pid)
        try:
            code = pytest.wait(timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            pytest.kill()
            code, timed_out = pytest.wait(), True
        finally:
            wall_s = time.time() - started
            descendants.stop()
            if pytest.poll() is None:  # this script was interrupted
                pytest.kill()
                pytest.wait()
            gone = descendants.gone_at(0 if timed_out else TEARDOWN_BOUND_S)
            left = [] if gone is not None else descendants.running()
            left_names = [describe(p) for p in left]
            end(left)
    tail = (scratch / "pytest.txt").read_text(errors="replace")[-4000:]
    return {
        "command": " ".join(["python", *command[1:]]).replace(str(scratch), "<scratch>"),
        "code": code,
        "timed_out": timed_out,
        "wall_s": round(wall_s, 1),
        "tests": outcomes(junit) if junit.exists() else {},
        "processes_left": left_names,
        "output_tail": tail,
    }


def verdict(name: str, run: dict, tests: tuple[str, ...]) -> tuple[str, bool]:
    """(red or green, as expected): the unchanged tree passes every test; a plant fails at least
    one of its own with exit code 1, tests failed."""
    seen = [run["tests"].get(test, {}).get("outcome") for test in tests]
    if name == UNCHANGED:
        green = run["code"] == 0 and all(outcome == "passed" for outcome in seen)
        return ("green" if green else "red"), green
    red = run["code"] == 1 and any(outcome in ("failed", "error") for outcome in seen)
    return ("red" if red else "green" if run["code"] == 0 else f"exit {run['code']}"), red


def one_line(text: str | None, chars: int = 160) -> str:
    if not text:
        return ""
    shown = text if len(text) <= chars else text[: chars - 1] + "…"
    return shown.replace("|", "\\|").replace("`", "'")


def table(results: dict) -> str:
    lines = [
        "| tree | tests run | result | wall s | failing tests | first error line (where) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, run in results["runs"].items():
        failing = {test: t for test, t in run["tests"].items() if t["outcome"] in ("failed", "error")}
        names = "<br>".join(f"`{test.split('::', 1)[1]}`" for test in failing) or "none"
        messages = "<br>".join(f"{one_line(t['message'])} (`{t['raised_at']}`)" for t in failing.values())
        shown = f"**{run['verdict']}**" if run["as_expected"] else f"**{run['verdict']} (not as expected)**"
        lines.append(f"| {name} | {len(run['tests'])} | {shown} | {run['wall_s']:.0f} | {names} | {messages} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [plant.name for plant in PLANTS]
    parser.add_argument("--plants", nargs="+", choices=names, default=names, help="the plants to run (default all)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a pytest run may take; then killed")
    args = parser.parse_args()
    plants = [plant for plant in PLANTS if plant.name in args.plants]
    out = kit.results_dir("planted_regressions")
    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no")
    if changed:
        kit.log(f"the tree has changes not committed; the runs are of HEAD {commit[:7]}, without them:\n{changed}")
    results = {
        "commit": commit,
        "command": " ".join(["python", "benchmarks/diagnosis/planted_regressions.py", *sys.argv[1:]]),
        "machine": kit.machine(),
        "plants": [asdict(plant) for plant in plants],
        "runs": {},
    }
    trees = [(UNCHANGED, None, tuple(test for plant in plants for test in plant.tests))]
    trees += [(plant.name, plant, plant.tests) for plant in plants]
    with tempfile.TemporaryDirectory(prefix="planted-") as folder:
        for name, plant, tests in trees:
            scratch, tree = Path(folder) / name, Path(folder) / name / "tree"
            tree.mkdir(parents=True)
            kit.base_tree(commit, tree, paths=(".",))
            if plant is not None:
                plant.apply(tree)
            imported = subprocess.run(
                [sys.executable, "-c", "import fleetrl; print(fleetrl.__file__)"],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            if not imported.startswith(str(tree)):
                raise SystemExit(f"the scratch copy's fleetrl is not the one imported there: {imported}")
            kit.log(f"{name}: {len(tests)} tests")
            run = run_tests(tree, tests, scratch, args.timeout)
            run["verdict"], run["as_expected"] = verdict(name, run, tests)
            results["runs"][name] = run
            kit.log(f"  {run['verdict']} (exit {run['code']}, {run['wall_s']:.0f} s), left {run['processes_left']}")
            kit.write_json(out / "results.json", results)
    text = table(results)
    header = f"Commit {commit[:7]}; command `{results['command']}`; {kit.machine_line(results['machine'])}\n\n"
    (out / "table.md").write_text(header + text + "\n")
    print(header + text)
    if not all(run["as_expected"] for run in results["runs"].values()):
        raise SystemExit("not as expected: the unchanged tree must be green and every plant red (above)")


if __name__ == "__main__":
    main()

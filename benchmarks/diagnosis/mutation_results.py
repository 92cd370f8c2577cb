"""The mutation run's results, per module, as docs/benchmarks/mutation.json, and the table
docs/benchmarks/mutation.md shows. benchmarks/diagnosis/mutation.sh runs it after mutmut, from
`mutants/results.txt` (`mutmut results --all true`: one verdict per mutant). It records what a
later reader needs to trust or redo the score: the commit, the command, the tests each mutant ran
against, the sha256 of each mutated module as it was run (tests/test_mutation_results.py warns
when a module has changed since), and every mutant that was not killed, by name (`mutmut show
<name>` shows its change).

A run stopped before its end (mutmut resumes where it stopped: a mutant with a verdict is not run
again) is recorded as it stands: its unrun mutants are listed as `not_run`, and the score is over
the mutants that were run.

    python benchmarks/diagnosis/mutation_results.py mutants/results.txt
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "benchmarks" / "mutation.json"
COMMAND = "benchmarks/diagnosis/mutation.sh 2"
# mutmut's words for a mutant's fate (`mutmut results`), and the names the record gives them
CAUGHT = {"killed": "killed", "timeout": "timeout"}
MISSED = {"survived": "survived", "no tests": "no_tests", "suspicious": "suspicious", "segfault": "segfault"}
UNRUN = {"not checked": "not_run"}


def mutmut_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def module_of(mutant: str, modules: list[str]) -> str:
    """`fleetrl.watch.judging.verdict.xǁChecksǁcheck__mutmut_3` → fleetrl/watch/judging/verdict.py."""
    dotted = {m.removesuffix(".py").replace("/", "."): m for m in modules}
    return next(path for name, path in dotted.items() if mutant.startswith(name + "."))


def score(caught: int, run: int) -> float:
    return round(caught / run, 4) if run else 0.0


def summarise(verdicts: dict[str, str], modules: list[str]) -> dict[str, dict]:
    """Per module: its sha256, its counts, its score over the mutants run, and by name every
    mutant that was not killed. A mutant no selected test reaches (`no_tests`) counts as missed."""
    per_module = {}
    for module in modules:
        mine = {name: v for name, v in verdicts.items() if module_of(name, modules) == module}
        unknown = {v for v in mine.values()} - set(CAUGHT) - set(MISSED) - set(UNRUN)
        if unknown:
            raise SystemExit(f"{module}: verdicts this script does not know: {sorted(unknown)}")
        counts = {key: sum(v == word for v in mine.values()) for word, key in (CAUGHT | MISSED | UNRUN).items()}
        run = len(mine) - counts["not_run"]
        per_module[module] = {
            "sha256": hashlib.sha256((ROOT / module).read_bytes()).hexdigest(),
            "mutants": len(mine),
            **counts,
            "score": score(counts["killed"] + counts["timeout"], run),
            "names": {
                key: sorted(name for name, v in mine.items() if v == word)
                for word, key in (MISSED | UNRUN | {"timeout": "timeout"}).items()
            },
        }
    return per_module


def table(results: dict) -> str:
    """The Markdown table docs/benchmarks/mutation.md shows (tests/test_mutation_results.py
    checks that the page shows this one)."""
    rows = [
        "| module | mutants | run | killed | timed out | survived | no test reaches it | score over the run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines = {module: counted(r) for module, r in results["modules"].items()}
    lines["all"] = {key: sum(line[key] for line in lines.values()) for key in next(iter(lines.values()))}
    for module, line in lines.items():
        shown = f"`{module}`" if module != "all" else "all"
        percent = f"{100 * score(line['killed'] + line['timeout'], line['run']):.1f} %"
        rows.append(
            f"| {shown} | {line['mutants']} | {line['run']} | {line['killed']} | {line['timeout']} | "
            f"{line['survived']} | {line['no_tests']} | {percent if module != 'all' else f'**{percent}**'} |"
        )
    return "\n".join(rows)


def counted(module: dict) -> dict[str, int]:
    """A module's line of the table: a suspicious mutant (its tests failed oddly) or a segfault
    counts among the survivors, as nothing shows a test failed on it."""
    return {
        "mutants": module["mutants"],
        "run": module["mutants"] - module["not_run"],
        "killed": module["killed"],
        "timeout": module["timeout"],
        "survived": module["survived"] + module["suspicious"] + module["segfault"],
        "no_tests": module["no_tests"],
    }


def main(results_txt: Path) -> None:
    verdicts = {}
    for line in results_txt.read_text().splitlines():
        name, _, verdict = line.strip().rpartition(": ")
        if name:
            verdicts[name] = verdict
    config = mutmut_config()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    results = {
        "command": COMMAND,
        "commit": commit,
        "date": date.today().isoformat(),
        "tests": config["pytest_add_cli_args_test_selection"],
        "modules": summarise(verdicts, config["only_mutate"]),
    }
    RESULTS.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    print(table(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

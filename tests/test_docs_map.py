"""A newcomer's maps match the tree: the architecture page names every package of fleetrl/ and no
other; benchmarks/README.md indexes every benchmark script and names none that is gone, and every
script's imports of fleetrl, the tests' support modules and the benchmark kit name modules and
names that exist (read from the source, not imported: a module moved in fleetrl/ breaks the
benchmark that imports it here, not on its next run); the getting-started table lists every
shipped config; and no text in the repository names a file it does not hold."""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
from pathlib import Path

from tests.support import REPO

BENCHMARKS = REPO / "benchmarks"
RUN_LEFTOVERS = ("results", ".venvs", "__pycache__")  # what runs leave in benchmarks/ (git-ignored)


def benchmark_paths(suffixes: tuple[str, ...]) -> list[Path]:
    """The files under benchmarks/ with these endings, tracked or new, never walking into what
    runs leave there (a comparison library's venv holds thousands of files)."""
    found = []
    for folder, subfolders, names in os.walk(BENCHMARKS):
        subfolders[:] = sorted(name for name in subfolders if name not in RUN_LEFTOVERS)
        found += [Path(folder) / name for name in sorted(names) if name.endswith(suffixes)]
    return found


def benchmark_files() -> set[str]:
    """Every script, job and config under benchmarks/ but the shared kit, relative to it."""
    paths = (path.relative_to(BENCHMARKS) for path in benchmark_paths((".py", ".sh", ".yaml")))
    return {str(path) for path in paths if path.parts[0] != "kit"}


def indexed_files() -> list[str]:
    """The first cell of each row of the README's index table."""
    text = (BENCHMARKS / "README.md").read_text()
    index = text.split("\n## Index\n", 1)[1]
    return re.findall(r"^\| `([^`]+)` \|", index, flags=re.MULTILINE)


def test_the_benchmarks_index_lists_every_script_once_and_nothing_else():
    listed = indexed_files()
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({p for p in listed if listed.count(p) > 1})}"
    on_disk = benchmark_files()
    assert sorted(on_disk - set(listed)) == [], "scripts missing from benchmarks/README.md's index"
    assert sorted(set(listed) - on_disk) == [], "benchmarks/README.md's index names scripts that are not there"


def module_file(module: str):
    """The source file of a module of this repository (fleetrl.x.y, tests.x, kit.x), or None."""
    parts = module.split(".")
    base = BENCHMARKS if parts[0] == "kit" else REPO
    for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def top_level_names(path) -> set[str]:
    """What a module defines or imports at its top level (where a `from M import name` finds it)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def test_every_benchmark_imports_what_exists():
    missing = []
    for script in benchmark_paths((".py",)):
        for node in ast.walk(ast.parse(script.read_text())):  # lazy imports inside functions too
            if isinstance(node, ast.Import):
                wanted = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                wanted = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in wanted:
                if module.split(".")[0] not in ("fleetrl", "tests", "kit"):
                    continue
                found = module_file(module)
                where = f"{script.relative_to(REPO)}:{node.lineno}"
                if found is None:
                    missing.append(f"{where}: no module {module}")
                elif name and name not in top_level_names(found) and module_file(f"{module}.{name}") is None:
                    missing.append(f"{where}: {module} has no {name}")
    assert missing == []


def test_the_getting_started_table_lists_every_shipped_config():
    text = (REPO / "docs" / "getting-started.md").read_text()
    table = text.split("\n## The shipped configs\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(configs/[\w.-]+\.yaml)`", table))
    shipped = {f"configs/{path.name}" for path in (REPO / "configs").glob("*.yaml")}
    assert sorted(shipped - listed) == [], "configs missing from docs/getting-started.md's table"
    assert sorted(listed - shipped) == [], "docs/getting-started.md's table names configs that are not shipped"


# What the repository's text names as its own files: a path under one of its folders with a file
# ending, or a capitalised Markdown file (README.md). Placeholders (<run>, *) are not paths.
CITED_PATH = re.compile(
    r"(?<![\w./-])((?:fleetrl|tests|docs|benchmarks|configs)/[\w./-]+\.(?:py|md|yaml|sh|json|png|svg))(?![\w/])"
)
CITED_NAME = re.compile(r"(?<![\w./<-])([A-Z][A-Z_-]*\.md)\b")
UNCITABLE = ("benchmarks/results/", "benchmarks/.venvs/")  # what runs make, never in the tree
GENERATED = ("docs/reference/config.md", "docs/reference/cli.md", "docs/reference/exit-codes.md")  # docs/hooks


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / name for name in listed.split() if (REPO / name).is_file()]


def test_every_file_the_repository_names_is_in_it():
    """A comment or page naming a file the repository does not hold, or a module since moved,
    sends its reader nowhere."""
    tracked = tracked_files()
    files = [path for path in tracked if path.suffix in (".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".in")]
    names = {path.name for path in tracked} | {Path(g).name for g in GENERATED}
    missing = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            for cited in CITED_PATH.findall(line):
                if cited.startswith(UNCITABLE) or cited in GENERATED:
                    continue
                # a path from the root, or relative to the file (a page's link) or to docs/ (mkdocs.yml)
                if not any((base / cited).exists() for base in (REPO, path.parent, REPO / "docs")):
                    missing.append(f"{where}: {cited}")
            for cited in CITED_NAME.findall(line):
                if cited not in names:
                    missing.append(f"{where}: {cited}")
    assert missing == []


def test_the_architecture_page_names_every_package_and_no_other():
    text = (REPO / "docs" / "concepts" / "architecture.md").read_text()
    table = text.split("\n### The packages\n", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\| `fleetrl/([\w/]+)/` \|", table, flags=re.MULTILINE)
    assert len(named) == len(set(named)), "a package is named twice"
    packages = {
        str(folder.relative_to(REPO / "fleetrl"))
        for folder in (REPO / "fleetrl").rglob("*")
        if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py"))
    }
    assert sorted(packages - set(named)) == [], "packages missing from docs/concepts/architecture.md"
    assert sorted(set(named) - packages) == [], "docs/concepts/architecture.md names packages that are not there"

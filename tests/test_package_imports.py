"""fleetrl's modules import each other without a cycle.

The graph is read from the source (ast), not by importing: an edge A → B for every `import` or
`from ... import` in A that names B or something in B, module level or inside a function alike —
a cycle dodged by moving one import into a function is still two modules that cannot be read,
tested or changed one without the other. Only imports under `if TYPE_CHECKING:` are left out (they
never run). A failure prints each cycle as a path of modules.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from tests.support import REPO


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, i.e. all but those under `if TYPE_CHECKING:`."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports (`from pkg import name` counts as pkg.name
    when that is a module, else as pkg)."""
    root = package_dir.parent
    paths = {module_name(path, root): path for path in package_dir.rglob("*.py")}
    graph = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: `from . import x`, `from ..y import z`
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names]
            for name in names:
                while name and name not in paths:  # `import fleetrl.a.b.attr` → the module fleetrl.a.b
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle (first module repeated at the end) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def connect(start: str) -> None:  # Tarjan, iterative: no recursion limit on deep graphs
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(set(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return [shortest_cycle(graph, component) for component in components]


def shortest_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle in `component`: breadth first from each member back to itself."""
    best: list[str] = []
    for start in sorted(component):
        parents: dict[str, str | None] = {start: None}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if start in graph[node]:
                path = [node]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                cycle = [*reversed(path), start]
                best = cycle if not best or len(cycle) < len(best) else best
                break
            for successor in sorted(graph[node] & component):
                if successor not in parents:
                    parents[successor] = node
                    queue.append(successor)
    return best


def describe(found: list[list[str]]) -> str:
    return "\n".join(" → ".join(cycle) for cycle in found)


# ---- the graph reader itself, on a package written for the purpose ------------------------------


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_a_cycle_through_a_function_level_import_is_found_and_printed(tmp_path):
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import thing\n",
            "b.py": "def thing():\n    from .sub import c\n",
            "sub/__init__.py": "",
            "sub/c.py": "import pkg.a\n",
            "d.py": "from pkg import a\n",
        },
    )
    found = cycles(import_graph(package))
    assert found == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert describe(found) == "pkg.a → pkg.b → pkg.sub.c → pkg.a"


def test_type_checking_imports_and_outside_modules_make_no_edge(tmp_path):
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "import os\nfrom typing import TYPE_CHECKING\nfrom pkg import b\n",
            "b.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import x\nelse:\n    import json\n",
        },
    )
    graph = import_graph(package)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert cycles(graph) == []


# ---- fleetrl ------------------------------------------------------------------------------------


def test_fleetrl_has_no_import_cycle():
    found = cycles(import_graph(REPO / "fleetrl"))
    assert not found, f"import cycles in fleetrl:\n{describe(found)}"

"""An algorithm is named only inside its own package (issue 22): a reader asking "how does SAC
train?" opens fleetrl/algos/sac/ and nothing else, and no shared module knows, branches on or
documents one algorithm. import-linter checks the imports; this checks every word of the source
— identifiers, strings, comments and docstrings — for the built-in algorithms' names. (The keys
that moved into an algorithm's package say where they went: tests/test_config.py.)"""

from __future__ import annotations

import re

from fleetrl.algos.registry import algorithm_names, builtin_names
from tests.support import REPO

SOURCE = REPO / "fleetrl"

# Where each name may appear: its own package, and the packages that build on it.
HOMES = {
    "ppo": {"algos/ppo", "algos/ppg", "algos/bc"},  # PPG's policy phase and BC's actor are PPO's actor, extended
    "grpo": {"algos/ppo"},  # GRPO is PPO with `algorithm.adv_type: grpo`
    "ppg": {"algos/ppg"},
    "sac": {"algos/sac"},
    "bc": {"algos/bc"},
}

# (file, the line's text) → why that line may name an algorithm outside its package.
ALLOWED = {
    ("config/schema.py", 'name: str = "ppo"'): "the default `algorithm.name`: a config that names none trains PPO",
}


def pattern(name: str) -> re.Pattern:
    """`name` as a word of its own: lower case in snake_case (`ppo`, `ppo_update`, not `ppoll`)
    or upper case in CamelCase and prose (`PPO`, `PPOConfig`, `PPO's`, not `BCELoss`)."""
    upper = name.upper()
    return re.compile(rf"(?<![A-Za-z]){name}(?![a-z])|(?<![A-Za-z]){upper}(?![A-Z](?![a-z]))")


def mentions() -> list[tuple[str, int, str, str]]:
    """(file relative to fleetrl/, line number, name, line) of every name outside its homes."""
    found = []
    for path in sorted(SOURCE.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        relative = path.relative_to(SOURCE).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name, homes in HOMES.items():
                if any(relative.startswith(f"{home}/") for home in homes):
                    continue
                if pattern(name).search(line) and (relative, line.strip()) not in ALLOWED:
                    found.append((relative, number, name, line.strip()))
    return found


def test_no_module_outside_an_algorithms_package_names_it():
    assert mentions() == []


def test_the_scan_knows_every_builtin_and_finds_what_it_looks_for():
    assert set(builtin_names()) == set(HOMES) - {"grpo"}  # a new built-in gets its line in HOMES
    lines = {
        "from fleetrl.algos.ppo.update import ppo_update": ["ppo"],
        "class SACLearner:  # PPO's, GRPO-style": ["ppo", "grpo", "sac"],
        "if name == 'bc': ...  # PPGConfig": ["ppg", "bc"],
        "ppoll(2), BCELoss, isaac, Abc": [],
    }
    for line, names in lines.items():
        assert [name for name in HOMES if pattern(name).search(line)] == names, line
    for (relative, text), _ in ALLOWED.items():  # every exception is still needed
        assert text in (SOURCE / relative).read_text(), relative


def test_the_default_algorithm_comes_first_then_the_packages_by_name():
    assert algorithm_names()[: len(builtin_names())] == ["ppo", "bc", "ppg", "sac"]

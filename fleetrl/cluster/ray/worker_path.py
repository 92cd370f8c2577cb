"""A Ray worker's PYTHONPATH: the driver's import paths, then what its node adds.

Ray expands `${VAR}` in a runtime environment's variables on the node, and an unset variable to
nothing. `<driver paths>:${PYTHONPATH}` therefore ended in ':' on every node without a
PYTHONPATH of its own (most nodes started by `ray start`): an empty entry, which Python reads as
the worker's current directory, placed before the standard library — any `json.py` or `torch/`
there would be imported instead. So what a node adds comes from a variable that carries its own
leading separator (`NODE_PATHS_VARIABLE`, e.g. `:/opt/node-site`): a node without it adds nothing.
An isolated simulated node sets it to its skewed clock's folder (`cluster/isolation/nodes.py`).
"""

from __future__ import annotations

import os

NODE_PATHS_VARIABLE = "FLEETRL_NODE_PYTHONPATH"


def worker_python_path(driver_paths: str) -> str:
    """The value Ray expands on the worker's node (no empty entry, whatever the node has)."""
    return without_empty(driver_paths) + "${" + NODE_PATHS_VARIABLE + "}"


def without_empty(paths: str) -> str:
    """`paths` (a PYTHONPATH) without its empty entries, each of which would mean the current directory."""
    return os.pathsep.join(filter(None, paths.split(os.pathsep)))


def node_paths(*paths: str) -> str:
    """`NODE_PATHS_VARIABLE`'s value for a node that adds `paths` to its workers' PYTHONPATH."""
    return "".join(os.pathsep + path for path in paths if path)

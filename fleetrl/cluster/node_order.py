"""Which Ray node is fleetrl's node i, on a cluster fleetrl joined (`cluster.ray_address`).

Torch- and Ray-free: it orders the entries of `ray.nodes()`, for the backend and the doctor alike.
"""

from __future__ import annotations


def in_node_order(nodes: list[dict]) -> list[dict]:
    """The alive nodes in fleetrl's node order: the head first, then the others by address. A
    node offering neither CPU nor GPU (a head started with `--num-cpus=0`, as is common, or an
    isolated simulation's) can hold no rank, so it gets no index."""
    usable = [n for n in nodes if n.get("Alive") and (n["Resources"].get("CPU", 0) or n["Resources"].get("GPU", 0))]
    usable.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"], n["NodeID"]))
    return usable

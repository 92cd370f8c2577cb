"""Placement: which device (and node) each rank of each component runs on.

`cluster.component_placement` puts components on ranges of global device ranks. Device ranks count
across nodes: node 0 holds 0..k-1, node 1 the next k, and so on; on a machine without GPUs a device
is a CPU slot. Overlapping ranges make components collocated (they share devices), disjoint ranges
make them disaggregated. A component the mapping does not name keeps its default
(`DEFAULT_PLACEMENT`; an unnamed rollout follows the actor, `default_rollout`; an unnamed eval
worker goes with env rank 0), so one component overridden on the command line is a complete
placement. The eval worker (one process: evaluation during training) is placed only when the run
evaluates (`evaluates`); its range is checked either way.

Resolving is pure (no I/O, no Ray, no torch) so the whole layout is checked, and can be printed by
`fleetrl train --dry-run`, before any process starts.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetrl.config.schema import DEFAULT_PLACEMENT
from fleetrl.errors import ConfigError, nearest

PLACEMENT_KEY = "cluster.component_placement"
EVAL = "eval"
COMPONENTS = ("actor", "rollout", "env", EVAL)
SPEC_FIELDS = ("devices", "processes_per_device")
RANGE_EXAMPLES = "a device range such as 5, '0-7', '0-3,8-11' or 'all'"
RANGE_PART = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class Assignment:
    """One process of one component and where it runs."""

    component: str  # 'actor' | 'rollout' | 'env' | 'eval'
    rank: int  # rank within the component, in global device order, then process index
    world_size: int  # number of ranks of that component
    node: int
    device: int  # global device rank
    local_device: int  # device index on its node
    visible_devices: str  # CUDA_VISIBLE_DEVICES for this process on GPU nodes
    cpu_threads: int  # torch threads for this process
    process_index: int  # 0.. when several processes of the component share one device


@dataclass(frozen=True)
class Placement:
    num_nodes: int
    devices_per_node: int
    assignments: tuple[Assignment, ...]

    def ranks(self, component: str) -> list[Assignment]:
        """The component's assignments, ordered by rank."""
        ranks = [a for a in self.assignments if a.component == component]
        if not ranks:
            placed = sorted({a.component for a in self.assignments})
            raise KeyError(f"component {component!r} is not placed; placed: {placed}")
        return sorted(ranks, key=lambda a: a.rank)

    def world_size(self, component: str) -> int:
        return len(self.ranks(component))

    def placed(self, component: str) -> bool:
        return any(a.component == component for a in self.assignments)

    def collocated(self, a: str, b: str) -> bool:
        """Whether the two components share at least one device."""
        return bool(self.devices_of(a) & self.devices_of(b))

    def devices_of(self, component: str) -> set[int]:
        return {a.device for a in self.ranks(component)}

    def nodes_of(self, component: str) -> list[int]:
        return sorted({a.node for a in self.ranks(component)})

    def table(self) -> str:
        """A plain-text table of every rank, for `fleetrl train --dry-run`."""
        header = ("component", "rank", "node", "device", "local device", "visible devices", "threads")
        rows = [
            (a.component, a.rank, a.node, a.device, a.local_device, a.visible_devices, a.cpu_threads)
            for a in self.assignments
        ]
        cells = [tuple(str(value) for value in row) for row in (header, *rows)]
        widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
        lines = ["  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in cells]
        title = f"{self.num_nodes} node(s) x {self.devices_per_node} device(s) per node"
        return "\n".join([title, *lines])


def resolve_placement(
    num_nodes: int,
    devices_per_node: int,
    component_placement: Mapping,
    cpu_count_per_node: int | None = None,
    evaluates: bool = False,
) -> Placement:
    """Check `cluster.component_placement` against the cluster and assign every rank a device.

    A component the mapping does not name keeps its default: actor and env on device 0
    (`DEFAULT_PLACEMENT`), rollout as `default_rollout` says, eval with env rank 0; eval is
    placed only when `evaluates` (runner.eval_interval > 0).
    `cpu_count_per_node` is split evenly among all processes on a node; None (unknown) gives each
    process one thread, so that resolving stays pure instead of reading this machine's CPU count.
    """
    check_positive_int("cluster.num_nodes", num_nodes)
    check_positive_int("cluster.devices_per_node", devices_per_node)
    if cpu_count_per_node is not None:
        check_positive_int("cluster.cpu_count_per_node", cpu_count_per_node)
    shape = (num_nodes, devices_per_node)
    layout = component_layout(component_placement, shape, evaluates)
    threads = threads_per_node(layout, shape, cpu_count_per_node)
    assignments = tuple(
        assignment
        for component, (devices, processes) in layout.items()
        for assignment in assign_ranks(component, devices, processes, devices_per_node, threads)
    )
    return Placement(num_nodes, devices_per_node, assignments)


def parse_device_range(key: str, spec: Any, total_devices: int, shape: tuple[int, int] | None = None) -> list[int]:
    """The sorted global device ranks named by `spec` (an int or text like '0-3,8-11' or 'all').

    `shape` (num_nodes, devices_per_node), when given, lets a range beyond the cluster name the
    cluster's shape as well as its size.
    """
    if isinstance(spec, int) and not isinstance(spec, bool):
        devices = [spec]
    elif isinstance(spec, str):
        devices = parse_range_text(key, spec, total_devices)
    else:
        raise ConfigError(key, spec, RANGE_EXAMPLES)
    check_no_duplicates(key, spec, devices)
    check_within_cluster(key, spec, devices, total_devices, shape)
    return sorted(devices)


def check_divisible(placement: Placement, component: str, quantity_key: str, quantity: int) -> None:
    """Fail unless `quantity` (a batch size, an env count...) splits evenly over the component."""
    world_size = placement.world_size(component)
    if quantity % world_size:
        raise ConfigError(
            quantity_key,
            quantity,
            f"a multiple of {world_size} (the {component} world size)",
            hint=f"{PLACEMENT_KEY}.{component} places {world_size} rank(s)",
        )


def check_positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "an integer >= 1")


def component_layout(
    component_placement: Mapping, shape: tuple[int, int], evaluates: bool = False
) -> dict[str, tuple[list[int], int]]:
    """Each placed component's (devices, processes per device), in the order of COMPONENTS."""
    if not isinstance(component_placement, Mapping):
        raise ConfigError(PLACEMENT_KEY, component_placement, "a mapping of component name to device range")
    for name in component_placement:
        if name not in COMPONENTS:
            raise ConfigError(
                f"{PLACEMENT_KEY}.{name}",
                name,
                f"a component, one of {list(COMPONENTS)}",
                hint=nearest(str(name), COMPONENTS),
            )
    given = {**DEFAULT_PLACEMENT, **component_placement}
    layout = {name: parse_spec(f"{PLACEMENT_KEY}.{name}", given[name], shape) for name in COMPONENTS if name in given}
    layout.setdefault("rollout", default_rollout(layout["actor"][0], layout["env"]))
    devices, processes = layout.setdefault(EVAL, default_eval(layout["env"]))
    if len(devices) * processes != 1:
        raise ConfigError(f"{PLACEMENT_KEY}.{EVAL}", given[EVAL], "one device (the eval worker is one process), e.g. 3")
    return {name: layout[name] for name in COMPONENTS if name != EVAL or evaluates}


def default_rollout(actor_devices: list[int], env: tuple[list[int], int]) -> tuple[list[int], int]:
    """Rollout unplaced: collocated with the actor (its weights are a local copy away), one process
    on each of the actor's first k devices, k the largest divisor of the env ranks (each rollout
    rank serves an equal share of them) that is at most the actor's device count."""
    env_ranks = len(env[0]) * env[1]
    count = max(k for k in range(1, len(actor_devices) + 1) if env_ranks % k == 0)
    return actor_devices[:count], 1


def default_eval(env: tuple[list[int], int]) -> tuple[list[int], int]:
    """Eval unplaced: one process on env rank 0's device (it runs simulators too)."""
    return env[0][:1], 1


def parse_spec(key: str, spec: Any, shape: tuple[int, int]) -> tuple[list[int], int]:
    """(devices, processes per device) from a range or a {devices, processes_per_device} mapping."""
    total_devices = shape[0] * shape[1]
    if not isinstance(spec, Mapping):
        return parse_device_range(key, spec, total_devices, shape), 1
    for field in spec:
        if field not in SPEC_FIELDS:
            raise ConfigError(
                f"{key}.{field}", spec[field], f"one of {list(SPEC_FIELDS)}", hint=nearest(str(field), SPEC_FIELDS)
            )
    if "devices" not in spec:
        raise ConfigError(f"{key}.devices", None, RANGE_EXAMPLES)
    processes = spec.get("processes_per_device", 1)
    check_positive_int(f"{key}.processes_per_device", processes)
    return parse_device_range(f"{key}.devices", spec["devices"], total_devices, shape), processes


def parse_range_text(key: str, text: str, total_devices: int) -> list[int]:
    """Devices of 'all' or of comma-separated parts, each 'N' or an ascending 'A-B'."""
    if text.strip().lower() == "all":
        return list(range(total_devices))
    if not text.strip():
        raise ConfigError(key, text, "at least one device: " + RANGE_EXAMPLES)
    devices = []
    for part in text.split(","):
        match = RANGE_PART.match(part.strip())
        if not match:
            raise ConfigError(key, text, RANGE_EXAMPLES, hint=f"'{part.strip()}' is not a range")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first:
            raise ConfigError(
                key, text, RANGE_EXAMPLES, hint=f"'{part.strip()}' runs backwards; write '{last}-{first}'"
            )
        devices.extend(range(first, last + 1))
    return devices


def check_no_duplicates(key: str, spec: Any, devices: list[int]) -> None:
    repeated = sorted(device for device, count in Counter(devices).items() if count > 1)
    if repeated:
        raise ConfigError(key, spec, "each device at most once", hint=f"listed more than once: {repeated}")


def check_within_cluster(
    key: str, spec: Any, devices: list[int], total_devices: int, shape: tuple[int, int] | None
) -> None:
    outside = [device for device in devices if not 0 <= device < total_devices]
    if outside:
        size = f"{total_devices} devices"
        if shape:
            size = f"{shape[0]} node(s) x {shape[1]} device(s) = {size}"
        raise ConfigError(
            key,
            spec,
            f"device ranks 0-{total_devices - 1} (the cluster has {size})",
            hint=f"outside the cluster: {outside}",
        )


def threads_per_node(
    layout: dict[str, tuple[list[int], int]], shape: tuple[int, int], cpu_count_per_node: int | None
) -> list[int]:
    """Torch threads for each process, per node: the node's CPUs shared by all its processes."""
    if cpu_count_per_node is None:
        return [1] * shape[0]
    num_nodes, devices_per_node = shape
    processes_on_node = [0] * num_nodes
    for devices, processes in layout.values():
        for device in devices:
            processes_on_node[device // devices_per_node] += processes
    return [max(1, cpu_count_per_node // max(count, 1)) for count in processes_on_node]


def assign_ranks(
    component: str, devices: list[int], processes_per_device: int, devices_per_node: int, threads: list[int]
) -> list[Assignment]:
    slots = [(device, index) for device in devices for index in range(processes_per_device)]
    assignments = []
    for rank, (device, index) in enumerate(slots):
        node, local_device = divmod(device, devices_per_node)
        assignments.append(
            Assignment(
                component=component,
                rank=rank,
                world_size=len(slots),
                node=node,
                device=device,
                local_device=local_device,
                visible_devices=str(local_device),
                cpu_threads=threads[node],
                process_index=index,
            )
        )
    return assignments

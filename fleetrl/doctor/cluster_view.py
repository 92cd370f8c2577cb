"""What the config says about the cluster, read the same way by every check.

Every `cluster.*` field is read with getattr and a default, here and nowhere else, so the doctor
works with configs from any schema version (the foundation's had only `cluster.backend`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetrl.plan.layout import detect_devices_per_node
from fleetrl.plan.placement import Placement, resolve_placement

RAY_DEFAULT_PORT = 6379  # `ray start --head` listens here unless told otherwise


@dataclass(frozen=True)
class Endpoint:
    """'host' or 'host:port', as written in an address."""

    host: str
    port: int | None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def parse_endpoint(text: str, default_port: int | None = None) -> Endpoint:
    """'10.0.0.2', '10.0.0.2:6379', '[fe80::1]:6379', 'ray://head:10001' → Endpoint."""
    text = str(text).strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.rstrip("/")
    if text.startswith("["):  # [ipv6]:port
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
        return Endpoint(host, int(port) if port else default_port)
    if text.count(":") == 1:
        host, port = text.split(":")
        return Endpoint(host, int(port) if port else default_port)
    return Endpoint(text, default_port)


class ClusterView:
    def __init__(self, config: Any, node: int = 0):
        self.config = config
        self.cluster = getattr(config, "cluster", None)
        self.node = node  # the node this process runs on

    def setting(self, name: str, default: Any = None) -> Any:
        value = getattr(self.cluster, name, default)
        return default if value is None else value

    @property
    def num_nodes(self) -> int:
        return int(self.setting("num_nodes", 1))

    @property
    def simulated(self) -> bool:
        """`cluster.simulate_nodes`: every 'node' is a raylet on this machine."""
        return int(self.setting("simulate_nodes", 0)) > 1

    @property
    def remote_peers(self) -> bool:
        """Whether some ranks run on other machines (and so must reach this one over a network)."""
        return self.num_nodes > 1 and not self.simulated

    @property
    def node_ip(self) -> str | None:
        """The address a Ray started by fleetrl advertises (`cluster.node_ip`)."""
        return self.setting("node_ip", None)

    @property
    def ray_address(self) -> str | None:
        """An existing Ray cluster to join: `cluster.ray_address`, else RAY_ADDRESS."""
        return self.setting("ray_address", None) or self.env_for_node().get("RAY_ADDRESS") or None

    def ray_head(self) -> Endpoint | None:
        """The Ray head's GCS endpoint, when the address names one ('auto' names none)."""
        address = self.ray_address
        if not address or address in ("auto", "local"):
            return None
        return parse_endpoint(address, RAY_DEFAULT_PORT)

    @property
    def component_placement(self) -> Mapping | None:
        return self.setting("component_placement", None) or None

    @property
    def wants_cuda(self) -> bool:
        """Whether the config puts the actor or the rollout on CUDA devices."""
        devices = [getattr(getattr(self.config, section, None), "device", "cpu") for section in ("actor", "rollout")]
        return any(str(device).startswith("cuda") for device in devices)

    def devices_per_node(self) -> int:
        """`cluster.devices_per_node`, or what fleetrl's runtime detects when it is null: this
        machine's GPU count, else its CPU count."""
        configured = self.setting("devices_per_node", None)
        if configured:
            return int(configured)
        return detect_devices_per_node()

    def placement(self, cpu_count: int | None = None) -> Placement | None:
        """The resolved placement (raises ConfigError when it is wrong); None when none is set."""
        if self.component_placement is None:
            return None
        return resolve_placement(
            self.num_nodes, self.devices_per_node(), self.component_placement, cpu_count_per_node=cpu_count
        )

    def actor_ranks(self) -> list | None:
        """The actor's assignments; None when the placement cannot be resolved here."""
        try:
            placement = self.placement()
        except Exception:  # a broken placement is the placement check's to report
            return None
        return [] if placement is None else placement.ranks("actor")

    def uses_collectives(self) -> bool:
        """Whether the actor has several ranks, so a Gloo/NCCL process group is formed (True
        when unknown, to stay on the safe side)."""
        ranks = self.actor_ranks()
        return ranks is None or len(ranks) > 1

    def collectives_span_nodes(self) -> bool:
        """Whether the actor's process group connects ranks on different machines (True when
        unknown): only then must Gloo advertise an address other machines can reach."""
        if not self.remote_peers:
            return False
        ranks = self.actor_ranks()
        return ranks is None or len({a.node for a in ranks}) > 1

    def configured_env_vars(self, node: int | None = None) -> dict[str, str]:
        """`cluster.env_vars` as one node's workers get them: flat entries for every node, then
        {node index: {VAR: value}} entries for that node on top."""
        node = self.node if node is None else node
        mapping = self.setting("env_vars", None) or {}
        merged = {str(k): str(v) for k, v in mapping.items() if not isinstance(v, Mapping)}
        per_node = mapping.get(node, mapping.get(str(node), {}))
        if isinstance(per_node, Mapping):
            merged.update({str(k): str(v) for k, v in per_node.items()})
        return merged

    def env_for_node(self, node: int | None = None) -> dict[str, str]:
        """This process's environment with the node's configured variables on top."""
        return {**os.environ, **self.configured_env_vars(node)}

    def env_var_source(self, name: str) -> str:
        if name in self.configured_env_vars():
            return f"cluster.env_vars for node {self.node}"
        return "the environment"

    def ray_temp_dir(self) -> str:
        """Where Ray keeps sessions, sockets and logs, by Ray's own rule (RAY_TMPDIR, TMPDIR,
        /tmp) + '/ray'; `cluster.ray_temp_dir` if a later schema adds one."""
        configured = self.setting("ray_temp_dir", None)
        if configured:
            return str(configured)
        env = self.env_for_node()
        base = env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp"
        return os.path.join(base, "ray")

    def ray_spill_dirs(self) -> list[str]:
        """Object spilling directories, when they are not the default (inside the temp dir)."""
        configured = self.setting("ray_spill_dir", None)
        if configured:
            return [str(configured)]
        return spill_dirs_from_json(self.env_for_node().get("RAY_object_spilling_config", ""))


def spill_dirs_from_json(text: str) -> list[str]:
    """The filesystem spill directories of a Ray `object_spilling_config` JSON, if any."""
    import json

    if not text:
        return []
    try:
        spec = json.loads(text)
    except ValueError:
        return []
    if not isinstance(spec, dict) or spec.get("type") != "filesystem":
        return []
    paths = (spec.get("params") or {}).get("directory_path") or []
    return [paths] if isinstance(paths, str) else [str(path) for path in paths]

"""The knobs of `fleetrl doctor`: thresholds, timeouts and extra peers, each with a safe default."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class DoctorOptions:
    # disk: Ray itself starts refusing objects and warns "is over 95% full" at 95% used
    max_used_percent: float = 95.0  # FAIL at or above this share of the filesystem used
    warn_used_percent: float = 90.0  # WARN at or above this
    min_free_bytes: int = 1 * GIB  # FAIL below this much free space
    # which node of the cluster this machine is (the head is node 0)
    node: int = 0
    # network
    connect_timeout: float = 2.0  # seconds for each TCP connect and for resolving the hostname
    peers: tuple[str, ...] = ()  # extra 'host:port' endpoints that must be reachable from here
    # processes: each bound is for the whole check, process start-up included
    handshake_timeout: float = 15.0  # the Gloo/NCCL rendezvous + one all_reduce
    handshake_processes: int | None = None  # ranks to spawn (None: the actor's ranks on this node)
    max_handshake_processes: int = 8  # never spawn more than this many for the handshake
    env_timeout: float = 60.0  # building the simulator + reset + one step

"""Simulators for the isolated-node tests (`tests.isolation_envs:...` entry points)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import gymnasium as gym
import psutil

from tests.live_envs import simulate_physics


class NodeProbe(gym.Wrapper):
    """CartPole that writes what its process sees of its machine into `<folder>/<node>-<pid>.json`:
    host name, namespaces, addresses, wall clock, and /tmp after leaving a marker of its own there.
    Its steps take 0.3 s each while `hold_file` (outside the nodes' own /tmp) exists."""

    def __init__(self, folder: str, hold_file: str = ""):
        super().__init__(gym.make("CartPole-v1"))
        self.hold_file = hold_file
        hostname = socket.gethostname()
        Path("/tmp", f"fleetrl-probe-{hostname}").touch()
        seen = {
            "node": os.environ.get("FLEETRL_NODE_RANK"),
            "hostname": hostname,
            "time": time.time(),  # on this node's wall clock
            "pid": os.getpid(),
            "pid_namespace": os.readlink("/proc/self/ns/pid"),
            "net_namespace": os.readlink("/proc/self/ns/net"),
            "addresses": sorted(
                a.address
                for addresses in psutil.net_if_addrs().values()
                for a in addresses
                if a.family == socket.AF_INET and not a.address.startswith("127.")
            ),
            "tmp": sorted(os.listdir("/tmp")),
        }
        Path(folder, f"{seen['node']}-{os.getpid()}.json").write_text(json.dumps(seen))

    def step(self, action):
        if self.hold_file and os.path.exists(self.hold_file):
            simulate_physics(0.3)
        return super().step(action)


BROKEN_MARKER = "/tmp/fleetrl-broken-simulator"


class BrokenWhereMarked(gym.Wrapper):
    """CartPole whose import of its (pretend) native plugin fails on a machine that has
    `BROKEN_MARKER` in its /tmp: a node-specific failure that a probe on any other node misses."""

    def __init__(self):
        if os.path.exists(BROKEN_MARKER):
            raise ImportError(f"libsimulator.so: cannot open shared object file (this machine has {BROKEN_MARKER})")
        super().__init__(gym.make("CartPole-v1"))

"""Rehearsing a multi-node cluster on one machine: simulated nodes in network, PID and mount
namespaces of their own (`cluster.simulate_isolation: namespaces`), joined over a private bridge."""

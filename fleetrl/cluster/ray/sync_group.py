"""Forming the weight-sync group from the controller (`runner.weight_sync_transport: collective`):
actor rank 0 and every rollout worker, each a Ray worker of its own (parallel/sync_group.py says
what the group is, how it binds and how its members prove the run's secret).

The controller picks the rendezvous — a free port on actor rank 0's node address as Ray knows it
(127.0.0.1 on one machine) — and each member's own node address for its connections, the backend
(NCCL where every member has a GPU of its own, else Gloo), and asks every member to join at once:
the join is each member's recorded phase `<component>.join_weight_sync`, a start-up step the
watchdog bounds, and inside it a collective of group `weight_sync join`. A member answers None once
formed, or why it could not be (unreachable or late within `actor.dist_timeout_s`, or a peer
without the secret); then every member leaves what it formed and the run syncs through Ray, saying
why. A member that raises anything else, or hangs, is an incident like any start-up step's.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from fleetrl.cluster.groups import RayGroup
from fleetrl.cluster.ray.cluster import RayCluster
from fleetrl.config.schema import Config
from fleetrl.parallel.sync_group import Formation, SyncMember, choose_backend

log = logging.getLogger("fleetrl")


def form_sync_group(cluster: RayCluster, actor: RayGroup, rollout: RayGroup, config: Config) -> bool:
    """Form the group of actor rank 0 and `rollout`'s workers; True once every member has joined
    and proven the secret, False (logged) when the run must sync through Ray."""
    members = [actor.assignments[0], *rollout.assignments]
    handles = [actor.handles[0], *rollout.handles]
    addresses = {node: cluster.node_ip(node) for node in {a.node for a in members}}
    store_address = addresses[members[0].node]
    port = actor.get(actor.handles[0].free_port.remote(store_address))
    kinds = [config.actor.device, *[config.rollout.device] * rollout.world_size]
    backend = choose_backend([((a.node, a.device), kind) for a, kind in zip(members, kinds)])
    group = Formation(store_address, port, len(members), backend, config.actor.dist_timeout_s)
    log.info(
        "weight-sync group: actor rank 0 and %d rollout worker(s), %s, rendezvous at %s:%d",
        rollout.world_size,
        backend,
        store_address,
        port,
    )
    joins = [
        handle.join_weight_sync.remote(replace(group, member=member, bind_address=addresses[a.node]))
        for member, (a, handle) in enumerate(zip(members, handles))
    ]
    reasons = [reason for reason in actor.get(joins) if reason]
    if not reasons:
        return True
    actor.get([actor.call(0, SyncMember.leave_weight_sync), *rollout.call_all(SyncMember.leave_weight_sync)])
    log.warning(
        "weights sync through Ray (runner.weight_sync_transport: collective): the weight-sync group could not "
        "be formed: %s",
        reasons[0],
    )
    return False

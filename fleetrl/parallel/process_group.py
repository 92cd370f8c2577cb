"""The actor ranks' process group: Gloo on CPU, NCCL on GPU, a rendezvous the caller names and a
timeout that is always explicit.

torch's default collective timeout is 30 minutes (10 with NCCL): a rank that dies or never arrives
freezes the others for that long. Here every wait — the rendezvous, then every collective — fails
after `timeout_s` seconds with an error instead.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from fleetrl.net import is_loopback, listening_socket, loopback_interface
from fleetrl.parallel import endpoints
from fleetrl.probe import flight_recorder, torch_trace
from fleetrl.probe.collectives import JOIN_GROUP

log = logging.getLogger("fleetrl")


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA devices, Gloo otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def rendezvous_url(master_addr: str, master_port: int) -> str:
    host = f"[{master_addr}]" if ":" in master_addr else master_addr  # IPv6 literal
    return f"tcp://{host}:{int(master_port)}"


def init_process_group(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    timeout_s: float,
    device: torch.device | str = "cpu",
    *,
    timeout_key: str = "actor.dist_timeout_s",
    narrate: Callable[[str], None] | None = None,
) -> str:
    """Join the default process group; returns the backend. All `world_size` ranks must call
    this with the same address, port and timeout; rank 0 hosts the rendezvous at
    `master_addr:master_port`, so that address must be rank 0's node (unless the environment
    has TORCHELASTIC_USE_AGENT_STORE=True: then a store hosted elsewhere is joined by every rank,
    as torch's tcp:// rendezvous does for torchelastic's agent).

    Raises JoinError (never hangs longer than `timeout_s`) when a rank does not arrive in time;
    its message names `timeout_key`, the setting that bounds the wait. `narrate`, when given,
    is told (as the debug log is) what the join waits for before it starts waiting, so a caller killed
    mid-join (the doctor's handshake rank) can say where it stalled.
    """
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if dist.is_initialized():
        raise RuntimeError("this process is already in a process group")
    device = torch.device(device)
    backend = backend_for(device)
    if backend == "gloo" and is_loopback(master_addr) and "GLOO_SOCKET_IFNAME" not in os.environ:
        # A loopback rendezvous means every rank is on this host: keep Gloo's own connections
        # on loopback too rather than whatever interface the host name resolves to.
        interface = loopback_interface()
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    kwargs = {}
    if backend == "nccl":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device  # eager NCCL init: a bad device fails here, not mid-training
    torch_trace.enable()  # torch's own flight recorder, read into the heartbeat
    url = rendezvous_url(master_addr, master_port)
    step = (
        f"joining the {backend} process group at {url} (the rendezvous, then connections to the "
        f"other {world_size - 1} rank(s); timeout {timeout_s:g} s)"
    )
    log.debug("rank %d of %d %s", rank, world_size, step)
    if narrate is not None:
        narrate(step)
    started = time.monotonic()
    timeout = datetime.timedelta(seconds=timeout_s)
    # Recorded as a collective of its own: a rank waiting here names the ranks that never came
    with flight_recorder.collective(f"join ({backend} rendezvous at {url})", group=JOIN_GROUP):
        try:
            store = rendezvous_store(url, rank, world_size, timeout)
        except Exception as error:
            raise JoinError(
                f"actor rank {rank} of {world_size} could not join the {backend} process group's rendezvous at "
                f"{url} within {time.monotonic() - started:.1f} s (timeout {timeout_s:g} s, {timeout_key}): "
                f"{str(error).rstrip('.')}. Did every rank start, and can each reach "
                f"{master_addr}:{master_port} (rank 0's node)?"
            ) from error
        store.set_timeout(timeout)
        own = endpoints.this_endpoint(rank, backend)
        endpoints.publish(store, own)
        try:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
        except Exception as error:
            raise JoinError(
                f"{own} could not connect to its peers after the {backend} rendezvous at {url}, within "
                f"{time.monotonic() - started:.1f} s (timeout {timeout_s:g} s, {timeout_key}): "
                f"{str(error).rstrip('.')}. {describe_peers(store, rank, world_size)} Every rank connects to every "
                f"other at the address it advertises: set {own.variable} on each node to the interface of the "
                f"network between the nodes"
            ) from error
    return backend


def rendezvous_store(url: str, rank: int, world_size: int, timeout: datetime.timedelta):
    """torch's tcp:// rendezvous, but for where rank 0 hosts it: a TCPStore given a host binds
    every interface, so rank 0 listens on the rendezvous address alone (the socket made here,
    handed to the store), as every fleetrl listener does (docs/concepts/security.md)."""
    from torch.distributed.rendezvous import _torchelastic_use_agent_store

    if rank != 0 or _torchelastic_use_agent_store():
        return next(dist.rendezvous(url, rank=rank, world_size=world_size, timeout=timeout))[0]
    address, port = url.removeprefix("tcp://").rsplit(":", 1)
    listener = listening_socket(address.strip("[]"), int(port))
    return dist.TCPStore(
        address.strip("[]"),
        int(port),
        world_size,
        is_master=True,
        timeout=timeout,
        multi_tenant=True,
        master_listen_fd=listener.detach(),
    )


def describe_peers(store, rank: int, world_size: int) -> str:
    try:
        found = endpoints.peers(store, rank, world_size)
    except Exception as error:  # noqa: BLE001 — the store went with a peer: say so, keep the cause
        return f"(The other ranks' addresses are unknown: the rendezvous store failed: {error}.)"
    if not found:
        return "(No other rank had published its address.)"
    return "The other ranks advertise: " + "; ".join(map(str, found)) + "."


class JoinError(RuntimeError):
    """A rank could not join the process group in time (a peer missing or unreachable)."""


def join_process_group(
    rank: int, world_size: int, master_addr: str, master_port: int, timeout_s: float, device: torch.device
) -> bool:
    """Join the actor's process group as `rank` of `world_size`, or, where this process is in one
    already (a test driving several workers), check that it is the same rank of the same size.
    True if this call created the group (its caller destroys it)."""
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise RuntimeError(
                f"this process is rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"not actor rank {rank} of {world_size}"
            )
        return False
    init_process_group(rank, world_size, master_addr, master_port, timeout_s, device)
    return True


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

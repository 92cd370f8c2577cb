"""The weight-sync group: actor rank 0 and every rollout worker in a process group of their own, for
`runner.weight_sync_transport: collective` — a sync's bytes (parallel/sync_payload.py) broadcast
from actor rank 0 rather than handed to each rollout worker through Ray's object store.

How it is formed — as verl and RLinf form theirs, between the trainer's rank 0 and the inference
ranks — at the Ray backend's start, once the actor ranks have joined their own group
(cluster/ray/sync_group.py asks every member to `form` it, together):

- members: actor rank 0 is member 0, rollout rank r is member r + 1. It is a standalone process
  group object (torch's ProcessGroupGloo or ProcessGroupNCCL on a store of its own): the actor
  ranks' default group, and every other rank's collectives, are untouched.
- rendezvous: a TCPStore hosted by member 0 on its node's address as Ray knows it (127.0.0.1 on
  one machine), listening on that address alone (`process_group.rendezvous_store`); every member's
  Gloo connections bind its own node's address, or the interface GLOO_SOCKET_IFNAME names.
- backend: NCCL where every member computes on a CUDA device of its own, else Gloo on the CPU.
- proof: neither the store nor Gloo authenticates anybody, so before any weights move each member
  proves the run's secret (probe/seal.py) over the group itself, as the direct channels' peers do
  (cluster/exchange/peer_proof.py): member 0 broadcasts a nonce; every member answers
  HMAC(secret, "to-sender", member, nonce) and a nonce of its own (all-gather); member 0 broadcasts
  its verdict on each answer and HMAC(secret, "to-member", member, that nonce); and each member's
  verdict on member 0 is agreed by an all-reduce (MIN). A process that got into the rendezvous
  without the secret fails the formation on every member, before any payload: the run then syncs
  through Ray.
- watched: the join (rendezvous, then connections) is one collective of group `weight_sync join`;
  the proof's collectives and every broadcast are collectives of group `weight_sync` in the flight
  recorder. A member that never arrives is named by the watchdog as an actor rank behind in a
  collective is (watch/judging/alignment.py).
- timeouts: `actor.dist_timeout_s` bounds the rendezvous, the connections and every collective.
- teardown: the group lives in its members' processes and ends with them (a run's end or an
  incident ends every worker process); `close` ends it sooner (a formation that failed).
"""

from __future__ import annotations

import datetime
import hmac
import os
import secrets
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from fleetrl.parallel.process_group import rendezvous_store, rendezvous_url
from fleetrl.probe import flight_recorder
from fleetrl.probe.collectives import WEIGHT_SYNC_GROUP, WEIGHT_SYNC_JOIN
from fleetrl.probe.seal import mac

NONCE_BYTES = ANSWER_BYTES = 32
TO_SENDER, TO_MEMBER = b"fleetrl weight sync: to-sender", b"fleetrl weight sync: to-member"
TIMEOUT_KEY = "actor.dist_timeout_s"


@dataclass(frozen=True)
class Formation:
    """What one member needs to join: where member 0's store listens, the group's size and
    backend, the timeout, and this member's number and node address."""

    store_address: str  # member 0's node address: its rendezvous store listens there alone
    store_port: int
    size: int  # actor rank 0 and every rollout worker
    backend: str  # "gloo" | "nccl"
    timeout_s: float  # actor.dist_timeout_s
    member: int = 0
    bind_address: str = "127.0.0.1"  # this member's node address: its Gloo connections bind it


class SyncGroupError(RuntimeError):
    """The group could not be formed in time: a member unreachable or late, or one that did not
    prove the run's secret."""


def member_name(member: int) -> str:
    return "actor rank 0" if member == 0 else f"rollout rank {member - 1}"


def choose_backend(members: list[tuple[tuple[int, int], str]]) -> str:
    """NCCL when every member computes on a CUDA device and no two share one, else Gloo.
    `members`: each one's place (node, global device rank) and device ('cpu', 'cuda', 'cuda:1');
    NCCL refuses two ranks on one GPU."""
    places = [place for place, _ in members]
    on_gpu = all(torch.device(kind).type == "cuda" for _, kind in members)
    return "nccl" if on_gpu and len(set(places)) == len(places) else "gloo"


class SyncGroup:
    """One member's end of the formed group; `broadcast` is collective: every member calls it,
    in the same order."""

    def __init__(self, formation: Formation, device: torch.device, store, group):
        # the store is kept: on member 0 it is the rendezvous server the group's keys live in
        self.formation, self.store, self.group = formation, store, group
        # where the tensors of a collective live: the member's GPU with NCCL, else the CPU
        self.device = device if formation.backend == "nccl" else torch.device("cpu")

    @classmethod
    def form(cls, formation: Formation, secret: bytes, device: torch.device) -> SyncGroup:
        """Join, then prove the run's secret; raises SyncGroupError (never waits longer than the
        timeout for any one step)."""
        f = formation
        url = rendezvous_url(f.store_address, f.store_port)
        timeout = datetime.timedelta(seconds=f.timeout_s)
        started = time.monotonic()
        who = f"{member_name(f.member)} (member {f.member} of the {f.size}-member weight-sync group)"
        with flight_recorder.collective(f"join ({f.backend} rendezvous at {url})", group=WEIGHT_SYNC_JOIN):
            try:
                store = rendezvous_store(url, f.member, f.size, timeout)
                store.set_timeout(timeout)
                group = process_group(store, f, timeout)
            except Exception as error:
                raise SyncGroupError(
                    f"{who} could not join it at {url} within {time.monotonic() - started:.1f} s (timeout "
                    f"{f.timeout_s:g} s, {TIMEOUT_KEY}): {str(error).rstrip('.')}"
                ) from error
        joined = cls(f, device, store, group)
        try:
            joined.prove(secret)
        except SyncGroupError:
            joined.close()
            raise
        except Exception as error:  # a collective of the proof failed or timed out
            joined.close()
            raise SyncGroupError(f"{who}: the proof of the run's secret failed: {error}") from error
        return joined

    def prove(self, secret: bytes) -> None:
        """The mutual proof of the module docstring; SyncGroupError on every member unless all
        members hold `secret`."""
        member, size = self.formation.member, self.formation.size
        nonce = self.broadcast_bytes(secrets.token_bytes(NONCE_BYTES) if member == 0 else None, NONCE_BYTES)
        own_nonce = secrets.token_bytes(NONCE_BYTES)
        answers = self.all_gather_bytes(answer(secret, TO_SENDER, member, nonce) + own_nonce)
        judged = self.broadcast_bytes(judge(secret, nonce, answers) if member == 0 else None, size * (1 + ANSWER_BYTES))
        proven, replies = judged[:size], judged[size:]
        if member == 0:
            accepted = all(proven)
        else:
            reply = replies[member * ANSWER_BYTES : (member + 1) * ANSWER_BYTES]
            accepted = hmac.compare_digest(reply, answer(secret, TO_MEMBER, member, own_nonce))
        if not self.all_agree(accepted):
            refused = ", ".join(member_name(m) for m in range(size) if not proven[m])
            who = f"actor rank 0 refused {refused}" if refused else "a member refused actor rank 0's answer"
            raise SyncGroupError(
                f"a member did not prove the run's secret ({who}): a process without it reached the group's "
                "rendezvous; no weights were sent"
            )

    # ------------------------------------------------------------------- the group's collectives

    def broadcast(self, buffer: np.ndarray | None, size: int, what: str = "weights") -> np.ndarray:
        """Member 0's `buffer` (uint8, `size` bytes) on every member; the others pass None."""
        if self.formation.member == 0:
            tensor = torch.from_numpy(buffer).to(self.device)
        else:
            tensor = torch.empty(size, dtype=torch.uint8, device=self.device)
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        with flight_recorder.collective(f"broadcast ({what})", tensor, group=WEIGHT_SYNC_GROUP):
            self.group.broadcast([tensor], options).wait()
        return tensor.cpu().numpy()

    def broadcast_bytes(self, data: bytes | None, size: int) -> bytes:
        buffer = None if data is None else np.frombuffer(data, np.uint8).copy()
        return self.broadcast(buffer, size, "proof").tobytes()

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        gathered = [torch.empty_like(mine) for _ in range(self.formation.size)]
        with flight_recorder.collective("all_gather (proof)", mine, group=WEIGHT_SYNC_GROUP):
            self.group.allgather([gathered], [mine]).wait()
        return [tensor.cpu().numpy().tobytes() for tensor in gathered]

    def all_agree(self, accepted: bool) -> bool:
        flag = torch.tensor([int(accepted)], dtype=torch.int32, device=self.device)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MIN
        with flight_recorder.collective("all_reduce (proof)", flag, group=WEIGHT_SYNC_GROUP):
            self.group.allreduce([flag], options).wait()
        return bool(flag.item())

    def close(self) -> None:
        """End this member's end of the group (its connections, member 0's store)."""
        group, self.group, self.store = self.group, None, None
        if group is not None:
            group.shutdown()


def answer(secret: bytes, direction: bytes, member: int, nonce: bytes) -> bytes:
    return mac(secret, direction, member.to_bytes(4, "big"), nonce)


def judge(secret: bytes, nonce: bytes, answers: list[bytes]) -> bytes:
    """Member 0's verdict on each member's answer to `nonce` (one byte each, 1: proven), then its
    own answer to each member's nonce."""
    proven = [hmac.compare_digest(a[:ANSWER_BYTES], answer(secret, TO_SENDER, m, nonce)) for m, a in enumerate(answers)]
    return bytes(proven) + b"".join(answer(secret, TO_MEMBER, m, a[ANSWER_BYTES:]) for m, a in enumerate(answers))


def process_group(store, formation: Formation, timeout: datetime.timedelta):
    """The standalone group on `store`: Gloo bound to this member's address, or NCCL."""
    if formation.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, formation.member, formation.size, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [gloo_device(formation.bind_address)]
    return dist.ProcessGroupGloo(store, formation.member, formation.size, options)


def gloo_device(address: str):
    """Gloo's connections on GLOO_SOCKET_IFNAME's interface where it is set, else on `address`
    (the member's node address: loopback on one machine), never on every interface."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface)
    return dist.ProcessGroupGloo.create_device(hostname=address)


class SyncMember:
    """A worker's membership of the weight-sync group: actor rank 0's (ActorBase) and every rollout
    worker's (RolloutWorker). `join_weight_sync` is called on every member together."""

    sync_group: SyncGroup | None = None
    device: torch.device

    def join_weight_sync(self, formation: Formation, secret: bytes) -> str | None:
        """Join the group and prove the run's secret (parallel/sync_group.py): None once formed,
        else why it could not be (the run then syncs through Ray)."""
        try:
            self.sync_group = SyncGroup.form(formation, secret, self.device)
        except SyncGroupError as error:
            return str(error)
        return None

    def leave_weight_sync(self) -> None:
        """Leave the group (a formation that failed on another member); nothing if not in one."""
        if self.sync_group is not None:
            self.sync_group.close()
            self.sync_group = None

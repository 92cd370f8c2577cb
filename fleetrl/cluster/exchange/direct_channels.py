"""Env ⇄ rollout over direct TCP channels: the workers' end (cluster/exchange/direct.py drives it).

Each env worker listens on its node's address (never 0.0.0.0) for the one rollout worker that
serves its lanes (`layout.plan_lanes` gives an env worker's lanes to one rollout worker); each
rollout worker connects to the env workers of its lanes. Both ends prove the run's secret before
anything is unpickled (cluster/exchange/peer_proof.py): a connection that does not is closed and logged,
naming its address, and the env worker goes on waiting for its rollout worker. A message is one length-prefixed pickle
(TCP_NODELAY: an outcome leaves at once): actions one way, the env's outcome back. Both ends run
the worker's own `act`/`step` through `WorkerHost.call`, so every step is a recorded phase with
its injected faults, exactly as on the classic path; waiting on a channel is not a phase (a
rollout worker waiting for its env is idle, and the watchdog names the env that hangs).

An error ends a worker's loop and is passed along before its channels close: a `WorkerError`
(raised by this worker's call, or received from a peer) is sent to every peer, which raises it
too, so whichever failure reaches the controller first names the worker that raised. A peer that
goes without a word (its process killed, its node lost) is `ChannelLost`, naming that peer: the
controller takes it as provisional and waits, bounded, for Ray's or the watchdog's verdict.
A wait on a channel ends when the peer answers or its socket closes (its process ends); the
controller never waits on these loops without a bound (`DirectExchange.wait`).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import struct
import time
from collections.abc import Callable

from fleetrl.cluster.exchange.peer_proof import admit, prove
from fleetrl.net import listening_socket
from fleetrl.probe.recorded_calls import WorkerError

log = logging.getLogger("fleetrl")
PROOF_TIMEOUT_S = 5.0  # a connection that says nothing is refused after this long
HEADER = struct.Struct("!I")  # the pickle's length
PHASE = "env⇄rollout channel"
Identity = tuple[str, int]  # (component, rank)


class ChannelLost(WorkerError):
    """The worker at the other end of a direct channel went away without a word. It names that
    peer (the worker the fault is in), on the clock of the worker that noticed."""

    @classmethod
    def of(cls, peer: Identity, noticed_by: Identity, why: str) -> ChannelLost:
        message = f"{noticed_by[0]} rank {noticed_by[1]} lost its direct channel to {peer[0]} rank {peer[1]}: {why}"
        return cls(peer[0], peer[1], PHASE, "ConnectionLost", message, "", time.time(), noticed_by)


class Channel:
    """One connected socket to `peer`: whole pickles each way."""

    def __init__(self, sock: socket.socket, peer: Identity, owner: Identity):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        self.sock, self.peer, self.owner = sock, peer, owner

    def send(self, value) -> None:
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.sock.sendall(HEADER.pack(len(payload)) + payload)
        except OSError as error:
            raise ChannelLost.of(self.peer, self.owner, f"sending failed: {error}") from None

    def receive(self):
        """The next value; a `WorkerError` the peer passed along is raised here."""
        (size,) = HEADER.unpack(self.read(HEADER.size))
        value = pickle.loads(self.read(size))
        if isinstance(value, WorkerError):
            raise value
        return value

    def read(self, size: int) -> bytearray:
        buffer, done = bytearray(size), 0
        view = memoryview(buffer)
        while done < size:
            try:
                got = self.sock.recv_into(view[done:])
            except OSError as error:
                raise ChannelLost.of(self.peer, self.owner, f"receiving failed: {error}") from None
            if got == 0:
                raise ChannelLost.of(self.peer, self.owner, "the connection closed mid-exchange")
            done += got
        return buffer

    def close(self) -> None:
        self.sock.close()


class DirectChannels:
    """One worker's end of the direct channels; `call(method, *args)` is its `WorkerHost.call`;
    `secret` the run's, which every peer proves."""

    def __init__(self, call: Callable, identity: Identity, secret: bytes):
        self.call, self.identity, self.secret = call, identity, secret
        self.listener: socket.socket | None = None
        self.peers: dict[int, Channel] = {}  # peer rank → channel (an env worker: its one rollout worker)

    # The env worker's end.
    def listen(self, address: str | None = None) -> tuple[str, int]:
        """Listen on `address`, by default this node's (where Ray runs this worker, the address
        its peers reach it at); (address, port)."""
        if address is None:
            import ray

            address = ray.util.get_node_ip_address()
        self.listener = listening_socket(address, backlog=8)  # room for intruders beside the peer
        return address, self.listener.getsockname()[1]

    def accept(self, timeout_s: float) -> None:
        """Take the rollout worker's connection (it proves the run's secret, then says its rank);
        no longer listen. A connection that proves nothing is closed, logged, and waited past."""
        listener, self.listener = self.listener, None
        deadline = time.monotonic() + timeout_s
        refused: list[str] = []
        with listener:
            while True:
                try:
                    listener.settimeout(max(deadline - time.monotonic(), 0.001))
                    sock, (host, port, *_) = listener.accept()
                except OSError as error:
                    host, port = listener.getsockname()[:2]
                    message = f"no rollout worker connected to {host}:{port} within {timeout_s:g} s" + (
                        f" (refused, for not proving the run's secret: {', '.join(refused)})" if refused else ""
                    )
                    raise self.failed("accept", error, message) from None
                try:
                    sock.settimeout(min(max(deadline - time.monotonic(), 0.001), PROOF_TIMEOUT_S))
                    admit(sock, self.secret)
                    break
                except OSError as error:  # NotProven, a silent peer's timeout, a reset
                    sock.close()
                    refused.append(f"{host}:{port}")
                    log.warning("%s rank %d refused a connection from %s:%d: %s", *self.identity, host, port, error)
        channel = Channel(sock, ("rollout", -1), self.identity)
        rank = channel.receive()
        channel.peer = ("rollout", rank)
        self.peers[rank] = channel

    def serve(self, step: str, stages: int, steps: int) -> None:
        """Run `steps` steps of each of this env worker's `stages` lanes, in the classic order."""
        (rollout,) = self.peers.values()
        with self.passing_errors_on():
            for _ in range(steps):
                for stage in range(stages):
                    rollout.send(self.call(step, rollout.receive(), stage))

    # The rollout worker's end.
    def connect(self, envs: dict[int, tuple[str, int]], timeout_s: float) -> None:
        """Connect to each env rank of this rollout worker's lanes at (address, port)."""
        for rank, address in envs.items():
            try:
                sock = socket.create_connection(address, timeout=timeout_s)
                prove(sock, self.secret)
            except OSError as error:  # NotProven too: whoever listens there is no worker of this run
                message = f"cannot reach env rank {rank} at {address[0]}:{address[1]}: {error}"
                raise self.failed("connect", error, message) from None
            channel = Channel(sock, ("env", rank), self.identity)
            channel.send(self.identity[1])
            self.peers[rank] = channel

    def drive(self, act: str, lanes: list[tuple[int, int]], outcomes: list, steps: int) -> list:
        """Run `steps` steps of `lanes` ((lane index, env rank), in lane order) from their last
        `outcomes`: per step and lane, the lane's outcome → `act` → its env worker; while that
        env steps, the next lane infers. Returns each lane's newest outcome."""
        with self.passing_errors_on():
            for t in range(steps):
                for i, (index, env) in enumerate(lanes):
                    outcome = outcomes[i] if t == 0 else self.peers[env].receive()
                    self.peers[env].send(self.call(act, index, t, outcome))
            return [self.peers[env].receive() for _, env in lanes]

    def failed(self, operation: str, error: OSError, message: str) -> WorkerError:
        """Connecting the channels failed here: an error naming this worker, for the report."""
        component, rank = self.identity
        phase = f"{component}.{operation}"
        return WorkerError(component, rank, phase, type(error).__name__, message, "", time.time(), self.identity)

    @contextlib.contextmanager
    def passing_errors_on(self):
        """On an error, tell every peer (best effort) and close: the channels are done."""
        try:
            yield
        except WorkerError as error:
            for channel in self.peers.values():
                with contextlib.suppress(WorkerError, OSError):
                    channel.send(error)
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for channel in [*self.peers.values(), *([self.listener] if self.listener else [])]:
            channel.close()
        self.peers, self.listener = {}, None

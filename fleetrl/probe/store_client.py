"""A worker's connection to the heartbeat store, in plain Python: no torch in the process.

The store is a `torch.distributed.TCPStore` server (probe/store.py). A worker only ever sets its
heartbeat and reads its stack-request counter (`add(key, 0)`), and a torch client would make
every worker import torch first — ~1.5 s of CPU per process here, paid on the start-up path of
an env worker that otherwise never needs torch (benchmarks/scaling/ray_startup.py). So this client speaks
the store's wire protocol for those two requests itself: a validation message on connect and a
ping (the same handshake a torch client makes), then SET and ADD. Keys carry the "/" prefix
every torch client adds, so the server's own `get`/`check`/`multi_get` read them.
tests/test_heartbeat_store.py (SET) and tests/test_stack_requests.py (ADD) hold it to a real TCPStore
server.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from datetime import timedelta

CONNECT_TIMEOUT = timedelta(seconds=10)

# torch/csrc/distributed/c10d/TCPStoreBackend.hpp: the request types used here, the magic number.
VALIDATE, SET, ADD, PING = 0, 1, 4, 13
VALIDATION_MAGIC = 0x3C85F7CE
KEY_PREFIX = "/"


class StoreClient:
    """A client of the TCPStore at `host:port`; each request waits at most `timeout` (then raises
    `TimeoutError`, as a torch client raises on its own timeout)."""

    def __init__(self, host: str, port: int, timeout: timedelta = CONNECT_TIMEOUT):
        self.socket = socket.create_connection((host, port), timeout=timeout.total_seconds())
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lock = threading.Lock()  # one request on the wire at a time
        nonce = os.getpid() & 0xFFFFFFFF
        self.socket.sendall(struct.pack("=BI", VALIDATE, VALIDATION_MAGIC) + struct.pack("=BI", PING, nonce))
        (echo,) = struct.unpack("=I", self.receive(4))
        if echo != nonce:
            raise ConnectionError(f"{host}:{port} is not a TCPStore (ping answered {echo}, expected {nonce})")

    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else value
        with self.lock:
            self.socket.sendall(bytes([SET]) + packed_key(key) + struct.pack("=Q", len(data)) + data)

    def add(self, key: str, amount: int) -> int:
        """Add `amount` to the counter at `key` (0 if absent); its new value."""
        with self.lock:
            self.socket.sendall(bytes([ADD]) + packed_key(key) + struct.pack("=q", amount))
            return struct.unpack("=q", self.receive(8))[0]

    def receive(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.socket.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the heartbeat store closed the connection")
            data += chunk
        return data

    def close(self) -> None:
        self.socket.close()


def packed_key(key: str) -> bytes:
    data = (KEY_PREFIX + key).encode()
    return struct.pack("=Q", len(data)) + data

"""The run's secret, and the seal it puts on everything written into the heartbeat store.

A `torch.distributed.TCPStore` authenticates nobody: any process that reaches its port may set
any key. It listens only where the run's peers are (loopback on one machine: probe/store.py), and
every value fleetrl writes there — heartbeats, the controller's messages to its supervisor
(watch/link.py), the run's worker list, stack answers — is sealed: an HMAC-SHA256 of the key and
the value under the run's secret, hex, in front of the value. A reader opens the value with the
same secret; a value whose seal does not match (a writer without the secret, a record moved to
another worker's key) is dropped and logged, and never reaches the watchdog. What a sealer cannot
protect: a stack request is a counter (`add`), not a value — a forged one only makes a worker write
its (sealed) stacks into the store, which a process able to reach it could read anyway.

The secret is 32 random bytes made once per run by whoever starts it — the supervisor of `fleetrl
train`, or a `Trainer` watching itself — and handed down in the environment variable
`FLEETRL_RUN_SECRET` (hex) to the controller, and in each worker's `WatchSpec` (its constructor's
arguments, over Ray's own connections) to Ray workers. On disk it is only in `<run>/watch.json`,
owner-only, for `fleetrl top` and `fleetrl stack` (watch/attach.py).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets

log = logging.getLogger("fleetrl")
SECRET_VARIABLE = "FLEETRL_RUN_SECRET"
MAC_HEX = 64  # hex digits of an HMAC-SHA256


def run_secret() -> bytes:
    """This run's secret: the one this process was handed, or a new one (`new_run_secret`)."""
    handed = os.environ.get(SECRET_VARIABLE)
    return bytes.fromhex(handed) if handed else new_run_secret()


def new_run_secret() -> bytes:
    """A new secret, handed on to every process this one starts from now on (the variable)."""
    secret = secrets.token_bytes(32)
    os.environ[SECRET_VARIABLE] = secret.hex()
    return secret


def mac(secret: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of `parts` (each length-prefixed: no two splits of one byte string collide)."""
    digest = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.digest()


class Seal:
    """Seals and opens the values of one run's store with its secret."""

    def __init__(self, secret: bytes):
        self.secret = secret
        self.rejected: set[str] = set()  # keys a forged value was found under (logged once each)

    def close(self, key: str, value: str) -> bytes:
        data = value.encode()
        return mac(self.secret, key.encode(), data).hex().encode() + data

    def open(self, key: str, sealed: bytes) -> str | None:
        """The value sealed under `key`, or None (logged, once per key) when its seal is not the
        run's: written by a process without the secret, or moved from another key."""
        found, data = sealed[:MAC_HEX], sealed[MAC_HEX:]
        expected = mac(self.secret, key.encode(), data).hex().encode()
        if hmac.compare_digest(found, expected):
            return data.decode()
        if key not in self.rejected:
            self.rejected.add(key)
            log.warning(
                "rejected a value under %s in the heartbeat store: its seal is not this run's "
                "(written by a process without the run's secret); the value is ignored",
                key,
            )
        return None


class SealedStore:
    """A store (a TCPStore server or client, or a worker's `StoreClient`) whose values are sealed
    on `set` and opened on `peek`; `add` counters pass as they are."""

    def __init__(self, store, seal: Seal):
        self.store, self.seal = store, seal

    def set(self, key: str, value: str) -> None:
        self.store.set(key, self.seal.close(key, value))

    def peek(self, key: str) -> str | None:
        """The value under `key`; None when there is none, or none sealed by this run."""
        return self.seal.open(key, self.store.get(key)) if self.store.check([key]) else None

    def peek_all(self, keys: list[str]) -> list[str | None]:
        """`peek` of each key; one round trip for all of them once every key has a value."""
        if keys and self.store.check(keys):
            return [self.seal.open(key, raw) for key, raw in zip(keys, self.store.multi_get(keys))]
        return [self.peek(key) for key in keys]

    def add(self, key: str, amount: int) -> int:
        return self.store.add(key, amount)

"""A peer proves the run's secret before a byte it sends is unpickled.

The direct env ⇄ rollout channels (cluster/exchange/direct_channels.py) carry pickles, and unpickling runs
code: whoever connects first to an env worker's port must not be believed. So, as
`multiprocessing.connection` does with its `authkey`, each connection starts with an HMAC
challenge in both directions, in raw bytes: the listening end sends a random nonce, the connecting
end answers HMAC(secret, "to-listener", nonce) with a nonce of its own, and the listening end
answers that one (HMAC(secret, "to-connector", nonce)) — each end knows the other holds the run's
secret (probe/seal.py), and an answer cannot be replayed or reflected (fresh nonces, a label per
direction). Once per connection, at start-up: an exchange pays nothing for it.
"""

from __future__ import annotations

import hmac
import secrets
import socket

from fleetrl.probe.seal import mac

NONCE_BYTES = 32
ANSWER_BYTES = 32  # an HMAC-SHA256
TO_LISTENER, TO_CONNECTOR = b"fleetrl channel: to-listener", b"fleetrl channel: to-connector"


class NotProven(ConnectionError):
    """The other end did not prove the run's secret."""


def admit(sock: socket.socket, secret: bytes) -> None:
    """Listening end: challenge the peer on `sock`; NotProven (or an OSError, its socket's
    timeout included) unless it answers with the run's secret."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(nonce)
    reply = receive(sock, ANSWER_BYTES + NONCE_BYTES)
    if not hmac.compare_digest(reply[:ANSWER_BYTES], mac(secret, TO_LISTENER, nonce)):
        raise NotProven("its answer to the challenge is not made with the run's secret")
    sock.sendall(mac(secret, TO_CONNECTOR, reply[ANSWER_BYTES:]))


def prove(sock: socket.socket, secret: bytes) -> None:
    """Connecting end: answer the listener's challenge on `sock` and check that it holds the
    secret too; NotProven (or an OSError) if not."""
    challenge = receive(sock, NONCE_BYTES)
    nonce = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(mac(secret, TO_LISTENER, challenge) + nonce)
    if not hmac.compare_digest(receive(sock, ANSWER_BYTES), mac(secret, TO_CONNECTOR, nonce)):
        raise NotProven("the listener's answer is not made with the run's secret")


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise NotProven(f"it closed the connection after {len(data)} of the {size} bytes of the handshake")
        data += chunk
    return data

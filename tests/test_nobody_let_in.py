"""Nobody is let in (docs/concepts/security.md): a hostile local process that reaches fleetrl's
sockets first gets nothing run and nothing believed.

- A direct env ⇄ rollout channel: an intruder that connects before the rollout worker and sends a
  pickle whose unpickling would create a file is refused (the file never appears, its address is
  logged), and the real rollout worker still connects and exchanges.
- The heartbeat store: a record written without the run's secret, or sealed but not a heartbeat
  of the worker it is filed under, is rejected and logged; the worker's last good record stands.
- A whole inline run: it listens on loopback only, its run directory and watch.json are its
  owner's alone, `fleetrl top` reads its store with the secret from watch.json, and a forged
  heartbeat and a forged incident written into its store while it runs change nothing: it
  finishes, exit 0, with both rejections in train.log.
"""

from __future__ import annotations

import json
import logging
import stat
import subprocess
import sys
import threading
import time
from datetime import timedelta

import psutil
import pytest

from fleetrl.cluster.exchange.direct_channels import DirectChannels
from fleetrl.probe.recorded_calls import WorkerError
from fleetrl.probe.seal import Seal, SealedStore, new_run_secret
from fleetrl.probe.store import HeartbeatStore, connect_publisher
from fleetrl.probe.store_client import StoreClient
from tests.support import REPO, Fleetrl, first_iteration, fleetrl, held_cartpole, subprocess_env

INTRUDER = """
import os, pickle, socket, struct, sys

class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[3],))

data = pickle.dumps(Payload())
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
sock.sendall(struct.pack("!I", len(data)) + data)
print(sock.getsockname()[1], flush=True)
try:
    while sock.recv(4096):  # until the listener hangs up on it
        pass
except ConnectionResetError:  # it hung up with bytes of ours unread
    pass
"""


def beat(worker: tuple[str, int], n: int) -> dict:
    """A heartbeat record of `worker` with the fields the store checks."""
    component, rank = worker
    return {
        "component": component,
        "rank": rank,
        "pid": 1,
        "beat": n,
        "time": 0.0,
        "phase": None,
        "phase_started": None,
    }


def test_an_intruder_first_on_a_direct_channel_runs_nothing_and_the_rollout_worker_still_connects(tmp_path, caplog):
    secret, marker = new_run_secret(), tmp_path / "intruder-was-here"
    env = DirectChannels(print, ("env", 0), secret)
    host, port = env.listen("127.0.0.1")
    intruder = subprocess.Popen(
        [sys.executable, "-c", INTRUDER, host, str(port), str(marker)], stdout=subprocess.PIPE, text=True
    )
    try:
        intruder_port = int(intruder.stdout.readline())  # connected, its pickle sent: first in line
        accepting = threading.Thread(target=env.accept, args=(60.0,))
        with caplog.at_level(logging.WARNING, logger="fleetrl"):
            accepting.start()
            rollout = DirectChannels(print, ("rollout", 3), secret)
            rollout.connect({0: (host, port)}, 60.0)
            accepting.join(60)
        assert not accepting.is_alive()
        rollout.peers[0].send({"actions": [1, 0]})
        assert env.peers[3].receive() == {"actions": [1, 0]}  # the rollout worker's rank, then its data
        env.peers[3].send("outcome")
        assert rollout.peers[0].receive() == "outcome"
        assert intruder.wait(30) == 0  # the env worker hung up on it
    finally:
        intruder.kill()
        intruder.wait()
        env.close()
    assert not marker.exists()
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].startswith(
        f"env rank 0 refused a connection from 127.0.0.1:{intruder_port}"
    )


def test_forged_and_malformed_heartbeats_are_rejected_and_the_last_good_record_stands(caplog):
    secret = new_run_secret()
    store = HeartbeatStore("127.0.0.1", secret)
    workers = [("env", 0), ("actor", 1)]
    publish = {worker: connect_publisher("127.0.0.1", store.port, *worker, secret) for worker in workers}
    for worker in workers:
        publish[worker](json.dumps(beat(worker, 1)))
    assert store.read(workers) == {worker: beat(worker, 1) for worker in workers}

    intruder = StoreClient("127.0.0.1", store.port)  # on the wire, without the secret
    intruder.set("fleetrl/heartbeat/env/0", json.dumps(beat(("env", 0), 99)).encode())
    wrong_secret = SealedStore(StoreClient("127.0.0.1", store.port), Seal(b"not the run's secret"))
    wrong_secret.set("fleetrl/heartbeat/env/0", json.dumps(beat(("env", 0), 98)))
    publish[("actor", 1)](json.dumps({**beat(("actor", 1), 2), "beat": "two"}))  # sealed, but a wrong type
    with caplog.at_level(logging.WARNING, logger="fleetrl"):
        read = store.read(workers)
        rejected = read[("actor", 1)].pop("rejected")  # counted: its own records, sealed but malformed
        assert read == {worker: beat(worker, 1) for worker in workers}
        assert (rejected["records"], rejected["reason"]) == (1, 'its beat is "two", not an integer')
        publish[("actor", 1)](json.dumps(beat(("env", 0), 3)))  # another worker's record under its key
        read = store.read(workers)
        rejected = read[("actor", 1)].pop("rejected")
        assert read == {worker: beat(worker, 1) for worker in workers}
        assert (rejected["records"], rejected["reason"]) == (2, "it is filed under actor rank 1 but names env rank 0")
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("rejected a value under fleetrl/heartbeat/env/0") for m in messages), messages
    assert any(m.startswith("rejected a malformed heartbeat record of actor rank 1") for m in messages), messages

    publish[("env", 0)](json.dumps(beat(("env", 0), 2)))  # the worker's next beat is read again
    assert store.read([("env", 0)]) == {("env", 0): beat(("env", 0), 2)}
    publish[("actor", 1)](json.dumps(beat(("actor", 1), 4)))  # a good record again: the count is over
    assert store.read([("actor", 1)]) == {("actor", 1): beat(("actor", 1), 4)}


def listening_addresses(root: psutil.Process) -> set[str]:
    """The addresses that `root` and its descendants listen on (TCP)."""
    found = set()
    for process in [root, *root.children(recursive=True)]:
        try:
            found |= {c.laddr.ip for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:  # it ended meanwhile
            pass
    return found


def test_an_inline_run_listens_on_loopback_keeps_its_secret_and_shrugs_off_forged_records(tmp_path):
    from torch.distributed import TCPStore

    hold, runs = tmp_path / "hold", tmp_path / "runs"
    hold.touch()  # each env step takes 0.3 s while it exists
    # 1000 steps: 300 s while held, the test looks and forges meanwhile
    command = held_cartpole(runs, hold, "cluster.backend=inline", "runner.total_env_steps=1000")
    with Fleetrl(*command, runs=runs) as running:
        run_dir = first_iteration(runs, running)
        watch_file = run_dir / "watch.json"
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(watch_file.stat().st_mode) == 0o600
        where = json.loads(watch_file.read_text())
        assert where["host"] == "127.0.0.1" and len(bytes.fromhex(where["secret"])) == 32
        assert listening_addresses(psutil.Process(running.process.pid)) <= {"127.0.0.1", "::1"}

        top = fleetrl("top", str(run_dir), timeout=120)
        assert top.code == 0 and any(line.split()[:2] == ["inline", "0"] for line in top.stdout.splitlines()), top

        intruder = TCPStore(where["host"], where["port"], is_master=False, timeout=timedelta(seconds=10))
        forged = {**beat(("inline", 0), 10**6), "phase": "collect_and_train", "phase_started": 0.0}
        incident = {"cause": "worker_died", "summary": "forged", "started": 0.0, "detail": None}
        forgeries = {
            "fleetrl/heartbeat/inline/0": json.dumps(forged),
            "fleetrl/link/failure": json.dumps(incident | {"culprit": ["env", 0], "clock": None, "host": None}),
        }
        wanted = {f"rejected a value under {key}": key for key in forgeries}
        # The run's own heartbeat thread writes the heartbeat key too, and can overwrite a forgery
        # before the supervisor's next poll reads it (seen: 1 run in 3). The intruder forges again
        # until each rejection is logged, as a real one would; the run is held till then.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            log = (run_dir / "train.log").read_text()
            missing = [key for line, key in wanted.items() if line not in log]
            if not missing:
                break
            for key in missing:
                intruder.set(key, forgeries[key])
            time.sleep(0.5)
        hold.unlink()  # quick from here
        result = running.finish(timeout=240).succeeded()
    log = (result.run_dir / "train.log").read_text()
    for rejection in wanted:
        assert rejection in log, log[-3000:]
    assert not (result.run_dir / "watch.json").exists()


def test_a_hostile_listener_is_not_sent_anything_by_a_rollout_worker(tmp_path):
    """The other direction: a rollout worker reaching a listener that does not hold the run's
    secret (something else took the port) fails to connect, naming the env rank and address."""
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True, cwd=REPO, env=subprocess_env()
    )
    try:
        port = int(listener.stdout.readline())
        rollout = DirectChannels(print, ("rollout", 0), new_run_secret())
        with pytest.raises(WorkerError) as caught:
            rollout.connect({2: ("127.0.0.1", port)}, 30.0)
        expected = f"rollout rank 0 raised NotProven in rollout.connect: cannot reach env rank 2 at 127.0.0.1:{port}"
        assert str(caught.value).startswith(expected), caught.value
    finally:
        listener.kill()
        listener.wait()


LISTENER = """
import os, socket
from fleetrl.cluster.exchange.peer_proof import admit
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
sock, _ = listener.accept()
admit(sock, os.urandom(32))
"""

"""Nothing of a run outlives it, even when `fleetrl train` itself is killed with SIGKILL.

`start_janitor` marks the run: it puts a fresh run token (`FLEETRL_RUN_TOKEN`) into this
process's environment before anything starts, so every process of the run inherits it — Ray's
GCS, raylets and agents, and the workers the raylets spawn (they start from the driver's
environment) — and `SPT_NOENV=1`, so that Ray's agents, which rewrite their process title, keep
their environment readable in /proc. Then it starts the janitor: `python -m
fleetrl.supervise.janitor TOKEN`, a tiny process in a session of its own (no signal meant for the
run's process group reaches it; nothing heavy imported), which blocks on its parent's pidfd until
the parent ends, then SIGKILLs every process carrying the token, waits for them, removes Ray's
`ray_current_cluster` where it names a Ray session of this run (and only then: the next plain
`ray.init()` would try to join a dead cluster), and exits. After a normal exit it finds nothing
and exits quietly. The supervisor keeps it alive (`Janitor.keep_alive`): a janitor that ended
before the run did is started again.

`processes_of_run(token)` is the run's process set for anyone else tearing it down.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

RUN_TOKEN = "FLEETRL_RUN_TOKEN"
KILL_ROUNDS = 3  # a raylet may spawn a worker between a scan and the kill: scan again
GRACE_S = 1.0  # for processes already on their way out after a normal exit
SESSION_DIR = re.compile(r"(/[^\s=:]*/session_\d{4}-[0-9_-]+?_\d+)(?:/|$|\s)")  # Ray's, named <time>_<pid>


def start_janitor() -> Janitor:
    """Mark this process's environment with a new run token and start the janitor watching this
    process. Call before anything of the run starts."""
    token = uuid.uuid4().hex
    os.environ[RUN_TOKEN] = token
    os.environ["SPT_NOENV"] = "1"  # setproctitle (Ray's agents) leaves /proc/<pid>/environ readable
    return Janitor(token)


class Janitor:
    """The run's janitor process, kept alive by the supervisor: whoever ends it — a user, the OOM
    killer, or the run's own teardown (which ends every child of the supervisor) before a restart —
    `keep_alive` starts another, so that a `kill -9` of `fleetrl train` at any later moment still
    leaves nothing."""

    def __init__(self, token: str):
        self.token = token
        self.process = self.spawn()

    def spawn(self) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "fleetrl.supervise.janitor", self.token, str(os.getpid())],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )

    def keep_alive(self, warn: bool = True) -> None:
        """Start another janitor if this one has ended; `warn`: say so (not after a teardown of
        the supervisor's own, which ends it on purpose)."""
        code = self.process.poll()
        if code is None:
            return
        ended = self.process.pid
        self.process = self.spawn()
        if warn:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            print(
                f"fleetrl: the run's janitor (pid {ended}) ended ({how}): started another (pid {self.process.pid})",
                file=sys.stderr,
                flush=True,
            )


def processes_of_run(token: str) -> list[psutil.Process]:
    """Every live process (but this one) whose environment carries run token `token`."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(RUN_TOKEN) == token:
                found.append(process)
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to read
            continue
    return found


def ray_sessions(processes: list[psutil.Process], starter_pid: int) -> set[Path]:
    """Ray session directories of these processes (named in their command lines or open files),
    and those that `starter_pid` started (Ray names a session after the pid that starts it)."""
    sessions = set()
    for process in processes:
        try:
            texts = [" ".join(process.cmdline()), *(f.path for f in process.open_files())]
        except (psutil.Error, OSError):
            continue
        for text in texts:
            sessions.update(Path(match[1]) for match in SESSION_DIR.finditer(text + " "))
    ray_temp = Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") / "ray"
    sessions.update(ray_temp.glob(f"session_*_{starter_pid}"))
    return sessions


def gcs_address_ports(session: Path) -> set[str]:
    """The GCS ports a Ray session's nodes recorded (`gcs_server_port_<node id>` files)."""
    ports = set()
    for path in session.glob("gcs_server_port_*"):
        try:
            ports.add(path.read_text().strip())
        except OSError:
            continue
    return ports


def forget_ray_address(sessions: set[Path]) -> Path | None:
    """Remove `ray_current_cluster` beside each session when it names that session's GCS;
    returns the file removed, if any."""
    for session in sessions:
        address_file = session.parent / "ray_current_cluster"
        try:
            port = address_file.read_text().strip().rpartition(":")[2]
        except OSError:
            continue
        if port in gcs_address_ports(session):
            address_file.unlink(missing_ok=True)
            return address_file
    return None


def kill_run(token: str, starter_pid: int) -> tuple[list[str], Path | None]:
    """SIGKILL every process of the run and reap it; then forget its Ray address. Returns a
    description of each process killed and the address file removed."""
    killed: list[str] = []
    sessions: set[Path] = set()
    for _ in range(KILL_ROUNDS):
        victims = processes_of_run(token)
        sessions |= ray_sessions(victims, starter_pid)
        victims = still_running(victims, GRACE_S)
        if not victims:
            break
        for process in victims:
            try:
                killed.append(f"{process.pid} {process.name()}")
                process.kill()
            except psutil.Error:
                continue
        still_running(victims, 5.0)
    return killed, forget_ray_address(sessions)


def still_running(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of `processes` still running after up to `timeout_s` (a zombie has ended: whoever
    adopted it reaps it, which may be never where PID 1 does not reap)."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = [p for p in processes if is_running(p)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.05)


def is_running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for_exit(pid: int) -> None:
    """Block until process `pid` has ended, without polling (a pidfd becomes readable then)."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    poller = select.poll()
    poller.register(descriptor, select.POLLIN)
    while not poller.poll():
        pass
    os.close(descriptor)


def main(token: str, watched: int) -> None:
    if os.getppid() == watched:  # otherwise `fleetrl train` is gone already (we were adopted)
        wait_for_exit(watched)
    killed, address_file = kill_run(token, watched)
    if killed or address_file:
        print(
            f"fleetrl: {len(killed)} process(es) of the run outlived `fleetrl train` (pid {watched}); "
            f"killed: {', '.join(killed) or 'none'}"
            + (f"; removed {address_file}, which named the run's dead Ray cluster" if address_file else ""),
            file=sys.stderr,
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

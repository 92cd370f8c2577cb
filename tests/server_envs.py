"""Simulators that run a server process of their own and wait for it, as Isaac Sim launches Kit, a
Unity build its player, a lab simulator its physics server: `tests/sim_server.py`, started in the
simulator's constructor by `subprocess.Popen` (`how: popen`), `os.fork` and exec (`fork`), a shell
(`shell`: `sh -c`), or daemonised (`daemon`: a double fork with `setsid` between, its first child
exiting at once). The simulator blocks on the server's pipe until it answers `ready` — after
`compute_s` CPU seconds of start-up, or never (`answer: false`). `idle` lists more servers, by how
they are started, that answer at once and then idle (the ones a teardown must not forget). One set
of servers per process (not per sub-env of a vector env). Each server's pid goes into `pid_dir`,
where a test looks for survivors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gymnasium.envs.classic_control.cartpole import CartPoleEnv

SERVER = str(Path(__file__).with_name("sim_server.py"))


class ServerSimulator(CartPoleEnv):
    started_in_this_process = False

    def __init__(
        self,
        pid_dir: str,
        how: str = "popen",
        compute_s: float = 0.0,
        answer: bool = True,
        idle: tuple[str, ...] = (),
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not ServerSimulator.started_in_this_process:
            ServerSimulator.started_in_this_process = True
            for other in idle:
                self.wait_until_ready(START[other]([sys.executable, SERVER, pid_dir, "0", "answer"]))
            command = [sys.executable, SERVER, pid_dir, str(compute_s), "answer" if answer else "never"]
            self.wait_until_ready(START[how](command))

    @staticmethod
    def wait_until_ready(pipe: int) -> None:
        with os.fdopen(pipe, "rb") as reading:
            if reading.readline() != b"ready\n":
                raise RuntimeError("the simulator's server ended before it was ready")


def popen(command: list[str]) -> int:
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    return os.dup(server.stdout.fileno())


def shell(command: list[str]) -> int:
    server = subprocess.Popen(["sh", "-c", " ".join(command)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    return os.dup(server.stdout.fileno())


def fork(command: list[str]) -> int:
    read, write = os.pipe()
    if os.fork() == 0:
        os.dup2(write, 1)
        os.execv(command[0], command)
    os.close(write)
    return read


def daemon(command: list[str]) -> int:
    """A double fork: the first child starts a session of its own, forks the server and exits at
    once, so the server's parent is gone — re-parented to init, or to a subreaper above it."""
    read, write = os.pipe()
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            os.dup2(write, 1)
            os.execv(command[0], command)
        os._exit(0)
    os.waitpid(first, 0)
    os.close(write)
    return read


START = {"popen": popen, "shell": shell, "fork": fork, "daemon": daemon}

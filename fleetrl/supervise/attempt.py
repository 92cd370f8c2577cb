"""One controller process of a supervised run, from spawn to exit (supervise/supervisor.py starts one
per attempt): the process, its orders, the stop on a signal and the teardown of everything it
started. Watching it — a heartbeat store, a watchdog on the controller from its first instant and
on the workers it publishes, the incident response — is its `ControllerWatch`
(watch/supervision.py), the supervisor's one view of fleetrl.watch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from fleetrl import exit_codes
from fleetrl.checkpoint import list_checkpoints, newest_intact
from fleetrl.cluster.isolation.bridge import bridge_name, remove_bridge
from fleetrl.cluster.isolation.nodes import sweep_stale
from fleetrl.config.schema import Config
from fleetrl.controller.orders import Orders
from fleetrl.supervise.store_address import store_address
from fleetrl.teardown import kill_own_children
from fleetrl.watch.supervision import POLL_S, ControllerWatch, Incident

log = logging.getLogger("fleetrl")
RUN_MARK = "FLEETRL_SUPERVISOR_PID"  # in the environment of every process of the run


def kill_run_tree(config: Config, controller_pid: int | None = None) -> None:
    """Every process the run started; with an isolated simulation also its namespaces, links and
    folder, which outlive the processes killed, and the bridge built for controller
    `controller_pid` (supervise/store_address.py), which the controller never removes: its store
    listens there. Both the end of an attempt and a second Ctrl-C."""
    kill_own_children()
    if config.cluster.simulate_isolation == "namespaces":
        if controller_pid is not None:
            remove_bridge(bridge_name(controller_pid))  # gone with the attempt, not a leftover to sweep
        sweep_stale()


class Attempt:
    """One controller process from spawn to exit, watched; `run` returns (exit code, the
    incident that ended it or None)."""

    def __init__(self, supervisor, restart: dict | None):  # a supervise.supervisor.Supervisor
        self.supervisor, self.config, self.run_dir = supervisor, supervisor.config, supervisor.run_dir
        supervisor.janitor.keep_alive(warn=False)  # the last attempt's teardown ended it with the rest
        # Started first, it waits for its orders on stdin: where the store listens may be named
        # for it (an isolated simulation's bridge: supervise/store_address.py).
        self.controller = subprocess.Popen(
            [sys.executable, "-m", "fleetrl.controller"],
            stdin=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, RUN_MARK: str(os.getpid())},
        )
        try:
            host = store_address(self.config.cluster, supervisor.component == "inline", self.controller.pid)
            self.watch = ControllerWatch(
                self.config,
                self.run_dir,
                self.controller,
                supervisor.component,
                host,
                supervisor.secret,
                end_processes=lambda: kill_run_tree(self.config, self.controller.pid),
            )
        except BaseException:
            self.controller.kill()
            self.controller.wait()
            kill_run_tree(self.config, self.controller.pid)
            raise
        resume = (
            str(self.run_dir) if list_checkpoints(self.run_dir) and (restart or self.config.runner.resume) else None
        )
        plan = replace(supervisor.plan, config=replace(self.config, runner=replace(self.config.runner, resume=resume)))
        orders = Orders(
            plan, str(self.run_dir), host, self.watch.store.port, supervisor.component, os.getpid(), restart
        )
        # A controller killed at start-up, before it read its orders: `run` reports its death
        with contextlib.suppress(BrokenPipeError):
            self.controller.stdin.write(pickle.dumps(orders))
        with contextlib.suppress(BrokenPipeError):
            self.controller.stdin.close()

    def run(self) -> tuple[int, Incident | None]:
        try:
            while True:
                self.supervisor.janitor.keep_alive()
                if self.supervisor.signals:
                    return self.stop(self.supervisor.signals[0]), None
                code = self.controller.poll()
                if code in (exit_codes.OK, exit_codes.USER_ERROR):
                    return code, None
                incident = self.watch.next_incident(code)
                if incident is not None:
                    return self.watch.respond(incident), incident
                time.sleep(POLL_S)
        finally:
            self.watch.stop()
            kill_run_tree(self.config, self.controller.pid)

    def stop(self, signum: int) -> int:
        """The first stop signal: the controller checkpoints and stops within the grace, or is
        reported (`interrupted`, naming who was stuck where) and killed."""
        code, grace = exit_codes.stopped_by(signum), self.config.watchdog.stop_grace_s
        with_signal = signal.Signals(signum).name
        print(
            f"fleetrl: {with_signal}: asking the controller to checkpoint and stop (within {grace:g} s)",
            file=sys.stderr,
        )
        self.controller.send_signal(signum)
        asked_at, deadline, seen = time.time(), time.monotonic() + grace, None
        while time.monotonic() < deadline and self.controller.poll() is None and seen is None:
            self.watch.follow_controller()
            seen = self.watch.watchdog_incident()
            time.sleep(POLL_S)
        if self.controller.poll() is None:
            self.watch.respond(self.watch.interrupted(with_signal, grace, seen, asked_at), code)
        print(closing_message(self.run_dir, code), file=sys.stderr)
        return code


def closing_message(run_dir: Path, code: int) -> str:
    checkpoint = newest_intact(run_dir)
    kept = f"the newest intact checkpoint is {checkpoint}" if checkpoint else "there is no checkpoint (none was saved)"
    return f"fleetrl: stopped by {exit_codes.stop_signal(code).name}; {kept}"

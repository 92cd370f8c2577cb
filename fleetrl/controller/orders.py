"""What the supervisor tells the controller process it starts, pickled on its stdin: plain data,
and light to import (the supervisor imports no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetrl.plan.run_plan import RunPlan


@dataclass(frozen=True)
class Orders:
    """Everything the controller is told, explicitly."""

    plan: RunPlan  # resolved once, by `fleetrl train`; runner.resume names the run directory when it continues one
    run_dir: str
    store_host: str  # the supervisor's heartbeat store: where it listens (supervise/store_address.py)
    store_port: int
    component: str  # the controller's name in heartbeats and reports: 'inline' or 'controller'
    supervisor_pid: int
    restart: dict | None = None  # {number, cause, incident_at} when this controller is a restart

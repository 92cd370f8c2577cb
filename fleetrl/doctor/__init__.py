"""`fleetrl doctor`: preflight checks that catch, in seconds, what would otherwise freeze a run.

Disk space (run dir, Ray temp/spill), the address and interfaces each node advertises, TCP
reachability, a short-timeout Gloo/NCCL handshake, CUDA visibility, placement feasibility against
the live resources, and one env reset+step. Each check is a module; `registry.py` lists them.
Importing this package is cheap (no torch, no Ray): the CLI imports it at start-up.
"""

from fleetrl.doctor.command import (
    add_doctor_arguments,
    command_doctor,
    preflight,
    run_doctor,
)
from fleetrl.doctor.options import DoctorOptions
from fleetrl.doctor.registry import CHECKS, run_checks
from fleetrl.doctor.result import Check, Status

__all__ = [
    "CHECKS",
    "Check",
    "DoctorOptions",
    "Status",
    "add_doctor_arguments",
    "command_doctor",
    "preflight",
    "run_checks",
    "run_doctor",
]

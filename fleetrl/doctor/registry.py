"""Every check, in the order they run, and which of them are cheap enough for `--fast`.

`fleetrl train` runs the fast subset before it starts anything. A check that raises is itself
reported as a FAIL (a doctor that crashes must not pass a run).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from fleetrl.doctor.context import Context
from fleetrl.doctor.cuda import check_cuda
from fleetrl.doctor.disk import check_disk
from fleetrl.doctor.env_probe import check_env
from fleetrl.doctor.feasibility import check_placement
from fleetrl.doctor.handshake import check_nccl
from fleetrl.doctor.interfaces import check_network
from fleetrl.doctor.mesh import check_mesh
from fleetrl.doctor.model_folder import check_model_folder
from fleetrl.doctor.placed_handshake import check_gloo
from fleetrl.doctor.ray_join import check_ray
from fleetrl.doctor.reachability import check_reachability
from fleetrl.doctor.result import Check, failed


@dataclass(frozen=True)
class CheckSpec:
    name: str  # what `--only` selects
    run: Callable[[Context], list[Check]]
    fast: bool  # part of the preflight `fleetrl train` runs
    about: str


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec(
        "ray", check_ray, True, "join cluster.ray_address, so that the checks after it see (and run on) every node"
    ),
    CheckSpec(
        "disk",
        check_disk,
        True,
        "free space in the run directory, and Ray's temp (on every node) and spill directories",
    ),
    CheckSpec(
        "network", check_network, True, "the address this node advertises; GLOO/NCCL_SOCKET_IFNAME name real interfaces"
    ),
    CheckSpec("cuda", check_cuda, True, "the GPUs visible here against the config's devices"),
    CheckSpec(
        "placement", check_placement, True, "cluster.component_placement resolved and held against the live resources"
    ),
    CheckSpec("env", check_env, True, "one simulator built, reset and stepped, under a timeout"),
    CheckSpec(
        "model_folder",
        check_model_folder,
        True,
        "model.id hf: the folder's config.json, processor files and weight headers (no weights read)",
    ),
    CheckSpec("reachability", check_reachability, False, "TCP connections from this node to itself and to every peer"),
    CheckSpec("mesh", check_mesh, False, "TCP between every pair of nodes of the live Ray cluster"),
    CheckSpec(
        "gloo",
        check_gloo,
        False,
        "a Gloo rendezvous + all_reduce across spawned ranks (on a joined cluster: the actor's ranks on their nodes)",
    ),
    CheckSpec("nccl", check_nccl, False, "the same over NCCL, where GPUs exist"),
)
CHECK_NAMES = tuple(spec.name for spec in CHECKS)


def selected(fast: bool, only: Iterable[str] | None = None) -> list[CheckSpec]:
    wanted = set(only or ())
    unknown = wanted - set(CHECK_NAMES)
    if unknown:
        raise ValueError(f"unknown check(s) {sorted(unknown)}; the checks are {list(CHECK_NAMES)}")
    return [spec for spec in CHECKS if (spec.name in wanted if wanted else (spec.fast or not fast))]


def run_checks(
    context: Context, fast: bool, only: Iterable[str] | None = None, on_result: Callable[[Check], None] | None = None
) -> list[Check]:
    """Run the selected checks in order; `on_result` sees each result as soon as it exists."""
    results = []
    try:
        for spec in selected(fast, only):
            start = time.monotonic()
            try:
                checks = spec.run(context)
            except Exception as error:  # noqa: BLE001 — the crash itself is the finding
                checks = [
                    failed(
                        spec.name,
                        f"the {spec.name} check crashed: {type(error).__name__}: {error}",
                        "report this as a fleetrl doctor bug, with the config; run the other checks with --only",
                    )
                ]
            elapsed = time.monotonic() - start
            for check in checks:
                if not check.seconds:
                    check = replace(check, seconds=elapsed / len(checks))
                results.append(check)
                if on_result:
                    on_result(check)
    finally:
        for cleanup in reversed(context.cleanups):
            cleanup()
        context.cleanups.clear()
    return results

"""The fault matrix's cells, one source of truth for benchmarks/diagnosis/fault_matrix.py (every cell),
tests/test_fault_matrix.py (the fixed cells CI runs) and tests/test_matrix_slice.py (a slice that
moves with the tree: `rotation`).

A cell is a fault kind × where it strikes × when × on which backend. This module says how the cell's
fault is injected (its `fleetrl train` overrides) and why a cell cannot exist (`why_infeasible`);
what fleetrl must report for it — the cause, the culprit, which documented detection figure bounds
it, and in asynchronous training's hang cells the controller's wait — is data, written and reviewed
by hand in tests/fault_cells.csv (one row per feasible cell), never computed here: the oracle does
not share the product's classification. Faults in workers go through `debug.fault`
(fleetrl/debug/faults.py); the controller has no method `debug.fault` can target, so its cells are
signals the runner of the cell sends to the controller process (`signal_controller`).

Where a fault strikes, per backend: inline, every component runs in the controller's process (the
watched process is `inline rank 0`); on Ray each component rank is a process of its own; fused,
rank r of env, rollout and actor share one process (`fused rank r`); on 2 simulated nodes (Ray,
`cluster.simulate_nodes: 2`, no isolation) the rank that faults lives on node 1; async, Ray's layout
with asynchronous training (`runner.asynchronous`: the collection overlaps the update, the
controller waits in `async.*` phases of its own).

The same table with a Hugging Face VLA (`hf_cells(folder)`): the actor and rollout cells, where
the model runs, with configs/ppo_minigrid_vla.yaml's tiny LoRA model from `folder` (FSDP where
2 actor ranks have a rollout worker of their own, DDP on fused ranks), plus `hang_in_forward`: the actor rank's next forward of the model
blocks, inside the model's call.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tests.incidents import DETECTIONS, SMALL, assert_ended_in_time, promised_detection_s
from tests.support import LOADED_HOST_MARGIN_S, detection_s

NON_FINITE = ("nan_reward", "nan_obs", "nan_loss", "inf_grad")  # a simulator's NaN, a NaN loss, an exploding gradient
KINDS = ("kill", "sigstop", "gil", "hang", "exception", "extra_collective", "skip_forward", *NON_FINITE)
HF_KINDS = (*KINDS, "hang_in_forward")
HF_WHERE = ("rollout", "actor")  # where the model runs
WHERE = ("env", "rollout", "actor", "controller")
WHEN = ("startup", "first_call", "steady")
BACKENDS = ("inline", "ray", "fused", "nodes", "async")

FAULT_KIND = {"kill": "kill", "sigstop": "stop", "gil": "gil_hang", "hang": "hang", "exception": "exception"}
FAULT_KIND |= {"extra_collective": "extra_collective", "skip_forward": "skip_forward"}
FAULT_KIND |= {"hang_in_forward": "hang_in_forward"} | {kind: kind for kind in NON_FINITE}
# The method each component's fault hits, per time: a start-up step (env's first reset, the
# rollout's lanes, the actor's process-group join), its main method's first call, its 40th
# (3rd for the actor: one per iteration) once deadlines are learned.
METHOD = {
    "env": {"startup": ("reset", 1), "first_call": ("step", 1), "steady": ("step", 40)},
    "rollout": {"startup": ("configure_lanes", 1), "first_call": ("act", 1), "steady": ("act", 40)},
    "actor": {"startup": ("init_distributed", 1), "first_call": ("train", 1), "steady": ("train", 3)},
}
# A small CartPole run trained until the fault (tests/incidents.py's SMALL, without its watchdog
# change: the matrix runs with the default thresholds).
JOB = (*(o for o in SMALL if not o.startswith("watchdog.")), "runner.target_return=null")
CARTPOLE = "configs/ppo_cartpole.yaml"
VLA = "configs/ppo_minigrid_vla.yaml"
PLACEMENT = {
    "inline": (),
    "ray": (
        "cluster.backend=ray",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0}",
    ),
    "fused": (
        "cluster.backend=ray",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0-1}",
        "cluster.fuse_collocated=true",
    ),
    "nodes": (
        "cluster.backend=ray",
        "cluster.num_nodes=2",
        "cluster.simulate_nodes=2",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0-1, env: 0-1, rollout: 0}",
    ),
}
PLACEMENT["async"] = (*PLACEMENT["ray"], "runner.asynchronous=true")
COLLECTIVE = ("extra_collective", "skip_forward")
EXPECTED = Path(__file__).with_name("fault_cells.csv")


@dataclass(frozen=True)
class Cell:
    kind: str
    where: str
    when: str
    backend: str
    infeasible: str = ""  # why the cell cannot exist; "" for a real cell
    cause: str = ""  # what the report must name (tests/fault_cells.csv)
    culprit: tuple[str, int] | None = None
    promised_s: float = 0.0  # the documented detection figure for the cell (tests/incidents.py)
    controller_waits: str = ""  # the controller's async.* wait the report must show behind the culprit, if any
    overrides: tuple[str, ...] = field(default=())  # `fleetrl train` overrides, the fault included
    signal_controller: str = ""  # controller cells: "SIGKILL" or "SIGSTOP", sent by the cell's runner
    config: str = CARTPOLE  # what `fleetrl train` trains (VLA: the Hugging Face model's cells)

    @property
    def name(self) -> str:
        return cell_name(self.kind, self.where, self.when, self.backend, self.config == VLA)

    @property
    def bound_s(self) -> float:
        """How late the detection may be (`tests.support.detection_s`): the promised figure and the
        loaded host's margin."""
        return self.promised_s + LOADED_HOST_MARGIN_S


def cell_name(kind: str, where: str, when: str, backend: str, hf: bool = False) -> str:
    return f"{kind}/{where}/{when}/{backend}" + ("/hf" if hf else "")


def fault_rank(where: str, backend: str) -> int:
    """The rank the fault hits: rank 1 where there are two (the rank that is not the first to
    do anything), else 0."""
    return 0 if backend == "inline" or (where == "rollout" and backend in ("ray", "nodes", "async")) else 1


def why_infeasible(kind: str, where: str, when: str, backend: str) -> str:
    if kind == "hang_in_forward" and where != "actor":
        return "only an actor rank runs the model's training forward"
    if kind == "hang_in_forward" and when == "startup":
        return "the start-up join runs no forward"
    if kind in COLLECTIVE and where != "actor":
        return "only an actor rank makes training collectives"
    if kind in COLLECTIVE and backend == "inline":
        return "one actor rank inline: no peer to disagree with"
    if kind in COLLECTIVE and when == "startup":
        return "the start-up join makes no training collective to add or skip"
    if kind in ("nan_reward", "nan_obs") and where != "env":
        return "only a simulator returns rewards and observations"
    if kind in ("nan_loss", "inf_grad") and where != "actor":
        return "only an actor rank has a loss and gradients"
    if kind == "nan_reward" and when == "startup":
        return "the start-up reset returns no reward"
    if kind in ("nan_loss", "inf_grad") and when == "startup":
        return "no loss or gradient before the first train"
    if where == "controller" and kind not in ("kill", "sigstop"):
        return "debug.fault hits worker methods, the controller runs none (inline: see env/rollout/actor)"
    if where == "controller" and when == "first_call":
        return "a signal from outside cannot aim at the controller's first iteration"
    if where == "actor" and when == "startup" and backend == "inline":
        return "one actor rank inline: no process-group join"
    return ""


@dataclass(frozen=True)
class Expected:
    """A row of tests/fault_cells.csv: what fleetrl must report for one cell."""

    cause: str
    culprit: tuple[str, int]
    detection: str  # which documented figure bounds the detection (tests/incidents.py DETECTIONS)
    controller_waits: str = ""  # asynchronous training's hang cells: the controller's wait behind the culprit


@cache
def expectations() -> dict[str, Expected]:
    """tests/fault_cells.csv by cell name; a malformed or repeated row fails here, naming it."""
    rows: dict[str, Expected] = {}
    with EXPECTED.open() as file:
        for row in csv.DictReader(line for line in file if not line.startswith("#")):
            component, rank = row["culprit"].split()
            assert row["cell"] not in rows, f"{EXPECTED.name}: {row['cell']} has two rows"
            assert row["detection"] in DETECTIONS, f"{EXPECTED.name}: {row}"
            waits = row["waits"] or ""
            rows[row["cell"]] = Expected(row["cause"], (component, int(rank)), row["detection"], waits)
    return rows


def make_cell(kind: str, where: str, when: str, backend: str, hf_folder: str | None = None, **watchdog: float) -> Cell:
    """The cell; with `hf_folder`, training the tiny VLA of that folder (`fleetrl init-model`);
    `watchdog`: thresholds changed from the defaults (overrides added, the promise following)."""
    reason = why_infeasible(kind, where, when, backend)
    train = CARTPOLE if hf_folder is None else VLA
    if reason:
        return Cell(kind, where, when, backend, infeasible=reason, config=train)
    name = cell_name(kind, where, when, backend, hf_folder is not None)
    expected = expectations().get(name)
    assert expected is not None, f"{name}: a feasible cell without its row in {EXPECTED.name}"
    promised_s = promised_detection_s(expected.detection, **watchdog)
    rank = fault_rank(where, backend)
    overrides = (*PLACEMENT[backend], *JOB, *(f"watchdog.{key}={value}" for key, value in watchdog.items()))
    if hf_folder is not None:
        # FSDP where 2 actor ranks have a rollout of their own; fused ranks act with the actor's
        # module, which FSDP would gather at every env step: DDP there (a config rule)
        sharded = ("actor.strategy=fsdp",) if backend in ("ray", "nodes", "async") else ()
        overrides = (*overrides, f"model.path={hf_folder}", "model.lora.rank=4", *sharded)
    common = dict(
        cause=expected.cause,
        culprit=expected.culprit,
        promised_s=promised_s,
        config=train,
        controller_waits=expected.controller_waits,
    )
    if where == "controller":
        signal = "SIGKILL" if kind == "kill" else "SIGSTOP"
        return Cell(kind, where, when, backend, overrides=overrides, signal_controller=signal, **common)
    method, call = METHOD[where][when]
    fault = (
        f"debug.fault={{kind: {FAULT_KIND[kind]}, component: {where}, rank: {rank}, method: {method}, call: {call}}}"
    )
    return Cell(kind, where, when, backend, overrides=(*overrides, fault), **common)


def all_cells() -> list[Cell]:
    return [make_cell(k, w, t, b) for b in BACKENDS for t in WHEN for w in WHERE for k in KINDS]


def hf_cells(folder: str) -> list[Cell]:
    """The actor and rollout cells with the Hugging Face VLA of `folder`, `hang_in_forward` included."""
    return [make_cell(k, w, t, b, hf_folder=folder) for b in BACKENDS for t in WHEN for w in HF_WHERE for k in HF_KINDS]


def rotation(cells: list[Cell]) -> list[Cell]:
    """The order CI's slice windows are cut from (tests/test_matrix_slice.py): every cell once,
    round-robin over the (kind, backend) pairs — pair i is kind i mod 11 on backend i mod 5, 11 and
    5 coprime, with the collective kinds, which have no inline cell, on fused instead — so that
    neighbours differ in kind and in backend wherever the pairs left allow."""
    by_pair: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for cell in cells:
        by_pair[(cell.kind, cell.backend)].append(cell)
    order = []
    for i in range(len(KINDS) * len(BACKENDS)):
        pair = (KINDS[i % len(KINDS)], BACKENDS[i % len(BACKENDS)])
        order.append(pair if pair in by_pair else (pair[0], "fused"))
    queues = [list(by_pair[pair]) for pair in dict.fromkeys(order)]
    walk = []
    while any(queues):
        walk += [queue.pop(0) for queue in queues if queue]
    return walk


def select(cells: list[Cell], **wanted: str | None) -> list[Cell]:
    """The cells whose fields equal every given (non-None) value, e.g. backend='ray'."""
    return [c for c in cells if all(v is None or getattr(c, k) == v for k, v in wanted.items())]


def controller_waits_right(report: dict, cell: Cell) -> bool:
    """Where the cell claims it (`controller_waits`), the report shows the controller in that
    wait, waiting for the culprit; true where the cell claims nothing."""
    if not cell.controller_waits:
        return True
    controller = next((w for w in report.get("workers", []) if w["component"] == "controller"), {})
    return controller.get("phase") == cell.controller_waits and bool(controller.get("waits_for_culprit"))


def assert_named(result, cell: Cell) -> None:
    """`result` (tests/support.py `Finished`) is the cell's incident: exit 4, its cause and culprit,
    detected within the cell's bound, the controller's wait where the cell names one, every
    process of the run gone within the teardown promise."""
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert (report["cause"], report["culprit"]) == (cell.cause, list(cell.culprit)), report["summary"]
    assert controller_waits_right(report, cell), (cell.controller_waits, report["summary"], report["workers"])
    assert 0 <= detection_s(report) <= cell.bound_s, (
        report["detected_after_s"],
        report["watcher_absent_s"],
        cell.bound_s,
        report["summary"],
    )
    assert_ended_in_time(result)

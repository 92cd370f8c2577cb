"""The fault matrix's cells, one source of truth for benchmarks/diagnosis/fault_matrix.py (every cell) and
tests/test_fault_matrix.py (a representative few in CI) and tests/test_matrix_slice.py (a slice
that moves with every commit: `rotation`).

A cell is a fault kind × where it strikes × when × on which backend, and what fleetrl must say
about it: the cause, the culprit (as hang_report.json names it) and the bound on
`detected_after_s` that the watchdog's default thresholds promise. A cell that cannot exist says
why (`infeasible`). Faults in workers go through `debug.fault` (fleetrl/debug/faults.py); the
controller has no method `debug.fault` can target, so its cells are signals the runner of the
cell sends to the controller process (`signal_controller`).

Where a fault strikes, per backend: inline, every component runs in the controller's process (the
watched process is `inline rank 0`); on Ray each component rank is a process of its own; fused,
rank r of env, rollout and actor share one process (`fused rank r`); on 2 simulated nodes (Ray,
`cluster.simulate_nodes: 2`, no isolation) the rank that faults lives on node 1.

The same table with a Hugging Face VLA (`hf_cells(folder)`): the actor and rollout cells, where
the model runs, with configs/ppo_minigrid_vla.yaml's tiny LoRA model from `folder` (FSDP where
2 actor ranks have a rollout worker of their own, DDP on fused ranks), plus `hang_in_forward`: the actor rank's next forward of the model
blocks, inside the model's call.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from fleetrl.config.schema import WatchdogConfig
from tests.incidents import SMALL

KINDS = ("kill", "sigstop", "gil", "hang", "exception", "extra_collective", "skip_forward")
HF_KINDS = (*KINDS, "hang_in_forward")
HF_WHERE = ("rollout", "actor")  # where the model runs
WHERE = ("env", "rollout", "actor", "controller")
WHEN = ("startup", "first_call", "steady")
BACKENDS = ("inline", "ray", "fused", "nodes")

FAULT_KIND = {"kill": "kill", "sigstop": "stop", "gil": "gil_hang", "hang": "hang", "exception": "exception"}
FAULT_KIND |= {"extra_collective": "extra_collective", "skip_forward": "skip_forward"}
FAULT_KIND |= {"hang_in_forward": "hang_in_forward"}
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
MARGIN_S = 5.0  # a loaded host's scheduling and the incident response's first steps; never the bound's core
DEATHS = ("kill",)
FREEZES = ("sigstop", "gil")
COLLECTIVE = ("extra_collective", "skip_forward")


@dataclass(frozen=True)
class Cell:
    kind: str
    where: str
    when: str
    backend: str
    infeasible: str = ""  # why the cell cannot exist; "" for a real cell
    cause: str = ""
    culprit: tuple[str, int] | None = None
    bound_s: float = 0.0  # detected_after_s must not exceed it
    overrides: tuple[str, ...] = field(default=())  # `fleetrl train` overrides, the fault included
    signal_controller: str = ""  # controller cells: "SIGKILL" or "SIGSTOP", sent by the cell's runner
    config: str = CARTPOLE  # what `fleetrl train` trains (VLA: the Hugging Face model's cells)

    @property
    def name(self) -> str:
        return f"{self.kind}/{self.where}/{self.when}/{self.backend}" + ("/hf" if self.config == VLA else "")

    def with_overrides(self, *extra: str) -> Cell:
        """The same cell with `extra` overrides after its own (e.g. a shorter watchdog bound)."""
        return Cell(**{**self.__dict__, "overrides": (*self.overrides, *extra)})


def fault_rank(where: str, backend: str) -> int:
    """The rank the fault hits: rank 1 where there are two (the rank that is not the first to
    do anything), else 0."""
    return 0 if backend == "inline" or (where == "rollout" and backend in ("ray", "nodes")) else 1


def watched_culprit(where: str, backend: str, rank: int) -> tuple[str, int]:
    """The process the report must name: the one that faulted, as the watchdog knows it."""
    if where == "controller":
        return ("inline", 0) if backend == "inline" else ("controller", 0)
    return {"inline": ("inline", 0), "fused": ("fused", rank)}.get(backend, (where, rank))


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
    if where == "controller" and kind not in ("kill", "sigstop"):
        return "debug.fault hits worker methods, the controller runs none (inline: see env/rollout/actor)"
    if where == "controller" and when == "first_call":
        return "a signal from outside cannot aim at the controller's first iteration"
    if where == "actor" and when == "startup" and backend == "inline":
        return "one actor rank inline: no process-group join"
    return ""


def expected(kind: str, where: str, when: str, backend: str, config: WatchdogConfig) -> tuple[str, float]:
    """The cause fleetrl must report and the detection bound the default thresholds promise:
    deaths and exceptions 3 s; a frozen process heartbeat_timeout_s + 5; a stall or a collective
    nobody completes 10 s in steady state, 30 s on a first call (first_call_bound_s 15 s), the
    start-up step allowance + 10 s in a start-up step."""
    if kind in DEATHS:
        return "worker_died", 3.0
    if kind == "exception":
        return "worker_exception", 3.0
    if kind in FREEZES:
        return "process_frozen", config.heartbeat_timeout_s + 5
    stall_bound = {"steady": 10.0, "first_call": 30.0, "startup": config.startup_step_allowance_s + 10}[when]
    if kind == "extra_collective":
        return "collective_mismatch", stall_bound
    two_ranks_wait = where == "actor" or backend == "fused"  # a peer rank waits in a collective for it
    # At start-up only the actor's join is such a collective: the env's and rollout's start-up steps
    # are calls the controller waits for on every rank, the other rank idle meanwhile
    in_collective = when != "startup" or where == "actor"
    if kind == "skip_forward" or (two_ranks_wait and backend != "inline" and in_collective):
        return "rank_missing_from_collective", stall_bound
    startup = when == "startup" and METHOD[where]["startup"][0] in ("reset", "init_distributed")
    return ("startup_timeout" if startup else "phase_timeout"), stall_bound


def make_cell(
    kind: str, where: str, when: str, backend: str, config: WatchdogConfig | None = None, hf_folder: str | None = None
) -> Cell:
    """The cell; with `hf_folder`, training the tiny VLA of that folder (`fleetrl init-model`)."""
    config = config or WatchdogConfig()
    reason = why_infeasible(kind, where, when, backend)
    train = CARTPOLE if hf_folder is None else VLA
    if reason:
        return Cell(kind, where, when, backend, infeasible=reason, config=train)
    cause, bound = expected(kind, where, when, backend, config)
    rank = fault_rank(where, backend)
    overrides = (*PLACEMENT[backend], *JOB)
    if hf_folder is not None:
        # FSDP where 2 actor ranks have a rollout of their own; fused ranks act with the actor's
        # module, which FSDP would gather at every env step: DDP there (a config rule)
        sharded = ("actor.strategy=fsdp",) if backend in ("ray", "nodes") else ()
        overrides = (*overrides, f"model.path={hf_folder}", "model.lora.rank=4", *sharded)
    if where == "controller":
        return Cell(
            kind,
            where,
            when,
            backend,
            cause=cause,
            culprit=watched_culprit(where, backend, rank),
            bound_s=bound,
            overrides=overrides,
            signal_controller="SIGKILL" if kind == "kill" else "SIGSTOP",
            config=train,
        )
    method, call = METHOD[where][when]
    fault = (
        f"debug.fault={{kind: {FAULT_KIND[kind]}, component: {where}, rank: {rank}, method: {method}, call: {call}}}"
    )
    culprit = (where, rank) if kind == "exception" and backend != "fused" else watched_culprit(where, backend, rank)
    overrides = (*overrides, fault)
    return Cell(
        kind, where, when, backend, cause=cause, culprit=culprit, bound_s=bound, overrides=overrides, config=train
    )


def all_cells() -> list[Cell]:
    return [make_cell(k, w, t, b) for b in BACKENDS for t in WHEN for w in WHERE for k in KINDS]


def hf_cells(folder: str) -> list[Cell]:
    """The actor and rollout cells with the Hugging Face VLA of `folder`, `hang_in_forward` included."""
    return [make_cell(k, w, t, b, hf_folder=folder) for b in BACKENDS for t in WHEN for w in HF_WHERE for k in HF_KINDS]


def rotation(cells: list[Cell]) -> list[Cell]:
    """The order CI walks the matrix in (tests/test_matrix_slice.py: two cells a commit). Position
    i holds kind i mod 7 on backend i mod 4 — 7 and 4 coprime, so 28 positions visit every pair —
    with the collective kinds, which have no inline cell, on fused instead: any 8 consecutive
    positions hold every kind and every backend. Each visit of a pair takes that pair's next
    cell (its wheres and whens in turn), and the walk goes on until every cell was visited."""
    by_pair: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for cell in cells:
        by_pair[(cell.kind, cell.backend)].append(cell)
    order = []
    for i in range(len(KINDS) * len(BACKENDS)):
        pair = (KINDS[i % len(KINDS)], BACKENDS[i % len(BACKENDS)])
        order.append(pair if pair in by_pair else (pair[0], "fused"))
    visits: dict[tuple[str, str], int] = defaultdict(int)
    walk, unseen = [], set(map(id, cells))
    while unseen:
        for pair in order:
            cell = by_pair[pair][visits[pair] % len(by_pair[pair])]
            visits[pair] += 1
            unseen.discard(id(cell))
            walk.append(cell)
    return walk


def select(cells: list[Cell], **wanted: str | None) -> list[Cell]:
    """The cells whose fields equal every given (non-None) value, e.g. backend='ray'."""
    return [c for c in cells if all(v is None or getattr(c, k) == v for k, v in wanted.items())]


def assert_named(result, cell: Cell, within_s: float) -> None:
    """`result` (tests/support.py `Finished`) is the cell's incident: exit 4, its cause and culprit,
    detected within `within_s`."""
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert (report["cause"], report["culprit"]) == (cell.cause, list(cell.culprit)), report["summary"]
    assert 0 <= report["detected_after_s"] <= within_s, (report["detected_after_s"], report["summary"])

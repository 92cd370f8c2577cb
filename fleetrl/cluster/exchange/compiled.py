"""Env ⇄ rollout on Ray through a Compiled Graph: a step costs channel writes, not actor calls.

The classic exchange (`collect.QueuedCalls`) sends two Ray actor calls per lane and step through
the controller (~1.5 ms each on a loaded 2-core machine). Here the controller compiles, once, a Ray
Compiled Graph of U consecutive steps of every lane — `rollout.act(lane, t, outcome)` → `env.step(
actions, stage)` → `rollout.act(lane, t + 1, ...)` …, through the same `WorkerHost.call`, hence the
same recorded phases and injected faults — and executes it T/U times per epoch: it writes the U
step indices and each lane's last outcome to the graph's input channel and reads each lane's
outcome after the U-th step; in between, outcomes and actions go from worker to worker directly.
Each worker runs its part of the graph on a loop of its own (Ray's `_ray_system` concurrency
group), beside its heartbeat thread: a worker stuck inside a step is still seen, and named, by the
watchdog.

Same calls in the same order as the classic path (bound step by step, lanes in env rank then stage
order, which is the order each worker runs them in; the rollout's noise is drawn per call in that
order), so a run's trajectories are identical, and the stages overlap as they do there: while an
env worker steps stage i, its rollout worker infers stage i+1. U is the largest divisor of T up to
MAX_UNROLL (fewer with many lanes: every bound call is a channel of Ray's 1 MB default buffer):
feeding and reading once per step instead (U = 1) puts a barrier through the controller at every
step, where the queued actor calls it replaces never wait: the workers could not run ahead.
With 4 CartPole lanes the graph collects in 0.64× the actor calls' time on the 2-core reference
host at load 4-10, and took 1.2× their time at load 20 (`benchmarks/scaling/exchange.py`).
Resets, weight sync, the closing act, trajectories and checkpoints stay ordinary actor calls: they
run between executions, while the graph's loops wait on their channels.

`cluster.exchange: compiled` chooses it by name (cluster/exchange/choose.py says why `auto` does not).
The controller never waits on the graph without a bound: it reads each execution's outcomes on a
thread of its own (`OutcomeReader`) and gives up as soon as the watchdog reports.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading

from fleetrl.cluster.groups import Interrupted, RayGroup
from fleetrl.cluster.ray.worker_host import nothing
from fleetrl.plan.layout import Lane
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker

log = logging.getLogger("fleetrl")
# How long a graph with an execution still in flight (an incident or Ctrl-C mid-step) may take to
# tear down before its actors are killed to unblock it: a loop stuck in a worker's call cannot be
# cancelled, and Ray would wait 30 s per stuck loop before killing.
TEARDOWN_GRACE_S = 3.0
MAX_UNROLL = 8  # steps per execution
READ_SLICE_S = 0.2  # how often a wait for outcomes checks whether the watchdog has reported
MAX_BOUND_STEPS = 32  # lanes × steps per execution: each a channel (Ray's default buffer: 1 MB)


class CompiledExchange:
    """One compiled graph over the env and rollout workers of `lanes`, `unroll` steps per execution."""

    def __init__(self, env: RayGroup, rollout: RayGroup, lanes: list[Lane], interrupt: threading.Event, unroll: int):
        from ray.dag import InputNode, MultiOutputNode

        logging.getLogger("ray.dag.compiled_dag_node").setLevel(logging.WARNING)  # its teardown logs 5 INFO lines
        self.lanes, self.interrupt, self.unroll = lanes, interrupt, unroll
        act, step = rollout.wire_name(RolloutWorker.act), env.wire_name(EnvWorker.step)
        with InputNode() as inputs:  # inputs[k], k < unroll: step index; inputs[unroll + i]: lane i's outcome
            outcomes = [inputs[unroll + i] for i in range(len(lanes))]
            for k in range(unroll):
                for i, lane in enumerate(lanes):
                    actions = rollout.handles[lane.rollout_rank].call.bind(act, lane.index, inputs[k], outcomes[i])
                    outcomes[i] = env.handles[lane.env_rank].call.bind(step, actions, lane.stage)
        self.graph = MultiOutputNode(outcomes).experimental_compile()
        register_outcome_reads(self.graph)
        self.actors: list = [*env.handles, *rollout.handles]
        self.env: RayGroup = env
        self.in_flight: bool = False  # an execution was fed and its outcomes not all read yet
        self.read: OutcomeReader = OutcomeReader(interrupt)

    def run(self, pending: dict[Lane, object], steps: int) -> None:
        self.finish_earlier_calls()
        for first in range(0, steps, self.unroll):  # steps is a multiple of unroll (`unroll_for`)
            if self.interrupt.is_set():
                raise Interrupted("the watchdog raised an incident")
            self.in_flight = True
            refs = self.graph.execute(*range(first, first + self.unroll), *(pending[lane] for lane in self.lanes))
            pending.update(zip(self.lanes, self.read(refs)))
            self.in_flight = False

    def finish_earlier_calls(self) -> None:
        """Wait for the calls sent to these workers without waiting (the weight sync: the classic
        path relies on call order to run the load before the next `act`). They run on each
        actor's main thread and the graph on a thread of its own: one must not overlap a step.
        A no-op call to each worker, queued behind them, returns once they have run."""
        self.env.get([actor.__ray_call__.remote(nothing) for actor in self.actors])

    def close(self) -> None:
        """Tear the graph down before its actors go (RayCluster.shutdown runs this first). With an
        execution in flight, a worker may be stuck in a call no cancellation reaches: past
        TEARDOWN_GRACE_S its actors are killed (the run is ending them anyway), which releases
        Ray's teardown at once."""
        if self.graph is None:
            return
        graph, self.graph = self.graph, None
        if not self.in_flight:
            graph.teardown()
            return
        import ray

        teardown = threading.Thread(target=graph.teardown, name="fleetrl-graph-teardown", daemon=True)
        teardown.start()
        teardown.join(TEARDOWN_GRACE_S)
        if teardown.is_alive():
            log.warning("compiled graph still running %g s after teardown: killing its workers", TEARDOWN_GRACE_S)
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            teardown.join(TEARDOWN_GRACE_S)


class OutcomeReader:
    """Reads an execution's outcomes on a thread of its own while the caller waits in slices of
    READ_SLICE_S, as `RayGroup.get` does: the wait gives up (`Interrupted`) once the watchdog
    reports — a stuck step is its to diagnose and name — and a worker's failure (an env worker
    killed mid-step: Ray's `ActorDiedError` once the graph's monitor has closed the channels)
    is raised here as soon as the read fails, for the incident path to name the worker. A read
    cannot itself be sliced: a timed-out graph read drops the outcomes already read."""

    def __init__(self, interrupt: threading.Event):
        self.interrupt: threading.Event = interrupt
        self.reads: int = 0  # reads asked for; a result of an earlier one (given up on) is dropped
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self.serve, name="fleetrl-graph-read", daemon=True).start()

    def __call__(self, refs: list) -> list:
        self.reads += 1
        self.requests.put((self.reads, refs))
        while True:
            try:
                read, outcomes, error = self.results.get(timeout=READ_SLICE_S)
            except queue.Empty:
                if self.interrupt.is_set():
                    raise Interrupted("the watchdog raised an incident") from None
                continue
            if read != self.reads:
                continue
            if error is not None:
                raise error
            return outcomes

    def serve(self) -> None:
        """The reading thread. The arrays read are views of the graph's shared memory, valid
        until its next write (and a crash to touch once it is torn down): copied."""
        while True:
            read, refs = self.requests.get()
            try:
                self.results.put((read, [copy.deepcopy(ref.get(timeout=-1)) for ref in refs], None))
            except BaseException as error:  # handed to the waiting thread, raised there
                self.results.put((read, None, error))


def register_outcome_reads(graph) -> None:
    """Register this process as the reader of every buffer of the graph's output channels now,
    while their writers live. Ray registers each buffer on its first read, and closing a channel
    registers the rest: after a worker died on its first step, the graph's own failure monitor
    closed them, Ray could no longer find the dead writer's buffers, and its check aborted this
    process (the report named the controller, not the dead env worker)."""
    for channel in graph._dag_output_fetcher._input_channels:
        channel.ensure_registered_as_reader()


def unroll_for(steps: int, lanes: int) -> int:
    """Steps per execution: the largest divisor of `steps` up to MAX_UNROLL, and up to
    MAX_BOUND_STEPS lane-steps."""
    bound = max(1, min(MAX_UNROLL, MAX_BOUND_STEPS // lanes))
    return max(u for u in range(1, bound + 1) if steps % u == 0)

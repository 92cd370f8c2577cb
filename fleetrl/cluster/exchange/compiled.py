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

`cluster.exchange: compiled` chooses it (an error where no graph can be built); `auto`, the
default, takes the direct channels (cluster/exchange/direct.py) wherever env and rollout workers
have processes of their own. On one node too: there the graph's readers keep a core busy while
they wait on their channels (the tiny VLA's processes kept 1.99 cores busy through the graph and
1.06 direct at the same speed, on the idle 2-core reference host), a core taken from the work
beside them, and the direct channels exchange a step in 0.09 ms against the graph's 0.63
(docs/concepts/backends.md, Why `auto` chooses so). Between nodes the
graph's channels go through Ray's object transfer: on two isolated simulated nodes the seed layout
collected at 0.03× inline through them against 0.61× direct, and an env worker waiting in the
channel's read (`get_objects`, in Ray's core worker) kept its heartbeat thread from running for
5 s: a false `process_frozen` (docs/benchmarks.md, the seed layout on 2 isolated nodes).
The controller never waits on the graph without a bound: it reads each execution's outcomes on a
thread of its own (`OutcomeReader`) and gives up as soon as the watchdog reports.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
from collections.abc import Callable

from fleetrl.cluster.exchange.collect import Exchange, QueuedCalls
from fleetrl.cluster.exchange.direct import DirectExchange
from fleetrl.cluster.groups import Interrupted, RayGroup
from fleetrl.cluster.ray.worker_host import nothing
from fleetrl.errors import ConfigError
from fleetrl.plan.layout import Lane
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker

log = logging.getLogger("fleetrl")
EXCHANGE_KEY = "cluster.exchange"
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


def choose_exchange(
    mode: str, steps: int, interrupt: threading.Event, on_shutdown: Callable[[Callable[[], None]], None]
) -> Callable[[RayGroup, RayGroup, list[Lane]], Exchange]:
    """The collector's exchange factory for `cluster.exchange` = `mode` and `steps` steps per
    epoch (`auto`: the direct channels, module docstring); `on_shutdown(close)` registers the
    exchange's teardown to run before Ray ends the workers."""

    def build(env: RayGroup, rollout: RayGroup, lanes: list[Lane]) -> Exchange:
        if mode == "classic":
            log.info("env⇄rollout exchange: classic actor calls (%s: classic)", EXCHANGE_KEY)
            return QueuedCalls(env, rollout, lanes)
        if mode in ("direct", "auto"):
            direct = DirectExchange(env, rollout, lanes, interrupt)
            on_shutdown(direct.close)
            log.info("env⇄rollout exchange: direct worker-to-worker channels (%d lanes)", len(lanes))
            return direct
        try:
            exchange = CompiledExchange(env, rollout, lanes, interrupt, unroll_for(steps, len(lanes)))
        except Exception as error:
            raise ConfigError(
                EXCHANGE_KEY, mode, "'auto', 'direct' or 'classic' here", f"The compiled graph cannot be built: {error}"
            ) from error
        on_shutdown(exchange.close)
        log.info("env⇄rollout exchange: compiled graph (%d lanes, %d steps per execution)", len(lanes), exchange.unroll)
        return exchange

    return build

"""Env ⇄ rollout on Ray through a Compiled Graph: a step costs channel writes, not actor calls.

The classic exchange (`collect.QueuedCalls`) sends two Ray actor calls per lane and step through
the controller (~1.5 ms each on a loaded 2-core machine). Here the controller compiles, once, a Ray
Compiled Graph of one vector step of every lane — `rollout.act(lane, t, outcome)` → `env.step(
actions, stage)`, through the same `WorkerHost.call`, hence the same recorded phases and injected
faults — and executes it once per step: it writes the step index and each lane's last outcome to
the graph's input channel and reads the lanes' new outcomes from its output channels. Each worker
runs its part of the graph on a loop of its own (Ray's `_ray_system` concurrency group), beside
its heartbeat thread: a worker stuck inside a step is still seen, and named, by the watchdog.

Same calls in the same order as the classic path (lanes bound in env rank, then stage order; the
rollout's noise is drawn per call in that order), so a run's trajectories are identical. Within a
step the stages still overlap — while an env worker steps stage i its rollout worker infers stage
i+1 — but the controller reads every lane's outcome once per step before it feeds the next, where
the classic path queues a whole epoch ahead. Resets, weight sync, the closing act, trajectories
and checkpoints stay ordinary actor calls: they run between executions, while the graph's loops
wait on their channels.

`cluster.exchange` chooses: `classic`, `compiled` (an error where no graph can be built), or
`auto` (the graph, or the classic calls with the reason logged when it cannot be compiled).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable

from fleetrl.cluster.groups import Interrupted, RayGroup
from fleetrl.cluster.layout import Lane
from fleetrl.collect import Exchange, QueuedCalls
from fleetrl.errors import ConfigError
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker

log = logging.getLogger("fleetrl")
EXCHANGE_KEY = "cluster.exchange"
# How long a graph with an execution still in flight (an incident or Ctrl-C mid-step) may take to
# tear down before its actors are killed to unblock it: a loop stuck in a worker's call cannot be
# cancelled, and Ray would wait 30 s per stuck loop before killing.
TEARDOWN_GRACE_S = 3.0


class CompiledExchange:
    """One compiled graph over the env and rollout workers of `lanes`, executed once per step."""

    def __init__(self, env: RayGroup, rollout: RayGroup, lanes: list[Lane], interrupt: threading.Event):
        from ray.dag import InputNode, MultiOutputNode

        logging.getLogger("ray.dag.compiled_dag_node").setLevel(logging.WARNING)  # its teardown logs 5 INFO lines
        self.lanes, self.interrupt = lanes, interrupt
        act, step = rollout.wire_name(RolloutWorker.act), env.wire_name(EnvWorker.step)
        with InputNode() as inputs:  # inputs[0]: the step index; inputs[1 + i]: lane i's last outcome
            outcomes = []
            for i, lane in enumerate(lanes):
                actions = rollout.handles[lane.rollout_rank].call.bind(act, lane.index, inputs[0], inputs[1 + i])
                outcomes.append(env.handles[lane.env_rank].call.bind(step, actions, lane.stage))
        self.graph = MultiOutputNode(outcomes).experimental_compile()
        self.actors: list = [*env.handles, *rollout.handles]
        self.env: RayGroup = env
        self.in_flight: bool = False  # an execution was fed and its outcomes not all read yet

    def run(self, pending: dict[Lane, object], steps: int) -> None:
        self.finish_earlier_calls()
        for t in range(steps):
            if self.interrupt.is_set():
                raise Interrupted("the watchdog raised an incident")
            self.in_flight = True
            refs = self.graph.execute(t, *(pending[lane] for lane in self.lanes))
            # No timeout: a step takes what the simulator takes; a stuck one is the watchdog's
            # to report, and the incident response ends this process (or Ctrl-C interrupts). The
            # arrays read are views of the graph's shared memory, valid until its next write
            # (and a crash to touch once it is torn down): copied.
            for lane, ref in zip(self.lanes, refs):
                pending[lane] = copy.deepcopy(ref.get(timeout=-1))
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


def nothing(worker_host) -> None:
    """A call that does nothing (`finish_earlier_calls`)."""


def choose_exchange(
    mode: str, interrupt: threading.Event, on_shutdown: Callable[[Callable[[], None]], None]
) -> Callable[[RayGroup, RayGroup, list[Lane]], Exchange]:
    """The collector's exchange factory for `cluster.exchange` = `mode`; `on_shutdown(close)`
    registers the graph's teardown to run before Ray ends the workers."""

    def build(env: RayGroup, rollout: RayGroup, lanes: list[Lane]) -> Exchange:
        if mode == "classic":
            return classic(env, rollout, lanes, f"{EXCHANGE_KEY}: classic")
        try:
            exchange = CompiledExchange(env, rollout, lanes, interrupt)
        except Exception as error:
            if mode == "compiled":
                raise ConfigError(
                    EXCHANGE_KEY, mode, "'auto' or 'classic' here", f"The compiled graph cannot be built: {error}"
                ) from error
            return classic(env, rollout, lanes, f"the compiled graph cannot be built: {type(error).__name__}: {error}")
        on_shutdown(exchange.close)
        log.info("env⇄rollout exchange: compiled graph (%d lanes, one execution per step)", len(lanes))
        return exchange

    return build


def classic(env: RayGroup, rollout: RayGroup, lanes: list[Lane], reason: str) -> QueuedCalls:
    log.info("env⇄rollout exchange: classic actor calls (%s)", reason)
    return QueuedCalls(env, rollout, lanes)

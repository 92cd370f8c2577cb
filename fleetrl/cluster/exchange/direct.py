"""Env ⇄ rollout on Ray through direct worker-to-worker channels: a step costs one TCP round trip.

`cluster.exchange: direct`. Where the compiled graph (cluster/exchange/compiled.py) pays two
wake-ups through Ray's shared-memory channels per exchange, here a rollout worker sends a lane's
actions straight to its env worker over a socket and reads the outcome back
(cluster/exchange/direct_channels.py). Per `run(pending, steps)` the controller sends ONE ordinary actor
call to each worker — `serve` to every env worker, `drive` (with its lanes' last outcomes) to
every rollout worker — and waits for all of them; the loops inside call the workers' own `act`
and `step` through `WorkerHost.call`: the same recorded phases, faults and order as the classic
calls (lanes in env rank then stage order), hence identical trajectories, and the same overlap
(while an env worker steps lane i, its rollout worker infers lane i+1).

Being ordinary actor calls, they run on each worker's main thread in submission order: the weight
sync sent before a run has run before its first `act`, as on the classic path (the graph needs
`finish_earlier_calls` for this; nothing here does). Resets, the closing act and trajectories
stay ordinary calls between runs.

The controller waits in slices and gives up once the watchdog reports (a hung step is its to
name). A worker's exception is passed along the channels, so every failed call names the raiser;
a `ChannelLost` (a peer gone without a word: killed, its node lost) is provisional: the wait goes
on, up to VERDICT_WAIT_S, for the peer's own failure (Ray's `ActorDiedError` → `worker_died`
naming it) or the watchdog's, and only then reports the lost channel, naming the peer.
"""

from __future__ import annotations

import logging
import threading
import time

from fleetrl.cluster.exchange.direct_channels import ChannelLost
from fleetrl.cluster.groups import Interrupted, RayGroup
from fleetrl.plan.layout import Lane
from fleetrl.watch.judging.classify import worker_error
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker

log = logging.getLogger("fleetrl")
CONNECT_TIMEOUT_S = 60.0  # a rollout worker connecting to its env workers, at start-up
VERDICT_WAIT_S = 30.0  # after a lost channel: how long the peer's own failure may take to show
WAIT_SLICE_S = 0.2  # how often a wait checks whether the watchdog has reported
CLOSE_TIMEOUT_S = 5.0


class DirectExchange:
    """Direct channels between the env and rollout workers of `lanes`, connected once at start."""

    def __init__(self, env: RayGroup, rollout: RayGroup, lanes: list[Lane], interrupt: threading.Event):
        self.env, self.rollout, self.interrupt = env, rollout, interrupt
        self.step, self.act = env.wire_name(EnvWorker.step), rollout.wire_name(RolloutWorker.act)
        self.lanes_of: dict[int, list[Lane]] = {
            r: [ln for ln in lanes if ln.rollout_rank == r] for r in rollout_ranks(lanes)
        }
        self.stages_of: dict[int, int] = {e: sum(ln.env_rank == e for ln in lanes) for e in range(env.world_size)}
        self.in_flight: bool = False  # a run's loops were started and not all have finished
        self.closed: bool = False
        addresses = env.get([handle.direct.remote("listen") for handle in env.handles])
        accepting = [handle.direct.remote("accept", CONNECT_TIMEOUT_S) for handle in env.handles]
        connecting = [
            rollout.handles[r].direct.remote(
                "connect", {ln.env_rank: tuple(addresses[ln.env_rank]) for ln in own}, CONNECT_TIMEOUT_S
            )
            for r, own in self.lanes_of.items()
        ]
        env.get([*accepting, *connecting])

    def run(self, pending: dict[Lane, object], steps: int) -> None:
        if self.interrupt.is_set():
            raise Interrupted("the watchdog raised an incident")
        self.in_flight = True
        serving = [
            self.env.handles[e].direct.remote("serve", self.step, stages, steps) for e, stages in self.stages_of.items()
        ]
        driving = [
            self.rollout.handles[r].direct.remote(
                "drive", self.act, [(ln.index, ln.env_rank) for ln in own], [pending[ln] for ln in own], steps
            )
            for r, own in self.lanes_of.items()
        ]
        outcomes = self.wait([*serving, *driving])[len(serving) :]
        for own, newest in zip(self.lanes_of.values(), outcomes):
            pending.update(zip(own, newest))
        self.in_flight = False

    def wait(self, refs: list) -> list:
        """Every call's result, waiting in slices: a worker's own failure is raised at once; a
        lost channel only once the peer's verdict is in or VERDICT_WAIT_S has passed."""
        import ray

        waiting, lost, give_up_at = list(refs), None, None
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=WAIT_SLICE_S, fetch_local=False)
            if self.interrupt.is_set():
                raise Interrupted("the watchdog raised an incident")
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as error:
                    if not isinstance(worker_error(error), ChannelLost):
                        raise
                    lost = lost or error
                    give_up_at = give_up_at or time.monotonic() + VERDICT_WAIT_S
            if lost is not None and (not waiting or time.monotonic() > give_up_at):
                raise lost
        return ray.get(refs)

    def close(self) -> None:
        """Close every worker's channels (RayCluster.shutdown runs this first). With a run in
        flight the workers are being ended by the incident's teardown and their sockets with
        them: a close call would queue behind the stuck loop."""
        if self.closed or self.in_flight:
            return
        self.closed = True
        import ray

        refs = [handle.direct.remote("close") for handle in [*self.env.handles, *self.rollout.handles]]
        ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT_S)


def rollout_ranks(lanes: list[Lane]) -> list[int]:
    return sorted({lane.rollout_rank for lane in lanes})

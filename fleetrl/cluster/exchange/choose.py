"""Which env ⇄ rollout exchange a Ray run takes (`cluster.exchange`), built once the lanes are known.

`classic` takes the queued actor calls (cluster/exchange/collect.py); `compiled` the Ray Compiled
Graph (cluster/exchange/compiled.py; an error naming Ray's reason where no graph can be built);
`auto`, the default, takes the direct channels (cluster/exchange/direct.py) wherever env and rollout workers
have processes of their own. On one node too, not the graph: its readers keep a core busy while
they wait on their channels (the tiny VLA's processes kept 1.99 cores busy through the graph and
1.06 direct at the same speed, on the idle 2-core reference host), a core taken from the work
beside them, and the direct channels exchange a step in 0.09 ms against the graph's 0.63
(docs/concepts/backends.md, Why `auto` chooses so). Between nodes the
graph's channels go through Ray's object transfer: on two isolated simulated nodes the seed layout
collected at 0.03× inline through them against 0.61× direct, and an env worker waiting in the
channel's read (`get_objects`, in Ray's core worker) kept its heartbeat thread from running for
5 s: a false `process_frozen` (docs/benchmarks.md, the seed layout on 2 isolated nodes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fleetrl.cluster.exchange.collect import Exchange, QueuedCalls
from fleetrl.cluster.exchange.compiled import CompiledExchange, unroll_for
from fleetrl.cluster.exchange.direct import DirectExchange
from fleetrl.cluster.groups import RayGroup
from fleetrl.errors import ConfigError
from fleetrl.plan.layout import Lane

log = logging.getLogger("fleetrl")
EXCHANGE_KEY = "cluster.exchange"


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

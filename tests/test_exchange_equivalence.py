"""The env ⇄ rollout exchanges train alike, bit for bit (README's claim): a Ray Compiled Graph
(cluster/exchange/compiled.py), direct worker-to-worker channels (cluster/exchange/direct.py) and
the classic actor calls, on local Ray with 2 env workers in 2 pipeline stages each (4 lanes)
served by one rollout worker, real CartPole. The three runs go side by side."""

from __future__ import annotations

import torch

from fleetrl.checkpoint import load_latest
from tests.support import CLASSIC_LINE, COMPILED_LINE, DIRECT_LINE, Fleetrl
from tests.support import TIMING_METRICS as TIMING
from tests.support import four_lane_cartpole as cartpole


def test_the_compiled_graph_and_the_direct_channels_train_exactly_as_the_classic_calls(tmp_path):
    """Same seed, same calls in the same order: 4 iterations (each a weight sync and 16 steps of
    every lane) give every iteration's metrics (losses, returns, global_step) and the final
    weights bitwise equal. The direct channels are what `cluster.exchange` left at its default
    (`auto`) takes."""
    runs = {mode: tmp_path / mode for mode in ("compiled", "direct", "classic")}
    with (
        Fleetrl(*cartpole(runs["compiled"], "cluster.exchange=compiled"), runs=runs["compiled"]) as compiled,
        Fleetrl(*cartpole(runs["direct"]), runs=runs["direct"]) as direct,
        Fleetrl(*cartpole(runs["classic"], "cluster.exchange=classic"), runs=runs["classic"]) as classic,
    ):
        results = {
            "compiled": compiled.finish(timeout=600).succeeded(),
            "direct": direct.finish(timeout=600).succeeded(),
            "classic": classic.finish(timeout=600).succeeded(),
        }
    for mode, line in (("compiled", COMPILED_LINE), ("direct", DIRECT_LINE), ("classic", CLASSIC_LINE)):
        assert line in results[mode].stderr, results[mode].stderr[-3000:]
    untimed = {
        mode: [{k: v for k, v in m.items() if k not in TIMING} for m in run.metrics] for mode, run in results.items()
    }
    assert [m["global_step"] for m in untimed["classic"]] == [128, 256, 384, 512]
    weights = {mode: load_latest(run.run_dir)["actor"]["policy"] for mode, run in results.items()}
    for mode in ("compiled", "direct"):
        assert untimed[mode] == untimed["classic"], mode
        assert weights[mode].keys() == weights["classic"].keys(), mode
        assert all(torch.equal(weights[mode][name], weights["classic"][name]) for name in weights["classic"]), mode

"""What the non-finite checks cost, against the work they watch: on against off, in one process,
CPU time on one torch thread.

The promise (issue 44): the checks cost at most 1 % of an update. Measured where they weigh most,
the smallest workloads, whose per-call overheads the checks' own would show in:

* `ppo`: one `ppo_update` of RL-Zoo's CartPole set (benchmarks/compare/configs/ppo_cartpole_rlzoo.yaml:
  20 gradient steps of the 64x64 tanh MLPs, gradient clipping on): the loss terms kept, the
  gradient norms that clipping takes, one read at the end with the parameters' norms;
* `ppo_noclip`: the same with `max_grad_norm: 0`: no norms to share, the gradients not looked at
  step by step (a check of their own cost 3.5 % here: one small operator per parameter tensor);
* `sac`: 64 SAC gradient steps of configs/sac_pendulum.yaml (256x256 MLPs, no clipping) and the
  round's verification;
* `env`: 32 steps of an env worker with 8 CartPole-v1 simulators (sync), each step's rewards and
  observations checked (`env.nan_policy`), and each simulator's answers held to its declared spaces
  at every episode's end (`SyncContract`) — also against one whole iteration (the same steps plus
  the `ppo` update: an iteration of RL-Zoo's CartPole set).

"Off" is the same code with `UpdateChecks` replaced by one that does nothing (clipping computes
its own norms, as before the checks), the env worker's check of every step's values answering
"finite" without looking, and no `SyncContract`. On a host shared with other work, the difference of two long timed blocks
is lost in the load's changes; so the calls are timed in pairs, on and off one right after the
other (the order alternating), and the cost is the median of the pairs' differences against the
median call without the checks, with the quartiles. The aten operators one call dispatches, on and
off, are counted too: a figure no load blurs.

    python benchmarks/costs/non_finite_checks.py [--pairs 200] [--workloads ppo,ppo_noclip,sac,env]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kit  # noqa: E402
from update_step import rlzoo_ppo_update  # noqa: E402 - beside this script: the same update it times


class NoChecks:
    """`UpdateChecks` that checks nothing: the update as it was before the checks (which kept
    each piece's loss terms in a list and stacked them for its metrics)."""

    def __init__(self, *args, **kwargs):
        self.losses = []

    def loss(self, terms, grad_step: int) -> None:
        self.losses.append(terms)

    def loss_table(self):
        import torch

        return torch.stack(self.losses)

    def gradient_norms(self, *args) -> None:
        return None  # clipping computes its own norms

    def evidence(self):
        import torch

        return torch.zeros(2, dtype=torch.float64)

    def verify(self, *args) -> None:
        pass


def checks_off():
    """The updates' checks replaced by `NoChecks` (a context manager)."""
    stack = contextlib.ExitStack()
    for module in ("fleetrl.algos.ppo.update", "fleetrl.algos.sac.learner"):
        stack.enter_context(mock.patch(f"{module}.UpdateChecks", NoChecks))
    stack.enter_context(mock.patch("fleetrl.workers.env_worker.values_finite", lambda *values: True))
    return stack


def sac_round():
    """64 SAC gradient steps of configs/sac_pendulum.yaml and the round's verification."""
    import gymnasium as gym
    import torch

    from fleetrl.algos.sac.learner import SACBatch, SACLearner
    from fleetrl.algos.sac.networks import EntropyCoefficient, build_sac_actor, build_twin_q
    from fleetrl.plan.load import load_config

    config = load_config(kit.ROOT / "configs/sac_pendulum.yaml")
    env = gym.make("Pendulum-v1")
    actor = build_sac_actor(config, env.observation_space, env.action_space)
    critic = build_twin_q(config, env.observation_space, env.action_space)
    learner = SACLearner(
        config, actor, critic, copy.deepcopy(critic).requires_grad_(False), EntropyCoefficient(0.2, True)
    )
    generator = torch.Generator().manual_seed(0)
    b = config.algorithm.minibatch_size
    batch = SACBatch(
        torch.randn(b, 3, generator=generator),
        torch.rand(b, 1, generator=generator) * 2 - 1,
        torch.randn(b, generator=generator),
        torch.full((b,), 0.99),
        torch.randn(b, 3, generator=generator),
        torch.randn(2, b, 1, generator=generator),
    )

    def update() -> None:
        learner.reset_stats(0, 1)
        for _ in range(64):
            learner.update(batch)
        learner.verify(torch.cat([learner.mean_stats(), learner.evidence()])[5:])

    return update


def env_steps(on: bool):
    """32 steps (RL-Zoo's CartPole rollout) of an env worker of 8 CartPole-v1 simulators (sync),
    checked or not."""
    import numpy as np

    from fleetrl.config.schema import EnvConfig
    from fleetrl.workers.env_worker import EnvWorker

    worker = EnvWorker(EnvConfig(num_envs=8), gamma=0.99, seed=0)
    if not on:
        worker.contracts = [None] * len(worker.stages)
    worker.reset()
    actions = np.random.default_rng(0).integers(0, 2, (32, 8))

    def update() -> None:
        for step in actions:
            worker.step(step)

    return update


def paired_ms(on_call, off_call, pairs: int) -> list[tuple[float, float]]:
    """(on, off) CPU ms of `pairs` pairs of calls, one right after the other, the order alternating:
    a load that changes slows both calls of a pair alike, and the pairs' differences cancel it."""
    for _ in range(3):
        on_call()
        with checks_off():
            off_call()
    timed = []
    for pair in range(pairs):
        times = {}
        for on in (True, False) if pair % 2 == 0 else (False, True):
            with contextlib.nullcontext() if on else checks_off():
                start = time.thread_time()
                (on_call if on else off_call)()
                times[on] = (time.thread_time() - start) * 1e3
        timed.append((times[True], times[False]))
    return timed


def aten_ops(call) -> int:
    """The aten operators one call dispatches (torch.profiler's count: what no load can blur)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        call()
    return sum(event.count for event in profiler.key_averages() if event.key.startswith("aten::"))


def build(workload: str, on: bool):
    """The workload's call, with its checks on or (env: built) off; the updates' checks are
    turned off around the timing (`checks_off`)."""
    if workload == "ppo":
        return rlzoo_ppo_update(clip=True)
    if workload == "ppo_noclip":
        return rlzoo_ppo_update(clip=False)
    if workload == "sac":
        return sac_round()
    return env_steps(on)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200, help="(on, off) pairs of calls per workload")
    parser.add_argument("--workloads", default="ppo,ppo_noclip,sac,env")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    added: dict[str, float] = {}
    off_ms: dict[str, float] = {}
    for workload in args.workloads.split(","):
        calls = {on: build(workload, on) for on in (True, False)}
        pairs = paired_ms(calls[True], calls[False], args.pairs)
        differences = sorted(on - off for on, off in pairs)
        off_ms[workload] = statistics.median(off for _, off in pairs)
        added[workload] = statistics.median(differences)
        quartiles = statistics.quantiles(differences, n=4)
        ops = ""
        if workload != "env":
            with checks_off():
                ops_off = aten_ops(calls[False])
            ops_on = aten_ops(calls[True])
            ops = f"; aten ops per call {ops_on} on, {ops_off} off ({(ops_on - ops_off) / ops_off:+.2%})"
        print(
            f"{workload}: {off_ms[workload]:.3f} CPU ms per call without the checks; they add "
            f"{added[workload]:+.3f} ms = {added[workload] / off_ms[workload]:+.2%} (median of {args.pairs} pairs; "
            f"quartiles {quartiles[0] / off_ms[workload]:+.2%} to {quartiles[2] / off_ms[workload]:+.2%})" + ops,
            flush=True,
        )
    if "env" in added and "ppo" in added:
        iteration = off_ms["env"] + off_ms["ppo"]
        print(
            f"one iteration of RL-Zoo's CartPole set (32 env steps + the ppo update, {iteration:.1f} CPU ms): "
            f"the checks add {(added['env'] + added['ppo']) / iteration:+.2%}",
            flush=True,
        )
    print(kit.machine_line(kit.machine()))


if __name__ == "__main__":
    main()

"""CPU time of one training update, tree A against tree B, interleaved: an A/B that holds on a
loaded host (CPU time, not wall time, and alternating repetitions, so a load change hits both).

Three workloads, the first two the exact shapes of their comparison with SB3:
* ppo: one `ppo_update` of RL-Zoo's CartPole set (benchmarks/compare/configs/ppo_cartpole_rlzoo.yaml:
  8 envs x 32 steps, one minibatch of 256, 20 epochs: 20 gradient steps of the 64x64 tanh MLPs);
* sac: one SAC gradient step of configs/sac_pendulum.yaml (256x256 ReLU actor and twin critics,
  batch 256, autotuned temperature);
* grpo_kl: one actor update (`ActorWorker.train`) of the Meta-World campaign's GRPO with its KL to
  the reference policy (configs/ppo_metaworld.yaml with the overrides of
  docs/benchmarks/metaworld/commands.txt: the small transformer, 4 epochs, `algorithm.kl_coef`
  0.05), at a quarter of its batch (16 envs x 200 steps, minibatches of 800: each sample costs
  what it costs at 64 envs and 3,200) on observations drawn from the env's spaces.

Each repetition is a fresh process per tree (`PYTHONPATH=<tree>`), one torch thread, warm-up
first; it reports the median CPU ms per update over its updates, and the aten operators one
update dispatches (torch.profiler's count: what a loaded host cannot blur). The ratio B/A is taken
per repetition pair (A and B run back to back, the order alternating), reported as median and
range.

    python benchmarks/costs/update_step.py --a /tmp/main-tree --b . [--reps 5] [--workloads ppo,sac]

The child side only uses fleetrl's public pieces (config loader, Policy, ppo_update, SACLearner,
the PPO actor and `Trajectory`), so any two trees with those seams compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ppo_workload(updates: int) -> tuple[list[float], int]:
    return measure(rlzoo_ppo_update(), updates)


def rlzoo_ppo_update(clip: bool = True):
    """One `ppo_update` of RL-Zoo's CartPole set (a callable), gradient clipping on or off;
    benchmarks/costs/non_finite_checks.py times the same call."""
    import dataclasses

    import gymnasium as gym
    import torch

    from fleetrl.algos.ppo.actor import policy_optimizer
    from fleetrl.algos.ppo.update import PPOBatch, ppo_update
    from fleetrl.models.policy import Policy
    from fleetrl.parallel.sharding import EnvShard, Minibatches
    from fleetrl.parallel.wrap import local_loss_path
    from fleetrl.plan.load import load_config

    config = load_config(ROOT / "benchmarks/compare/configs/ppo_cartpole_rlzoo.yaml")
    algo = config.algorithm if clip else dataclasses.replace(config.algorithm, max_grad_norm=0.0)
    env = gym.make("CartPole-v1")
    policy = Policy.from_config(config.model, env.observation_space, env.action_space)
    optimizer = policy_optimizer(config, policy)
    steps, envs = algo.num_steps, config.env.num_envs
    size = steps * envs
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(size, 4, generator=generator)
    with torch.no_grad():
        actions, logprobs, values = policy.act(obs)
    batch = PPOBatch(obs, actions, logprobs, values, torch.randn(size, generator=generator), values + 1)
    path = local_loss_path(policy)

    def update() -> None:
        minibatches = Minibatches(EnvShard(steps, envs), algo.minibatch_size, None, generator)
        ppo_update(path, optimizer, batch, algo, algo.clip_coef, minibatches, lambda t: t)

    return update


def grpo_kl_workload(updates: int) -> tuple[list[float], int]:
    return measure(metaworld_grpo_update(), updates)


def metaworld_grpo_update():
    """One `ActorWorker.train` of the Meta-World campaign's GRPO update with the KL to its
    reference (a callable; the module docstring's grpo_kl)."""
    import tempfile

    import numpy as np
    import torch

    from fleetrl.algos.ppo.actor import ActorWorker
    from fleetrl.envs.make import env_factory
    from fleetrl.plan.load import load_config
    from fleetrl.trajectory import Trajectory

    steps, envs = 200, 16
    campaign = [  # docs/benchmarks/metaworld/commands.txt's GRPO command, at a quarter of its batch
        "algorithm.adv_type=grpo",
        "algorithm.norm_adv=false",
        f"algorithm.num_steps={steps}",
        "algorithm.critic_warmup_steps=0",
        f"env.num_envs={envs}",
        "algorithm.group_size=4",
        "algorithm.minibatch_size=800",
        "algorithm.kl_coef=0.05",
        "model.standardize_inputs=true",
    ]
    with tempfile.TemporaryDirectory() as start:  # kl_coef needs a start to stay near: this policy's own
        config = load_config(ROOT / "configs/ppo_metaworld.yaml", [*campaign, f"runner.init_from={start}"])
    env = env_factory(config.env)()
    actor = ActorWorker(config, env.observation_space, env.action_space)
    actor.load_policy_weights(actor.policy.state_dict())  # builds the reference
    env.observation_space.seed(0)
    drawn = [env.observation_space.sample() for _ in range(steps * envs)]
    obs = {key: torch.as_tensor(np.stack([o[key] for o in drawn])) for key in drawn[0]}
    with torch.no_grad():
        actions, logprobs, values = actor.policy.act(obs)
    generator = torch.Generator().manual_seed(0)
    dones = torch.zeros(steps, envs, dtype=torch.bool)
    dones[99::100] = True  # episodes of 100 steps, a group's four envs alike
    values = values.reshape(steps, envs)
    trajectory = Trajectory(
        obs={key: value.reshape(steps, envs, *value.shape[1:]) for key, value in obs.items()},
        actions=actions.reshape(steps, envs, *actions.shape[1:]),
        logprobs=logprobs.reshape(steps, envs, *logprobs.shape[1:]),
        values=values,
        rewards=(torch.rand(steps, envs, generator=generator) < 0.01).float(),
        terminated=dones.clone(),
        dones=dones,
        next_values=torch.zeros(steps, envs),
    )

    def update() -> None:
        actor.train(trajectory, 0.0)

    return update


def sac_workload(updates: int) -> tuple[list[float], int]:
    import copy

    import gymnasium as gym
    import torch

    from fleetrl.algos.sac.learner import SACBatch, SACLearner
    from fleetrl.algos.sac.networks import EntropyCoefficient, build_sac_actor, build_twin_q
    from fleetrl.plan.load import load_config

    config = load_config(ROOT / "configs/sac_pendulum.yaml")
    env = gym.make("Pendulum-v1")
    actor = build_sac_actor(config, env.observation_space, env.action_space)
    critic = build_twin_q(config, env.observation_space, env.action_space)
    target = copy.deepcopy(critic).requires_grad_(False)
    entropy = EntropyCoefficient(config.algorithm.alpha, config.algorithm.autotune)
    learner = SACLearner(config, actor, critic, target, entropy)
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
        learner.update(batch)
        if len(learner.critic_stats) >= 64:
            learner.mean_stats().tolist()
            learner.reset_stats()

    return measure(update, updates)


def measure(update, updates: int) -> tuple[list[float], int]:
    """(CPU ms of each of `updates` updates after a warm-up, aten ops dispatched by one update)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(max(3, updates // 5)):
        update()
    times = []
    for _ in range(updates):
        start = time.process_time()
        update()
        times.append((time.process_time() - start) * 1e3)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        update()
    ops = sum(event.count for event in profiler.key_averages() if event.key.startswith("aten::"))
    return times, ops


WORKLOADS = {"ppo": (ppo_workload, 60), "sac": (sac_workload, 400), "grpo_kl": (grpo_kl_workload, 3)}


def child(workload: str) -> None:
    import torch

    torch.set_num_threads(1)
    function, updates = WORKLOADS[workload]
    times, ops = function(updates)
    print(json.dumps({"ms": statistics.median(times), "ops": ops}))


def run_child(tree: Path, workload: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", workload],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, help="baseline tree (e.g. an export of main)")
    parser.add_argument("--b", type=Path, default=ROOT, help="tree under test")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workloads", default="ppo,sac")
    parser.add_argument("--child", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    for workload in args.workloads.split(","):
        a_runs, b_runs = [], []
        for rep in range(args.reps):
            order = [(args.a, a_runs), (args.b, b_runs)]
            for tree, results in order if rep % 2 == 0 else order[::-1]:
                results.append(run_child(tree.resolve(), workload))
        a_ms, b_ms = [run["ms"] for run in a_runs], [run["ms"] for run in b_runs]
        ratios = sorted(b / a for a, b in zip(a_ms, b_ms))
        print(
            f"{workload}: CPU ms per update A {statistics.median(a_ms):.3f} ({min(a_ms):.3f}-{max(a_ms):.3f}), "
            f"B {statistics.median(b_ms):.3f} ({min(b_ms):.3f}-{max(b_ms):.3f}); "
            f"B/A median {statistics.median(ratios):.3f} (pairs {ratios[0]:.3f}-{ratios[-1]:.3f}, {args.reps} reps); "
            f"aten ops per update A {a_runs[0]['ops']}, B {b_runs[0]['ops']} ({b_runs[0]['ops'] / a_runs[0]['ops']:.3f})"
        )


if __name__ == "__main__":
    main()

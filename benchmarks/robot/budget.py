"""What an RL run of configs/ppo_manipulation.yaml costs per env step on this host, and so how many
env steps a time budget buys: the env's step + render, the policy's acting forward (a batch of
`env.num_envs`), and its PPO update (forward + backward of `update_epochs` × the batch, in
minibatches), measured with the config's own env and model.

    python benchmarks/robot/budget.py --minutes 45 [dotted overrides of the config]

Prints one JSON line: milliseconds per env step of each part, the seconds one iteration takes,
and the env steps that fit into --minutes of one core.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from fleetrl.envs.make import env_factory
from fleetrl.models.policy import Policy
from fleetrl.plan.load import load_config


def seconds(fn, repeats: int) -> float:
    fn()  # warm up
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/ppo_manipulation.yaml")
    parser.add_argument("--minutes", type=float, default=45.0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    torch.set_num_threads(config.runner.torch_threads or torch.get_num_threads())
    env = env_factory(config.env)()
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    frames = [obs]

    def step() -> None:
        obs, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, 4).astype(np.float32))
        frames.append(env.reset()[0] if terminated or truncated else obs)

    env_s = seconds(step, 80)  # and 81 frames: a minibatch of real observations
    env.close()
    policy = Policy.from_config(config.model, env.observation_space, env.action_space)
    algo, envs = config.algorithm, config.env.num_envs
    batch = {key: torch.from_numpy(np.stack([f[key] for f in frames[: algo.minibatch_size]])) for key in frames[0]}
    acting = {key: value[:envs] for key, value in batch.items()}
    act_s = seconds(lambda: policy.act(acting), 20)
    actions, _, _ = policy.act(batch)

    def grad_step() -> None:
        logprobs, _, values = policy(batch, actions)
        (logprobs.sum() + values.pow(2).sum()).backward()

    grad_s = seconds(grad_step, 10)
    steps = config.batch_size  # env steps per iteration
    iteration_s = steps * env_s + algo.num_steps * act_s + algo.update_epochs * (steps // algo.minibatch_size) * grad_s
    print(
        json.dumps(
            {
                "env_step_and_render_ms": round(env_s * 1e3, 2),
                "act_ms_per_env_step": round(act_s / envs * 1e3, 2),
                "update_ms_per_env_step": round(algo.update_epochs * grad_s / algo.minibatch_size * 1e3, 2),
                "iteration_s": round(iteration_s, 2),
                "env_steps_per_s": round(steps / iteration_s, 1),
                "env_steps_in_budget": int(args.minutes * 60 * steps / iteration_s),
                "minutes": args.minutes,
                "overrides": args.overrides,
            }
        )
    )


if __name__ == "__main__":
    main()

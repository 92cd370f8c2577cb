"""One Stable-Baselines3 PPO CartPole-v1 job (runs inside benchmarks/.venvs/sb3).

Trains with RL-Zoo's tuned CartPole-v1 PPO hyperparameters (SB3 defaults otherwise), stops
as soon as the mean return of the last 100 training episodes reaches --target (or at the
schedule's total_timesteps), then evaluates the deterministic policy for --eval-episodes
episodes. Writes one JSON object to --out.

Timing: startup = process spawn (--spawn-time, the parent's time.time() at Popen) ->
just before model.learn(); that includes interpreter start, imports, env and model
construction. train = model.learn() start -> the env step at which the target was reached.
eval is timed on its own.
"""

from __future__ import annotations

import argparse
import json
import time

T_IMPORT0 = time.time()

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from sb3_stop_at_target import learn_until_target, versions  # noqa: E402 - a module beside this script
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402


class LinearFromInitial:
    """RL-Zoo's `lin_<x>`: value = progress_remaining * x (x at the start, 0 at the end)."""

    def __init__(self, initial: float):
        self.initial = initial

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.initial


def evaluate(model: PPO, episodes: int, seed: int) -> dict:
    started = time.perf_counter()
    env = gym.make("CartPole-v1")
    returns = []
    obs, _ = env.reset(seed=seed)
    total = 0.0
    while len(returns) < episodes:
        action, _ = model.predict(obs, deterministic=True)
        obs, reward, terminated, truncated, _ = env.step(int(action))
        total += float(reward)
        if terminated or truncated:
            returns.append(total)
            total = 0.0
            obs, _ = env.reset()
    env.close()
    return {
        "mean": float(np.mean(returns)),
        "std": float(np.std(returns)),
        "episodes": len(returns),
        "min": float(np.min(returns)),
        "max": float(np.max(returns)),
        "eval_s": time.perf_counter() - started,
        "deterministic": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--eval-seed", type=int, default=10_000)
    parser.add_argument("--spawn-time", type=float, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spawn = args.spawn_time if args.spawn_time is not None else T_IMPORT0

    # RL-Zoo hyperparams/ppo.yml, CartPole-v1 (normalize: false; make_vec_env = DummyVecEnv+Monitor)
    hyper = dict(
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=LinearFromInitial(1e-3),
        clip_range=LinearFromInitial(0.2),
    )
    env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed)
    model = PPO("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **hyper)

    startup_s = time.time() - spawn
    callback, train_total_s = learn_until_target(model, args.target, args.total_timesteps)

    result = {
        "library": "sb3",
        "seed": args.seed,
        "versions": versions(),
        "torch_threads": torch.get_num_threads(),
        "hyperparameters": {
            **{k: v for k, v in hyper.items() if not callable(v)},
            "learning_rate": "lin_1e-3",
            "clip_range": "lin_0.2",
            "n_envs": 8,
            "total_timesteps": args.total_timesteps,
        },
        "startup_s": startup_s,
        "target_return": args.target,
        "target_reached": callback.reached_step is not None,
        "steps_to_target": callback.reached_step,
        "train_s_to_target": callback.reached_s,
        "last100_at_target": callback.reached_mean,
        "train_s_total": train_total_s,
        "global_step": int(model.num_timesteps),
        "episodes": callback.episodes,
        "last100_final": float(np.mean(callback.returns)) if callback.returns else None,
        "sb3_n_updates": int(
            model._n_updates
        ),  # += n_epochs per train(); = grad steps when batch_size = n_steps*n_envs
    }
    result["eval"] = evaluate(model, args.eval_episodes, args.eval_seed)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

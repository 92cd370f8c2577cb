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

import json
import time

T_IMPORT0 = time.time()

import gymnasium as gym  # noqa: E402
from episode_returns import summarize_returns  # noqa: E402 - a module beside this script
from sb3_stop_at_target import job_parser, run_to_target  # noqa: E402 - a module beside this script
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
    return summarize_returns(returns, started)


def main() -> None:
    parser = job_parser(total_timesteps=100_000, target=475.0)
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--eval-seed", type=int, default=10_000)
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

    result = run_to_target(model, args, spawn)
    result.update(
        hyperparameters={
            **{k: v for k, v in hyper.items() if not callable(v)},
            "learning_rate": "lin_1e-3",
            "clip_range": "lin_0.2",
            "n_envs": 8,
            "total_timesteps": args.total_timesteps,
        },
        sb3_n_updates=int(model._n_updates),  # += n_epochs per train(); = grad steps when batch_size = n_steps*n_envs
    )
    result["eval"] = evaluate(model, args.eval_episodes, args.eval_seed)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

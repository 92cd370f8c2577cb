"""One Stable-Baselines3 SAC Pendulum-v1 job (runs inside benchmarks/.venvs/sb3).

RL-Zoo's tuned Pendulum-v1 SAC (hyperparams/sac.yml: learning_rate 1e-3, SB3 defaults otherwise:
256x256 ReLU MLPs, Adam, batch 256, buffer 1e6, learning_starts 100, tau 0.005, gamma 0.99,
train_freq 1, gradient_steps 1, ent_coef 'auto' from 1.0, target_entropy -dim(A)). Stops as soon
as the mean return of the last 100 training episodes reaches --target (or at --total-timesteps).
Writes one JSON object to --out.

Timing: startup = process spawn (--spawn-time) -> just before model.learn(); train = learn()
start -> the env step at which the target was reached (wall and this process's CPU seconds).
"""

from __future__ import annotations

import json
import time

T_IMPORT0 = time.time()

import torch  # noqa: E402
from sb3_stop_at_target import job_parser, run_to_target  # noqa: E402 - a module beside this script
from stable_baselines3 import SAC  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402


def main() -> None:
    parser = job_parser(total_timesteps=60_000, target=-200.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    spawn = args.spawn_time if args.spawn_time is not None else T_IMPORT0
    if args.threads:
        torch.set_num_threads(args.threads)

    hyper = dict(learning_rate=1e-3)  # RL-Zoo Pendulum-v1; everything else SB3's SAC defaults
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=args.seed)
    model = SAC("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **hyper)

    result = run_to_target(model, args, spawn)
    result.update(
        hyperparameters={
            **hyper,
            "batch_size": model.batch_size,
            "buffer_size": model.buffer_size,
            "learning_starts": model.learning_starts,
            "tau": model.tau,
            "gamma": model.gamma,
            "train_freq": str(model.train_freq),
            "gradient_steps": model.gradient_steps,
            "ent_coef": "auto (1.0)",
            "target_entropy": float(model.target_entropy),
            "net_arch": "256x256 relu",
            "total_timesteps": args.total_timesteps,
        },
        grad_steps=int(model._n_updates),
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

"""The game score of an Atari run's checkpoints: whole games, unclipped — what CleanRL and SB3 plot.

fleetrl's training counters for `env.wrappers: atari` count one life per episode and clip rewards
to their sign (what the agent optimises). This plays `--games` whole games with each of a run
directory's checkpoints under the same preprocessing and reads each game's own score where the
preset reports it in training (`fleetrl.envs.atari.GameScore`, the `game_return_mean` of the
metrics: raw rewards over every life): the policy samples its actions, as during training
(`--deterministic` for its mode).

    python benchmarks/compare/atari_game_score.py RUN_DIR [--games 10] [--stride 1] [--device cuda]

Prints one line per checkpoint: env steps, mean/min/max game score; JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fleetrl.checkpoint import list_checkpoints, verified_load  # noqa: E402
from fleetrl.envs.atari import atari_wrappers  # noqa: E402
from fleetrl.models.policy import Policy  # noqa: E402
from fleetrl.plan.load import load_config  # noqa: E402
from fleetrl.run_dir import CONFIG_FILE  # noqa: E402

MAX_FRAMES = 108_000  # 30 minutes of play at 60 frames per second, the usual cap per game


def game_env(env_id: str, seed: int) -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    env = atari_wrappers(gym.make(env_id, max_episode_steps=MAX_FRAMES), env_id)
    env.reset(seed=seed)
    return env


def play_games(policy: Policy, env: gym.Env, games: int, device: torch.device, deterministic: bool) -> list[float]:
    """Whole games: a lost life ends fleetrl's episode, and the next reset goes on with the game
    (the preset's EpisodicLife); the step that ends the game carries its score."""
    scores: list[float] = []
    obs, _ = env.reset()
    while len(scores) < games:
        batch = torch.as_tensor(np.asarray(obs)[None], device=device)
        action, _, _ = policy.act(batch, deterministic)
        obs, _, terminated, truncated, info = env.step(int(action[0]))
        if "game_return" in info:
            scores.append(info["game_return"])
        if terminated or truncated:
            obs, _ = env.reset()
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--games", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=10_000)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--stride", type=int, default=1, help="every stride-th checkpoint (and the last)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    config = load_config(args.run_dir / CONFIG_FILE)
    device = torch.device(args.device)
    env = game_env(config.env.id, args.seed)
    policy = Policy.from_config(config.model, env.observation_space, env.action_space).to(device)
    results = []
    checkpoints = list_checkpoints(args.run_dir)
    chosen = checkpoints[args.stride - 1 :: args.stride]
    chosen += [c for c in checkpoints[-1:] if c not in chosen]
    for checkpoint in chosen:
        state = verified_load(checkpoint)
        policy.load_state_dict(state["actor"]["policy"])
        scores = play_games(policy, env, args.games, device, args.deterministic)
        steps = state["global_step"]
        results.append({"checkpoint": checkpoint.name, "global_step": steps, "scores": scores})
        print(
            f"{checkpoint.name}: env steps {steps}, game score mean {statistics.fmean(scores):.1f} "
            f"(min {min(scores):g}, max {max(scores):g}) over {len(scores)} games",
            flush=True,
        )
    env.close()
    if args.json:
        args.json.write_text(json.dumps({"run_dir": str(args.run_dir), "games": args.games, "results": results}))


if __name__ == "__main__":
    main()

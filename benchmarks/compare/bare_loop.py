"""The floor: a bare PyTorch PPO collect loop and update loop on CartPole-v1, no framework.

Written the way a typical single-file script would be: `gymnasium.make_vec(..., 'sync')`, two
separate 64x64 tanh nn.Sequential nets (actor, critic), torch.distributions.Categorical, Adam,
one 256-sample minibatch per epoch (8 envs x 32 steps), 20 epochs per rollout, RL-Zoo's CartPole
hyperparameters. It measures

* collect throughput: env steps / s of the rollout loop (policy forward + sample + value + env
  step + buffer writes), over --collect-steps env steps with the (untrained) policy;
* update throughput: gradient steps / s and samples / s of the update phase (GAE + advantage
  normalisation + 20 epochs of clipped-PPO minibatch updates with grad clipping), which is what
  fleetrl's per-iteration `time_update_s` covers.

Nothing is learned that matters here: the numbers are throughput only.

    python benchmarks/compare/bare_loop.py [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

NUM_ENVS, NUM_STEPS, MINIBATCH, EPOCHS = 8, 32, 256, 20
GAMMA, GAE_LAMBDA, CLIP, VF_COEF, MAX_GRAD_NORM = 0.98, 0.8, 0.2, 0.5, 0.5


def mlp(inputs: int, outputs: int, last_gain: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(inputs, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, outputs))
    for layer, gain in zip(net[::2], (np.sqrt(2), np.sqrt(2), last_gain)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return net


class Rollout:
    def __init__(self, obs_dim: int):
        self.obs = torch.zeros(NUM_STEPS, NUM_ENVS, obs_dim)
        self.actions = torch.zeros(NUM_STEPS, NUM_ENVS, dtype=torch.long)
        self.logprobs = torch.zeros(NUM_STEPS, NUM_ENVS)
        self.values = torch.zeros(NUM_STEPS, NUM_ENVS)
        self.rewards = torch.zeros(NUM_STEPS, NUM_ENVS)
        self.dones = torch.zeros(NUM_STEPS, NUM_ENVS)
        self.next_value = torch.zeros(NUM_ENVS)
        self.next_done = torch.zeros(NUM_ENVS)


def collect(envs, actor, critic, buf: Rollout, obs: np.ndarray, done: np.ndarray):
    for t in range(NUM_STEPS):
        obs_t = torch.as_tensor(obs, dtype=torch.float32)
        with torch.no_grad():
            dist = Categorical(logits=actor(obs_t))
            action = dist.sample()
            logprob = dist.log_prob(action)
            value = critic(obs_t).squeeze(-1)
        buf.obs[t] = obs_t
        buf.dones[t] = torch.as_tensor(done, dtype=torch.float32)
        buf.actions[t] = action
        buf.logprobs[t] = logprob
        buf.values[t] = value
        obs, reward, terminated, truncated, _ = envs.step(action.numpy())
        done = np.logical_or(terminated, truncated)
        buf.rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
    with torch.no_grad():
        buf.next_value = critic(torch.as_tensor(obs, dtype=torch.float32)).squeeze(-1)
    buf.next_done = torch.as_tensor(done, dtype=torch.float32)
    return obs, done


def update(actor, critic, optimizer, buf: Rollout) -> int:
    # GAE(lambda)
    with torch.no_grad():
        advantages = torch.zeros_like(buf.rewards)
        last = torch.zeros(NUM_ENVS)
        for t in reversed(range(NUM_STEPS)):
            if t == NUM_STEPS - 1:
                nonterminal, next_values = 1.0 - buf.next_done, buf.next_value
            else:
                nonterminal, next_values = 1.0 - buf.dones[t + 1], buf.values[t + 1]
            delta = buf.rewards[t] + GAMMA * next_values * nonterminal - buf.values[t]
            last = delta + GAMMA * GAE_LAMBDA * nonterminal * last
            advantages[t] = last
        returns = advantages + buf.values
    b_obs = buf.obs.reshape(-1, buf.obs.shape[-1])
    b_actions, b_logprobs = buf.actions.reshape(-1), buf.logprobs.reshape(-1)
    b_adv, b_returns = advantages.reshape(-1), returns.reshape(-1)
    params = [*actor.parameters(), *critic.parameters()]
    grad_steps = 0
    batch = b_obs.shape[0]
    for _ in range(EPOCHS):
        order = torch.randperm(batch)
        for start in range(0, batch, MINIBATCH):
            idx = order[start : start + MINIBATCH]
            dist = Categorical(logits=actor(b_obs[idx]))
            logprob = dist.log_prob(b_actions[idx])
            entropy = dist.entropy()
            value = critic(b_obs[idx]).squeeze(-1)
            ratio = (logprob - b_logprobs[idx]).exp()
            adv = b_adv[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
            v_loss = 0.5 * (value - b_returns[idx]).pow(2).mean()
            loss = pg_loss + VF_COEF * v_loss - 0.0 * entropy.mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
            optimizer.step()
            grad_steps += 1
    return grad_steps


def measure(collect_steps: int = 20_000, update_iterations: int = 60, warmup: int = 3, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    envs = gym.make_vec("CartPole-v1", NUM_ENVS, vectorization_mode="sync")
    obs_dim = envs.single_observation_space.shape[0]
    actor = mlp(obs_dim, envs.single_action_space.n, 0.01)
    critic = mlp(obs_dim, 1, 1.0)
    optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=1e-3, eps=1e-5)
    buf = Rollout(obs_dim)
    obs, _ = envs.reset(seed=seed)
    done = np.zeros(NUM_ENVS, dtype=bool)

    for _ in range(warmup):
        obs, done = collect(envs, actor, critic, buf, obs, done)
        update(actor, critic, optimizer, buf)

    # collect throughput (the policy is not updated in between: an untrained policy, short
    # episodes, many resets; the timed work is the loop itself)
    iterations = max(1, collect_steps // (NUM_ENVS * NUM_STEPS))
    started = time.perf_counter()
    for _ in range(iterations):
        obs, done = collect(envs, actor, critic, buf, obs, done)
    collect_s = time.perf_counter() - started
    env_steps = iterations * NUM_ENVS * NUM_STEPS

    # update throughput on the last rollout, repeated
    grad_steps = 0
    started = time.perf_counter()
    for _ in range(update_iterations):
        grad_steps += update(actor, critic, optimizer, buf)
    update_s = time.perf_counter() - started
    envs.close()
    return {
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "collect_env_steps": env_steps,
        "collect_s": collect_s,
        "collect_steps_per_s": env_steps / collect_s,
        "update_iterations": update_iterations,
        "update_grad_steps": grad_steps,
        "update_s": update_s,
        "update_grad_steps_per_s": grad_steps / update_s,
        "update_samples_per_s": grad_steps * MINIBATCH / update_s,
        "update_s_per_iteration": update_s / update_iterations,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch default)")
    parser.add_argument("--collect-steps", type=int, default=20_000)
    parser.add_argument("--update-iterations", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=1, help="repeat and keep the best run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    runs = [measure(args.collect_steps, args.update_iterations) for _ in range(args.repeats)]
    result = max(runs, key=lambda r: r["collect_steps_per_s"])
    best_update = max(runs, key=lambda r: r["update_grad_steps_per_s"])
    for key in (
        "update_grad_steps",
        "update_s",
        "update_grad_steps_per_s",
        "update_samples_per_s",
        "update_s_per_iteration",
    ):
        result[key] = best_update[key]
    result["repeats"] = args.repeats
    if args.json:
        print(json.dumps(result))
    else:
        print(f"bare PyTorch loop, torch {result['torch']}, {result['torch_threads']} thread(s)")
        print(
            f"  collect: {result['collect_steps_per_s']:,.0f} env steps/s "
            f"({result['collect_env_steps']} steps in {result['collect_s']:.2f} s)"
        )
        print(
            f"  update:  {result['update_grad_steps_per_s']:,.0f} grad steps/s, "
            f"{result['update_samples_per_s']:,.0f} samples/s "
            f"({result['update_s_per_iteration'] * 1e3:.1f} ms per 20-epoch update)"
        )


if __name__ == "__main__":
    main()

"""The flow-matching action chain: π0's training loss, S Euler steps, and the stochastic chain whose
log-probability RL needs (πRL's flow-SDE).

Conventions (openpi's): an action chunk `a` (K actions of D dimensions) is normalised to [-1, 1];
noise ε ~ N(0, I) has its shape; x_t = t·ε + (1 − t)·a for t ∈ [0, 1] (t = 1 is pure noise), whose
velocity dx_t/dt is u = ε − a: what the action expert v_θ(x_t, t) learns to predict.

- **Training** (`fleetrl sft`): t = 0.001 + 0.999·Beta(1.5, 1), π0's sampling, weighted toward the
  noisy end (drawn as U^(2/3), Beta(1.5, 1)'s inverse CDF); the loss is (v_θ(x_t, t) − u)² per
  element.
- **Acting**: S = `model.flow.steps` Euler steps down the grid t_k = 1 − k/S (k = 0..S), Δ = 1/S,
  from x_0 = ε. `ode`: x_{k+1} = x_k − Δ·v_k, deterministic. `sde`: the reverse-time SDE with the
  ODE's marginals — the score of x_t is −(x_t + (1 − t)·v)/t, so adding noise of scale σ asks
  for the drift's correction σ²/2 × the score (πRL's flow-SDE) — taken as one
  Gaussian transition per step:

      x_{k+1} ~ N(μ_k, s_k² I),   μ_k = x_k − Δ·[v_k + σ_k²/(2 t_k)·(x_k + (1 − t_k)·v_k)],
      s_k = σ_k·√Δ,              σ_k = a·√(t_k / (1 − t'_k)),

  with a = `model.flow.noise_level` and t'_k = t_k except t'_0 = t_1 (the formula's pole at t = 1,
  moved as πRL moves it). The schedule is fixed: σ_k depends on k alone.
- **Log-probability**: a chain's is Σ_k log N(x_{k+1}; μ_k, s_k² I) — the sum of its steps'
  Gaussian log-densities (the first sample's, N(x_0; 0, I), has no parameter and cancels in every
  ratio, so it is left out). It is returned per chunk action, (B, K): summed over the D dimensions
  and the S steps, so that a loss can keep only the actions an episode executed. Its stand-in for
  entropy is the steps' Gaussian entropies, Σ_k D·(log s_k + ½ log 2πe): a constant of the
  schedule.

Everything here is float32 arithmetic on tensors; the expert's call is the caller's (`velocity`),
so the same functions serve acting (one step at a time) and the loss path (every step of a stored
chain in one batched call).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
TIME_FLOOR = 0.001  # π0's: t never quite 0, where the target is the action itself
BETA_EXPONENT = 1 / 1.5  # Beta(1.5, 1)'s inverse CDF: t = U^(1/1.5)

Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x (B, K, D), t (B,)) → v (B, K, D)


def training_times(batch: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """(B,) flow-matching times t = 0.001 + 0.999·Beta(1.5, 1) (π0's)."""
    uniform = torch.rand(batch, generator=generator).to(device)
    return TIME_FLOOR + (1 - TIME_FLOOR) * uniform.pow(BETA_EXPONENT)


def noisy_actions(actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, u): the chunk at time `t` (B,) on its way to `noise`, and its velocity ε − a."""
    t = t.view(-1, *([1] * (actions.dim() - 1)))
    return t * noise + (1 - t) * actions, noise - actions


def flow_matching_error(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, K, D) velocities → (B, K): the squared error, averaged over each action's dimensions."""
    return (predicted - target).pow(2).mean(-1)


@dataclass(frozen=True)
class FlowChain:
    """The denoising schedule of `steps` Euler steps; `noise` ode or sde (module docstring)."""

    steps: int
    noise: str = "sde"  # "ode" | "sde"
    noise_level: float = 0.5

    @property
    def delta(self) -> float:
        return 1.0 / self.steps

    def times(self) -> torch.Tensor:
        """(S + 1,) t_k = 1 − k/S, float32: from the noise (1) to the action (0)."""
        return 1 - torch.arange(self.steps + 1, dtype=torch.float64) / self.steps

    def sigmas(self) -> torch.Tensor:
        """(S,) σ_k = a·√(t_k / (1 − t'_k)), t'_0 = t_1 (module docstring), float64."""
        t = self.times()
        denominator = (1 - t[:-1]).clone()
        denominator[0] = 1 - t[1]
        return self.noise_level * torch.sqrt(t[:-1] / denominator)

    def step_stds(self) -> torch.Tensor:
        """(S,) the Gaussian transitions' standard deviations s_k = σ_k·√Δ (0 for an ODE chain)."""
        if self.noise == "ode":
            return torch.zeros(self.steps, dtype=torch.float64)
        return self.sigmas() * math.sqrt(self.delta)

    def step_mean(self, x: torch.Tensor, v: torch.Tensor, k: torch.Tensor | int) -> torch.Tensor:
        """μ_k of step `k` from x_k and its velocity v_k: the ODE's Euler step, plus the SDE's drift
        correction. `k` an int, or a (B,) tensor of step indices (each row its own step)."""
        t, sigma = self.times()[:-1], self.sigmas()
        t_k = torch.as_tensor(t[k], dtype=x.dtype, device=x.device)
        euler = x - self.delta * v
        if self.noise == "ode":
            return euler
        correction = torch.as_tensor(sigma[k] ** 2, dtype=x.dtype, device=x.device) / (2 * t_k)
        shape = (-1, *([1] * (x.dim() - 1)))
        return euler - self.delta * correction.reshape(shape) * (x + (1 - t_k).reshape(shape) * v)

    def entropy(self, batch: int, chunk: int, dim: int) -> torch.Tensor:
        """(B, K) the chain's entropy stand-in: Σ_k D·(log s_k + ½ log 2πe), a constant of the
        schedule (0 for an ODE chain, which has no density)."""
        if self.noise == "ode":
            return torch.zeros(batch, chunk)
        per_element = (torch.log(self.step_stds()) + 0.5 + LOG_SQRT_2PI).sum()
        return torch.full((batch, chunk), float(dim * per_element))


def gaussian_log_density(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std²); `std` broadcasts against x."""
    return -0.5 * ((x - mean) / std).pow(2) - torch.log(std) - LOG_SQRT_2PI


def denoise(
    chain: FlowChain, velocity: Velocity, noise: torch.Tensor, deterministic: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the chain from `noise` (B, K, D): returns (every sample x_0..x_S (B, S + 1, K, D), the
    chain's log-probability (B, K)). `deterministic` (or an `ode` chain) takes the means: the ODE
    when deterministic, whose log-probability is reported as 0. Draws the steps' noise from torch's
    generator."""
    samples = [noise]
    logprob = torch.zeros(noise.shape[:2], dtype=noise.dtype, device=noise.device)
    stds = chain.step_stds()
    ode = deterministic or chain.noise == "ode"
    plain = FlowChain(chain.steps, "ode") if ode else chain
    times = chain.times()
    x = noise
    for k in range(chain.steps):
        t = torch.full((x.shape[0],), float(times[k]), dtype=x.dtype, device=x.device)
        v = velocity(x, t)
        mean = plain.step_mean(x, v, k)
        if ode:
            x = mean
        else:
            std = torch.as_tensor(stds[k], dtype=x.dtype, device=x.device)
            x = mean + std * torch.randn_like(mean)
            logprob = logprob + gaussian_log_density(x, mean, std).sum(-1)
        samples.append(x)
    return torch.stack(samples, 1), logprob


def chain_log_prob(chain: FlowChain, samples: torch.Tensor, velocities: torch.Tensor) -> torch.Tensor:
    """The log-probability (B, K) of stored chains `samples` (B, S + 1, K, D), given the velocities
    (B, S, K, D) the expert predicts at x_0..x_{S−1}: the loss path's recomputation of what
    `denoise` returned when it drew them (equal to float32 rounding)."""
    steps = torch.arange(chain.steps, device=samples.device)
    x, following = samples[:, :-1], samples[:, 1:]
    flat = x.flatten(0, 1)
    index = steps.repeat(x.shape[0])
    mean = chain.step_mean(flat, velocities.flatten(0, 1), index).unflatten(0, x.shape[:2])
    std = chain.step_stds().to(dtype=samples.dtype, device=samples.device).view(1, -1, 1, 1)
    return gaussian_log_density(following, mean, std).sum((1, 3))

"""What one env step returns: `StepResult`, NumPy only, handed from the env worker to the rollout
worker. A module of its own, apart from the torch-side types (trajectory.py), so that an env
worker's process never imports torch (~1.5 s of its start-up here: benchmarks/scaling/ray_startup.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetrl.observations import Observation, map_obs, obs_len


@dataclass
class StepResult:
    obs: Observation  # next observation (first of the new episode where one ended)
    reward: np.ndarray  # float32 (N,), normalised when env.normalize_reward
    terminated: np.ndarray  # bool (N,)
    truncated: np.ndarray  # bool (N,), and not terminated
    truncated_index: np.ndarray  # int (K,) envs truncated this step
    final_obs: Observation  # (K, *obs_shape) their last observations, for the bootstrap value
    steps: np.ndarray | None = None  # int (N,) env steps each env executed (action chunks), None: one each
    # float32 (N,) with action chunks: Σ_j r_j over the executed steps, raw and undiscounted (the
    # episode return's share, for advantages of whole episodes); `reward` is Σ_j γ^j r_j (the semi-MDP reward GAE needs)
    chunk_return: np.ndarray | None = None

    @classmethod
    def initial(cls, obs: Observation) -> StepResult:
        """The state after a reset, in the same shape as a step's outcome."""
        count = obs_len(obs)
        no = np.zeros(count, bool)
        return cls(obs, np.zeros(count, np.float32), no, no, np.empty(0, np.int64), map_obs(lambda x: x[:0], obs))

"""Per-rank seeds: one formula, one stream constant per use; and a process's random state, which a
checkpoint carries for every process that draws (`random_state`, `set_random_state`).

A rank's random draws must differ from every other rank's (each explores or samples its own),
follow `runner.seed` (a run is reproducible), and differ between uses on the same rank (the
actor's replay sampling is not the rollout's action noise). Seed `seed * 1_000_003 + stream *
(rank + 1)`, with a distinct prime `stream` per use, gives all three.
"""

from __future__ import annotations

import random

import numpy as np
import torch

ACTOR_SAMPLING = 7919  # an actor rank's minibatch sampling from its own data (an off-policy algorithm's replay shard)
ROLLOUT_NOISE = 104_729  # a rollout rank's action noise


def rank_seed(seed: int, rank: int, stream: int) -> int:
    """The seed of `stream` on rank `rank` of a run seeded with `seed`."""
    return seed * 1_000_003 + stream * (rank + 1)


def random_state() -> dict:
    """This process's random state: torch's CPU generator (action noise, minibatch shuffles),
    numpy's and Python's. A resume restores it in the same process role and rank, so that the
    draws after it are the uninterrupted run's."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_random_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])

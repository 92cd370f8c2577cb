"""Per-rank seeds: one formula, one stream constant per use.

A rank's random draws must differ from every other rank's (each explores or samples its own),
follow `runner.seed` (a run is reproducible), and differ between uses on the same rank (the
actor's replay sampling is not the rollout's action noise). Seed `seed * 1_000_003 + stream *
(rank + 1)`, with a distinct prime `stream` per use, gives all three.
"""

from __future__ import annotations

ACTOR_SAMPLING = 7919  # an actor rank's minibatch sampling from its own data (an off-policy algorithm's replay shard)
ROLLOUT_NOISE = 104_729  # a rollout rank's action noise


def rank_seed(seed: int, rank: int, stream: int) -> int:
    """The seed of `stream` on rank `rank` of a run seeded with `seed`."""
    return seed * 1_000_003 + stream * (rank + 1)

"""The statistics a LeRobotDataset carries: per episode (in its episodes table) and for the whole
dataset (`meta/stats.json`), for every feature that is not text. LeRobot's policies normalise their
inputs and actions with them (mean/std, min/max or quantiles, by policy).

Each statistic has the feature's shape: (n,) for a vector of n, (1,) for a scalar, and (3, 1, 1)
for a camera — one value per colour channel over every pixel of every frame, scaled to [0, 1] as
LeRobot's image tensors are. `count` is the number of frames, shape (1,).

The quantiles are exact (NumPy's), where LeRobot estimates them from histograms of a sample of
frames; the whole dataset's statistics combine the episodes' as LeRobot does (`aggregate`): mean
and variance exactly, the quantiles as the frame-weighted mean of the episodes'.
"""

from __future__ import annotations

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


def feature_stats(values: np.ndarray, is_image: bool) -> dict[str, np.ndarray]:
    """The statistics of one feature over one episode's frames: `values` is (T, *shape), a
    camera's (T, H, W, 3) uint8. In LeRobot's order and types: `min` and `max` of the feature's
    dtype (a camera's as floats in [0, 1]), the rest floats."""
    frames = len(values)
    if is_image:
        samples = values.reshape(-1, values.shape[-1]).astype(np.float64) / 255.0  # (T·H·W, 3)
    else:
        samples = values.reshape(frames, -1)
    real = samples.astype(np.float64)
    stats = {
        "min": samples.min(axis=0),
        "max": samples.max(axis=0),
        "mean": real.mean(axis=0),
        "std": real.std(axis=0),
    }
    quantiles = {name: np.quantile(real, q, axis=0) for name, q in QUANTILES.items()}
    shape = (-1, 1, 1) if is_image else (-1,)
    return {
        **{name: value.reshape(shape) for name, value in stats.items()},
        "count": np.array([frames]),
        **{name: value.reshape(shape) for name, value in quantiles.items()},
    }


def aggregate(episodes: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One feature's statistics over several episodes, from each episode's (`feature_stats`)."""
    counts = np.array([int(stats["count"][0]) for stats in episodes], np.float64)
    total = counts.sum()

    def weighted(values: list[np.ndarray]) -> np.ndarray:
        stacked = np.stack(values).astype(np.float64)
        return np.tensordot(counts, stacked, axes=1) / total

    mean = weighted([stats["mean"] for stats in episodes])
    variance = weighted([stats["std"] ** 2 + (stats["mean"] - mean) ** 2 for stats in episodes])
    return {
        "min": np.min(np.stack([stats["min"] for stats in episodes]), axis=0),
        "max": np.max(np.stack([stats["max"] for stats in episodes]), axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": np.array([int(total)]),
        **{name: weighted([stats[name] for stats in episodes]) for name in QUANTILES},
    }


def as_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    """`{feature: {statistic: nested lists}}`, as `meta/stats.json` holds them."""
    return {key: {name: value.tolist() for name, value in values.items()} for key, values in stats.items()}

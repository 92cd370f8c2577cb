"""What the CartPole jobs report about their deterministic evaluation episodes (imported from
beside them, by both the SB3 and the CleanRL venv: numpy only)."""

from __future__ import annotations

import time

import numpy as np


def summarize_returns(returns: list[float], started: float) -> dict:
    """Mean, spread and count of the episodes' returns; `started` is the evaluation's
    time.perf_counter() at its start."""
    return {
        "mean": float(np.mean(returns)),
        "std": float(np.std(returns)),
        "episodes": len(returns),
        "min": float(np.min(returns)),
        "max": float(np.max(returns)),
        "eval_s": time.perf_counter() - started,
        "deterministic": True,
    }

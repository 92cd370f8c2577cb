"""Non-finite values (NaN, ±inf) are incidents, not numbers to train on.

A NaN reward at env step 3,000 used to train on: the loss, the weights and every checkpoint after
it turned NaN, and the run ended with exit 0. Wherever a value enters training and can be checked
cheaply, fleetrl checks it, and the first non-finite one raises `NonFiniteError` in the worker that
holds it: the env worker (rewards, observations, before any normalisation sees them), the rollout
worker (the policy's log-probabilities and values), the actor (the loss, the gradients before
clipping, the parameters after a step: `fleetrl.algos.common.finite`). The watchdog classifies it
by its type's name as the incident `non_finite` (exit 4). No restart: the same data or the same
weights bring it back.

`NonFiniteError`'s message names what held the value, which one (a key, a parameter, a loss term),
the value and where (a lane, a step): the incident's summary puts the worker (component and rank)
in front of it. Raise it from any worker, with those four, for a value of your own:

    raise NonFiniteError("flow-matching loss", "velocity_error", float("nan"), "gradient step 3 of actor.train")

This module is numpy only: env workers import it without torch.
"""

from __future__ import annotations

import math

import numpy as np


class NonFiniteError(RuntimeError):
    """A NaN or infinity where training needs finite numbers.

    `what`: the kind of value ("env reward", "env observation", "loss", "gradient", "parameter",
    "log-probability", "value"); `key`: which one (an observation key, a parameter's name, a loss
    term); `value`: the first non-finite value found (nan, inf or -inf); `where`: where it was
    found (a lane and step, a gradient step)."""

    def __init__(self, what: str, key: str, value: float, where: str):
        self.what, self.key, self.value, self.where = what, key, float(value), where
        super().__init__(f"non-finite {what}: {key} is {self.value} ({where})")

    def __reduce__(self):  # pickled by field, as it travels from a worker (Ray, a subprocess)
        return NonFiniteError, (self.what, self.key, self.value, self.where)


def all_finite(array: np.ndarray) -> bool:
    """Whether every element of `array` is finite; True for integer arrays (images, token ids)
    without looking at them. The sum of its squares is finite exactly when every element is,
    unless large finite values overflow it: one BLAS dot product (half the time of
    `np.isfinite(...).all()` on an image, a third of its overhead on a small array), and only
    where the sum is not finite the element-wise check."""
    if array.dtype.kind != "f" or not array.size:
        return True
    flat = array.reshape(-1)
    return math.isfinite(flat @ flat) or bool(np.isfinite(array).all())


def first_non_finite(array: np.ndarray) -> tuple[tuple[int, ...], float] | None:
    """(index, value) of the first non-finite element of `array` in C order, or None."""
    if array.dtype.kind != "f":
        return None
    bad = np.flatnonzero(~np.isfinite(array))
    if not len(bad):
        return None
    index = np.unravel_index(int(bad[0]), array.shape)
    return tuple(int(i) for i in index), float(np.asarray(array)[index])


def non_finite_rows(array: np.ndarray) -> np.ndarray:
    """A boolean (N,) mask of the rows (axis 0: one per env) of `array` that hold a non-finite
    value; all False for integer arrays."""
    if array.dtype.kind != "f" or not array.size:
        return np.zeros(len(array), bool)
    return ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)

"""How the equivalence tests compare what ranks computed with what one process computed: the
largest difference over nested states, a full actor state, and an iteration's metrics. One
comparison per need, shared by the DDP/FSDP, PPG, token-policy and SAC tests."""

from __future__ import annotations

import math

import torch


def max_difference(a, b) -> float:
    """The largest absolute difference between two nested structures of tensors (dicts, lists,
    tuples); their structure and every non-tensor leaf must be equal."""
    if isinstance(a, torch.Tensor):
        return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max([max_difference(a[k], b[k]) for k in a] or [0.0])
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        return max([max_difference(x, y) for x, y in zip(a, b)] or [0.0])
    assert a == b, (a, b)
    return 0.0


def assert_close_state(actual: dict, expected: dict, atol: float) -> None:
    """Policy, optimizer (Adam moments, steps) and generator of a full actor state."""
    assert max_difference(actual["policy"], expected["policy"]) <= atol
    actual_opt, expected_opt = actual["optimizer"], expected["optimizer"]
    assert actual_opt["state"].keys() == expected_opt["state"].keys()
    for index, moments in expected_opt["state"].items():
        for key, value in moments.items():
            assert torch.allclose(actual_opt["state"][index][key].float(), value.float(), atol=atol, rtol=atol * 10), (
                index,
                key,
            )
    assert [{k: v for k, v in g.items() if k != "params"} for g in actual_opt["param_groups"]] == [
        {k: v for k, v in g.items() if k != "params"} for g in expected_opt["param_groups"]
    ]
    assert torch.equal(actual["generator"], expected["generator"])


def assert_close_metrics(actual: dict, expected: dict) -> None:
    """Every metric of an iteration: counts and schedules exactly, the rest to float32
    reordering (timings aside)."""
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if key in ("aux_s",):
            continue
        if isinstance(value, int) or key in ("lr", "clip_coef"):
            assert actual[key] == value, key
        else:
            assert math.isclose(actual[key], value, rel_tol=1e-4, abs_tol=1e-6), (key, actual[key], value)

"""The flight recorder's collective marks: what they record, and the call site they name."""

from __future__ import annotations

import torch

from fleetrl.watch import flight_recorder


def reduce_gradients(tensor: torch.Tensor) -> dict:
    with flight_recorder.collective("all_reduce", tensor, group="actor"):
        return dict(flight_recorder.current().collective)


def test_a_collective_names_its_call_site_and_is_kept_as_the_last_one(monkeypatch):
    mark = flight_recorder.Recorder("actor", 1, 0)
    monkeypatch.setattr(flight_recorder, "_recorder", mark)
    during = reduce_gradients(torch.zeros(3, 2))
    line = reduce_gradients.__code__.co_firstlineno + 1
    assert during["call_site"] == f"test_recorder.py:{line} (reduce_gradients)"
    assert (during["seq"], during["op"], during["group"]) == (1, "all_reduce", "actor")
    assert during["shapes"] == [[3, 2]] and during["dtypes"] == ["torch.float32"]
    assert mark.collective is None and mark.last_collective["seq"] == 1
    assert mark.last_collective["finished"] >= during["started"]


def test_without_a_recorder_a_collective_mark_does_nothing(monkeypatch):
    monkeypatch.setattr(flight_recorder, "_recorder", None)
    with flight_recorder.collective("broadcast", torch.zeros(1)):
        assert flight_recorder.current() is None

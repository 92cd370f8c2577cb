"""The flight recorder's collective marks: what they record, and the call site they name."""

from __future__ import annotations

import torch

from fleetrl.probe import flight_recorder


def reduce_gradients(tensor: torch.Tensor) -> dict:
    with flight_recorder.collective("all_reduce", tensor, group="actor"):
        return flight_recorder.current().record()


def test_a_collective_names_its_call_site_and_is_kept_as_the_last_one(monkeypatch):
    mark = flight_recorder.Recorder("actor", 1, 0)
    monkeypatch.setattr(flight_recorder, "_recorder", mark)
    during = reduce_gradients(torch.zeros(3, 2))
    line = reduce_gradients.__code__.co_firstlineno + 1
    entry = during["collective"]
    assert entry["call_site"] == f"test_recorder.py:{line} (reduce_gradients)"
    assert (entry["seq"], entry["op"], entry["group"], entry["finished"]) == (1, "all_reduce", "actor", None)
    assert entry["shapes"] == [[3, 2]] and entry["dtypes"] == ["torch.float32"]
    assert during["collectives"]["entered"] == {"actor": 1} and during["collectives"]["completed"] == {}
    after = mark.record()
    assert after["collective"] is None and after["last_collective"]["seq"] == 1
    assert after["last_collective"]["finished"] >= entry["started"]
    assert after["collectives"]["completed"] == {"actor": 1} and after["collectives"]["in_flight"] == []


def test_each_group_has_its_own_sequence_and_a_phase_call_counts_its_collectives(monkeypatch):
    mark = flight_recorder.Recorder("actor", 0, 0)
    monkeypatch.setattr(flight_recorder, "_recorder", mark)
    with mark.in_phase("actor.train"):
        for group in ("actor", "shard", "actor"):
            with flight_recorder.collective("all_reduce", torch.zeros(1), group=group):
                pass
        assert mark.record()["collectives_in_call"] == 3
    record = mark.record()
    assert record["collectives"]["entered"] == {"actor": 2, "shard": 1}
    assert [(e["group"], e["seq"]) for e in record["collectives"]["recent"]] == [
        ("actor", 1),
        ("shard", 1),
        ("actor", 2),
    ]
    assert record["call_collectives"] == {"actor.train": 3} and record["collectives_in_call"] is None


def test_without_a_recorder_a_collective_mark_does_nothing(monkeypatch):
    monkeypatch.setattr(flight_recorder, "_recorder", None)
    with flight_recorder.collective("broadcast", torch.zeros(1)):
        assert flight_recorder.current() is None

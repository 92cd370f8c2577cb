"""A fault inside a Hugging Face model's forward on actor rank 1 of 2 FSDP ranks (a Gemma
decoder, `tests.hf_models:GemmaNet`, on CartPole through Ray): the report names rank 1 as behind
and rank 0 as waiting for it, within `watchdog.collective_timeout_s` and the poll."""

from __future__ import annotations

import pytest

from tests.incidents import STALL_S, assert_incident, fault, run_fault
from tests.support import TWO_ACTOR_RANKS_ON_RAY

HF_FSDP = ["model.id=tests.hf_models:GemmaNet", "actor.strategy=fsdp"]


@pytest.mark.slow
def test_a_hang_in_the_hf_model_s_forward_names_the_rank(tmp_path):
    result = run_fault(
        tmp_path, *TWO_ACTOR_RANKS_ON_RAY, *HF_FSDP, fault("hang_in_forward", "actor", 1, 1), checkpointed=False
    )
    assert_incident(result, "rank_missing_from_collective", ["actor", 1], STALL_S)
    assert result.hang_report["summary"].startswith("actor rank 1 is behind: "), result.hang_report["summary"]
    assert "actor rank 0 waits in " in result.hang_report["summary"]

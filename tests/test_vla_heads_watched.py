"""The flow head's denoising loop is watched like everything else (issue 41): it runs in a phase of
its own, `denoise`, on a rollout (acting: S forwards of the expert) and on an actor rank (the loss
path: the stored chain's velocities), so that a hang inside it is named there. The fault
(`debug.fault.kind: hang_in_denoising`) makes the expert's next forward sleep forever, after a
first call that taught the phase's deadline; a tiny PaliGemma with a flow expert plays
`CountingImages` (images, Box actions) on Ray.

Both are `slow` (a Ray run with the VLA each, ~110 s on this loaded host, over the issue's CI
share); CI holds the phase itself in process: tests/test_vla_heads.py checks that acting and the
loss path run the expert inside `denoise`."""

from __future__ import annotations

import pytest

from tests.incidents import STALL_S, assert_incident, fault, run_fault
from tests.support import TWO_ACTOR_RANKS_ON_RAY

FLOW_VLA = [
    "env.id=tests.image_envs:CountingImages",
    "env.kwargs={continuous: true, dict_obs: true, length: 8}",
    "model={id: hf, path: PATH, prompt_template: 'Out:', action_head: flow, lora: {rank: 2}, "
    "flow: {steps: 3, width: 16, layers: 1, heads: 2}}",
    "algorithm.update_epochs=1",
]


def flow_vla(folder) -> list[str]:
    return [override.replace("PATH", str(folder)) for override in FLOW_VLA]


@pytest.mark.slow
def test_a_hang_inside_the_denoising_loop_of_acting_is_named_on_the_rollout(tmp_path, tiny_paligemma):
    result = run_fault(
        tmp_path, *TWO_ACTOR_RANKS_ON_RAY, *flow_vla(tiny_paligemma), fault("hang_in_denoising", "rollout", 0, 20)
    )
    assert_incident(result, "phase_timeout", ["rollout", 0], STALL_S)
    culprit = next(w for w in result.hang_report["workers"] if w["culprit"])
    assert culprit["phase"] == "denoise", culprit
    assert "denoise" in result.hang_report["summary"], result.hang_report["summary"]


@pytest.mark.slow
def test_a_hang_inside_the_denoising_of_the_loss_path_names_the_actor_rank(tmp_path, tiny_paligemma):
    result = run_fault(
        tmp_path,
        *TWO_ACTOR_RANKS_ON_RAY,
        *flow_vla(tiny_paligemma),
        "actor.strategy=fsdp",
        fault("hang_in_denoising", "actor", 1, 2),
    )
    assert_incident(result, "rank_missing_from_collective", ["actor", 1], STALL_S)
    culprit = next(w for w in result.hang_report["workers"] if w["culprit"])
    assert culprit["phase"] == "denoise", culprit
    assert result.hang_report["summary"].startswith("actor rank 1 is behind: "), result.hang_report["summary"]

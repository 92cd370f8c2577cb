"""Weight sync of a LoRA-tuned Hugging Face model (`tests.hf_models`, peft adapters on a frozen
PaliGemma): after one full sync, patches of only the trainable tensors keep a rollout worker's
separate copy of the policy acting exactly as the actor's, at a fraction of the bytes."""

from __future__ import annotations

import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.errors import ConfigError
from fleetrl.parallel.changed_values import Changes, apply_changes, patch_bytes
from fleetrl.parallel.weight_sync import state_bytes
from fleetrl.plan.load import load_config
from fleetrl.workers.rollout_worker import RolloutWorker
from tests.dist_support import BASE, PROGRESS
from tests.fsdp_transformer_ranks import SPACES, trajectory

LORA = ["model.id=tests.hf_models:PaliGemmaNet", "model.kwargs={lora: true}", "algorithm.update_epochs=1"]


def test_patches_of_the_trainable_tensors_keep_the_rollout_acting_as_the_actor():
    config = load_config(None, BASE + LORA)
    actor = ActorWorker(config, *SPACES)
    rollout = RolloutWorker.from_config(config, *SPACES)
    rollout.load_weights(actor.policy_weights())  # the first sync: full
    full = actor.policy_weights()
    for iteration in range(2):
        actor.train(trajectory(config, iteration), PROGRESS[iteration])
        patch = actor.trainable_weights()
        # the adapters and the heads; not one tensor of the frozen base
        assert patch and all("lora_" in name or "_head." in name for name in patch)
        assert state_bytes(patch) * 10 < state_bytes(full)
        rollout.load_patch(patch)
    actor_state, rollout_state = actor.policy.state_dict(), rollout.policy.state_dict()
    assert any(not torch.equal(full[name], actor_state[name]) for name in patch)  # training changed them
    assert all(torch.equal(actor_state[name], rollout_state[name]) for name in actor_state)
    obs = {key: value[0] for key, value in trajectory(config, 0).obs.items()}
    assert torch.equal(actor.policy.act(obs, deterministic=True)[0], rollout.policy.act(obs, deterministic=True)[0])


def test_a_patch_naming_another_model_s_tensor_is_an_error():
    config = load_config(None, BASE + LORA)
    rollout = RolloutWorker.from_config(config, *SPACES)
    with pytest.raises(KeyError, match="network.not_there"):
        rollout.load_patch({"network.not_there": torch.zeros(1)})


def test_sac_syncs_full_weights_only():
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["algorithm.name=sac", "env.id=Pendulum-v1", "runner.weight_sync=trainable"])
    assert caught.value.key == "runner.weight_sync"


# --------------------------------------------------- runner.weight_sync: changed (issue 42)


def test_changed_values_are_judged_at_the_rollout_s_precision_and_sent_sparse():
    """A bfloat16 rollout: a float32 step too small for bfloat16 sends nothing; a few moved
    values go sparse (gaps and values), most moved go dense; the rollout's float32 copy, written
    with them, rounds to exactly the actor's bfloat16 values."""
    torch.manual_seed(0)
    weight = torch.randn(64, 32).to(torch.bfloat16).float()  # values bfloat16 holds exactly
    changes = Changes(torch.bfloat16, compress=True)
    changes.record({"w": weight})
    rollout = torch.nn.Module()
    rollout.w = torch.nn.Parameter(weight.clone())
    assert changes.patch({"w": weight * (1 + 2**-12)}) == {}  # under half a bfloat16 step: nothing moves
    weight = weight.clone()
    weight[3, :5] += 1.0
    patch = changes.patch({"w": weight})
    assert patch["w"][0] == "sparse" and patch_bytes(patch) < 64  # 5 positions and values, compressed
    apply_changes(rollout, patch)
    assert torch.equal(rollout.w.detach().to(torch.bfloat16), weight.to(torch.bfloat16))
    patch = changes.patch({"w": weight + 1.0})
    assert patch["w"][0] == "dense"
    apply_changes(rollout, patch)
    assert torch.equal(rollout.w.detach().to(torch.bfloat16), (weight + 1.0).to(torch.bfloat16))
    with pytest.raises(KeyError, match="not_there"):
        apply_changes(rollout, {"not_there": patch["w"]})


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_changed_patches_keep_the_rollout_acting_as_the_actor_at_its_precision(precision):
    config = load_config(None, [*BASE, *LORA, "runner.weight_sync=changed", f"rollout.dtype={precision}"])
    actor = ActorWorker(config, *SPACES)
    rollout = RolloutWorker.from_config(config, *SPACES)
    rollout.load_changed(actor.changed_weights())  # the first: full
    dtype = getattr(torch, precision)
    for iteration in range(2):
        actor.train(trajectory(config, iteration), PROGRESS[iteration])
        payload = actor.changed_weights()
        assert set(payload) == {"patch"} and payload["patch"]
        rollout.load_changed(payload)
        trainable = actor.trainable_weights()
        held = rollout.policy.state_dict()
        assert all(torch.equal(held[name].to(dtype), tensor.to(dtype)) for name, tensor in trainable.items())
    obs = {key: value[0] for key, value in trajectory(config, 0).obs.items()}
    with rollout.precision():
        ours = rollout.policy.act(obs, deterministic=True)[0]
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        theirs = actor.policy.act(obs, deterministic=True)[0]
    assert torch.equal(ours, theirs)

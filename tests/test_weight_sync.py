"""Weight sync of a LoRA-tuned Hugging Face model (`tests.hf_models`, peft adapters on a frozen
PaliGemma): after one full sync, patches of only the trainable tensors keep a rollout worker's
separate copy of the policy acting exactly as the actor's, at a fraction of the bytes."""

from __future__ import annotations

import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.errors import ConfigError
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

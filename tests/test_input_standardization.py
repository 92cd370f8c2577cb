"""`model.standardize_inputs`: the transformer's vector inputs centred and scaled by statistics its
weights hold. Here the token's arithmetic, both trunks given the statistics, the demonstrations'
statistics, and models without the key keeping the state_dict old checkpoints were saved with.
The whole path (`fleetrl sft` computing them from a LeRobot dataset, `runner.init_from` carrying
them into RL, evaluation) runs on Meta-World in tests/test_metaworld_pipeline.py."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from fleetrl.envs.demonstrations import Demonstrations
from fleetrl.models.transformer import TransformerPolicy
from fleetrl.workers.actor_base import shapes, weights_mismatch

SPACE = gym.spaces.Dict(
    {
        "state": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        "mission": gym.spaces.Box(0, 9, (4,), np.int64),  # token ids: never standardised
    }
)


def policy(standardize: bool) -> TransformerPolicy:
    torch.manual_seed(0)
    return TransformerPolicy(
        SPACE, 2, 5, embed_dim=8, num_layers=1, num_heads=2, shared_trunk=False, standardize_inputs=standardize
    )


def test_the_token_reads_the_standardised_vector_and_both_trunks_hold_the_statistics():
    model = policy(True)
    mean, std = np.array([0.5, -1.0, 2.0]), np.array([0.1, 1.0, 4.0])
    model.set_input_statistics({"state": (mean, std)})
    for trunk in (model, model.critic):
        token = trunk.inputs["state"]
        assert torch.equal(token.mean, torch.tensor(mean, dtype=torch.float32))
        assert torch.equal(token.std, torch.tensor(std, dtype=torch.float32))
    x = torch.tensor([[0.6, -1.0, 6.0], [0.5, 1.0, 2.0]])
    token = model.inputs["state"]
    expected = token.project(torch.tensor([[1.0, 0.0, 1.0], [0.0, 2.0, 0.0]])).unsqueeze(1)
    assert torch.allclose(token(x).tokens, expected, atol=1e-6)
    assert {"inputs.state.mean", "inputs.state.std", "critic.inputs.state.mean"} <= set(model.state_dict())
    assert not any(".mission." in key and key.endswith(("mean", "std")) for key in model.state_dict())


def test_without_the_key_the_weights_are_as_before():
    """No buffers: checkpoints saved before the key existed load into the default model, and the
    default model's outputs are the raw projection's."""
    plain, standardised = policy(False), policy(True)
    assert set(standardised.state_dict()) - set(plain.state_dict()) == {
        f"{trunk}inputs.state.{name}" for trunk in ("", "critic.") for name in ("mean", "std")
    }
    plain.load_state_dict({k: v for k, v in standardised.state_dict().items() if k in plain.state_dict()})
    obs = {"state": torch.randn(4, 3), "mission": torch.randint(1, 9, (4, 4))}
    # statistics 0 and 1 until set: the same outputs as the raw model with the same weights
    assert all(torch.equal(a, b) for a, b in zip(plain(obs), standardised(obs)))


def test_init_from_weights_with_or_without_the_statistics_are_refused_naming_the_setting():
    """`runner.init_from` of a run trained the other way: the keys that differ are named, and the
    setting that tells the two models apart; weights of the same keys, the shapes that differ."""
    plain, standardised = shapes(policy(False).state_dict()), shapes(policy(True).state_dict())
    without = weights_mismatch(standardised, plain)
    three = "critic.inputs.state.mean, critic.inputs.state.std, inputs.state.mean, ..."
    assert without.startswith(f"its weights have 4 missing ({three}) keys: the input statistics")
    assert "trained without model.standardize_inputs, so set model.standardize_inputs=false here" in without
    assert weights_mismatch(plain, standardised) == (
        f"its weights have 4 unexpected ({three}) keys: the input statistics; it was trained with "
        "model.standardize_inputs, so set it true here"
    )
    other = {**{k: v for k, v in plain.items() if k != "inputs.state.project.weight"}, "other.weight": (2,)}
    assert weights_mismatch(plain, other) == (
        "its weights have 1 missing (inputs.state.project.weight) and 1 unexpected (other.weight) keys"
    )
    wider = {**plain, "inputs.state.project.weight": (16, 3)}
    assert weights_mismatch(plain, wider) == (
        "1 of its tensors have other shapes (inputs.state.project.weight: [16, 3], here [8, 3])"
    )
    assert weights_mismatch(plain, plain) == ""  # nothing told apart: torch's own message is the reason


def test_the_demonstrations_statistics_per_element_and_constant_elements_only_centred():
    states = np.array([[1.0, 5.0, 0.0], [3.0, 5.0, 0.0], [2.0, 5.0, 0.0]], np.float32)
    demos = Demonstrations(
        {"state": states, "mission": np.ones((3, 4), np.int64)}, np.zeros((3, 2), np.float32), np.zeros(3), 1
    )
    ((key, (mean, std)),) = demos.statistics().items()
    assert key == "state"
    np.testing.assert_allclose(mean, [2.0, 5.0, 0.0])
    np.testing.assert_allclose(std, [np.sqrt(2 / 3), 1.0, 1.0])

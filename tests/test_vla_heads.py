"""The continuous action heads of `model.id: hf` (issue 41), in process, on a tiny PaliGemma and a
tiny SmolVLM: the flow expert's chain and the L1 head's Gaussian act in chunks of normalised
continuous actions, read the state token, and the loss path recomputes exactly the log-probability
acting drew (1e-5, the claim PPO's ratio rests on); imitation gives each head's supervised loss;
the keys a head does not read are exit 2."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.config.model_sections import FlowConfig, L1Config, LoraConfig
from fleetrl.errors import ConfigError
from fleetrl.models.hf.flow import FlowChain, denoise
from fleetrl.models.loss_outputs import ImitationOutputs
from fleetrl.non_finite import NonFiniteError
from fleetrl.plan.load import load_config
from fleetrl.plan.rules import check_spaces, validate
from fleetrl.probe import flight_recorder
from tests.vla_support import VLA_CONFIG, minigrid_batch, vla

BOX = gym.spaces.Box(np.array([-2.0, 0.0, -1.0], np.float32), np.array([2.0, 1.0, 1.0], np.float32))
FLOW = FlowConfig(steps=4, width=16, layers=1, heads=2)


@pytest.fixture(scope="module")
def with_state():
    """MiniGrid's observations plus a 5-wide proprioception key `state`."""
    observation_space, _, obs = minigrid_batch()
    spaces = dict(observation_space.spaces, state=gym.spaces.Box(-np.inf, np.inf, (5,), np.float32))
    obs = dict(obs, state=torch.randn(4, 5, generator=torch.Generator().manual_seed(0)))
    return gym.spaces.Dict(spaces), obs


def head_keys(head: str) -> dict:
    return {"action_head": head, "action_chunk": 2, **({"flow": FLOW} if head == "flow" else {})}


@pytest.mark.parametrize("head", ["flow", "l1"])
@pytest.mark.parametrize("family", ["paligemma", "smolvlm"])
def test_acting_time_log_probabilities_are_recomputed_by_the_loss_path(request, with_state, family, head):
    observation_space, obs = with_state
    policy = vla(request.getfixturevalue(f"tiny_{family}"), observation_space, BOX, **head_keys(head))
    assert policy.state_key == "state" and policy.action_chunk == 2 and policy.logprob_shape == (2,)
    torch.manual_seed(3)
    records, logprobs, values = policy.act(obs)
    steps = FLOW.steps + 1
    assert records.shape == ((4, steps, 2, 3) if head == "flow" else (4, 2, 3)) and logprobs.shape == (4, 2)
    outputs = policy(obs, records)
    assert torch.allclose(outputs.logprobs, logprobs, atol=1e-5, rtol=0), (outputs.logprobs - logprobs).abs().max()
    assert torch.allclose(outputs.value, values, atol=1e-5) and outputs.entropy.shape == (4, 2)
    env = policy.to_env(records)
    assert (
        env.shape == (4, 2, 3) and (env >= torch.as_tensor(BOX.low)).all() and (env <= torch.as_tensor(BOX.high)).all()
    )
    # the state token is read
    moved = dict(obs, state=obs["state"] + 1.0)
    torch.manual_seed(3)
    assert not torch.allclose(policy.act(moved)[0], records)
    # imitation: the head's own loss per chunk action on env actions, and the value
    imitation = policy(obs, env, imitation=True)
    assert isinstance(imitation, ImitationOutputs) and imitation.error.shape == (4, 2) and (imitation.error >= 0).all()


def test_the_flow_chain_acts_from_the_expert_and_deterministically_runs_the_ode(tiny_paligemma, with_state):
    observation_space, obs = with_state
    policy = vla(tiny_paligemma, observation_space, BOX, **head_keys("flow"))
    torch.manual_seed(0)
    first, logprob, _ = policy.act(obs, deterministic=True)
    torch.manual_seed(0)
    second, _, _ = policy.act(obs, deterministic=True)
    assert torch.equal(first, second) and (logprob == 0).all()  # no noise drawn but the start's
    # by hand: the ODE from the same start through the expert on the prompt's hidden states
    torch.manual_seed(0)
    noise = torch.randn(4, 2, 3)
    prefix, mask = policy.prefix(obs)
    with torch.no_grad():
        samples, _ = denoise(
            FlowChain(FLOW.steps, "ode"), lambda x, t: policy.expert(x, t, prefix, mask, obs["state"]), noise
        )
    assert torch.allclose(first, samples, atol=1e-6)
    expected = (samples[:, -1].clamp(-1, 1) + 1) / 2 * (torch.as_tensor(BOX.high) - torch.as_tensor(BOX.low))
    assert torch.allclose(policy.to_env(first), expected + torch.as_tensor(BOX.low), atol=1e-6)


def test_the_expert_runs_inside_the_denoise_phase_when_acting_and_in_the_loss_path(
    tiny_paligemma, with_state, monkeypatch
):
    """Where a hang inside the denoising loop is named (tests/test_vla_heads_watched.py makes one)."""
    observation_space, obs = with_state
    policy = vla(tiny_paligemma, observation_space, BOX, **head_keys("flow"))
    seen = []
    policy.expert.register_forward_pre_hook(lambda *_: seen.append(recorder.phase))
    recorder = flight_recorder.Recorder("rollout", 0, 0)
    monkeypatch.setattr(flight_recorder, "_recorder", recorder)
    with recorder.in_phase("rollout.act"):
        records, _, _ = policy.act(obs)
    with recorder.in_phase("actor.train"):
        policy(obs, records)
    assert seen == ["denoise"] * (FLOW.steps + 1)  # S steps of acting, one batched call of the loss path
    assert recorder.phases["denoise"].calls == 2 and recorder.phase is None


def test_the_l1_head_is_gaussian_around_the_regressed_chunk(tiny_smolvlm, with_state):
    observation_space, obs = with_state
    policy = vla(tiny_smolvlm, observation_space, BOX, action_head="l1", l1=L1Config(width=8, init_log_std=-2.0))
    mean, _, _ = policy.act(obs, deterministic=True)
    torch.manual_seed(0)
    sample, logprob, _ = policy.act(obs)
    std = np.exp(-2.0)
    by_hand = (-0.5 * ((sample - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)).sum(-1)
    assert sample.shape == (4, 1, 3) and logprob.shape == (4,)  # no chunks: one action, one log-prob
    assert torch.allclose(logprob, by_hand.flatten(), atol=1e-4)
    assert policy.network.head.log_std.requires_grad  # trained: the learned, state-independent log-std


CONTRADICTIONS = [
    ("model.action_head=flow model.decode=autoregressive", "model.decode"),
    ("model.action_head=l1 model.action_bins=128", "model.action_bins"),
    ("model.action_head=flow model.temperature=1.6", "model.temperature"),
    ("model.action_head=flow model.action_attention=bidirectional", "model.action_attention"),
    ("model.action_head=tokens model.flow.steps=5", "model.flow"),
    ("model.action_head=flow model.l1.width=8", "model.l1"),
    ("model.action_head=tokens model.state_key=proprio", "model.state_key"),
    ("model.action_head=flow model.flow.noise=ode", "model.flow.noise"),
    ("model.action_head=flow algorithm.logprob_type=token_level", "algorithm.logprob_type"),
]


@pytest.mark.parametrize("overrides, key", CONTRADICTIONS)
def test_a_key_the_head_does_not_read_is_exit_2_naming_it(overrides, key):
    with pytest.raises(ConfigError) as refused:
        validate(load_config(VLA_CONFIG, overrides.split()))  # the loader runs the rules already
    assert refused.value.key == key, refused.value


def test_the_heads_spaces_are_checked_before_any_model_loads(with_state):
    observation_space, _ = with_state
    config = load_config(VLA_CONFIG, ["model.action_head=flow"])
    check_spaces(config, observation_space, BOX)  # fine
    with pytest.raises(ConfigError, match="model.action_head.*a 1-D Box"):
        check_spaces(config, observation_space, gym.spaces.Discrete(7))
    typo = load_config(VLA_CONFIG, ["model.action_head=flow", "model.state_key=stat"])
    with pytest.raises(ConfigError, match="model.state_key.*did you mean 'state'"):
        check_spaces(typo, observation_space, BOX)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model.action_head=l1", "debug.fault={kind: hang_in_denoising, component: rollout}"], "debug.fault.kind"),
        (["model.action_head=flow", "debug.fault={kind: hang_in_denoising, component: env}"], "debug.fault.component"),
    ],
)
def test_a_hang_in_denoising_is_a_fault_of_a_flow_head_s_rollout_or_actor_only(overrides, key):
    with pytest.raises(ConfigError) as refused:
        validate(load_config(VLA_CONFIG, overrides))
    assert refused.value.key == key, refused.value


def test_a_non_finite_velocity_while_acting_is_an_incident_naming_the_denoising_step(tiny_paligemma, with_state):
    observation_space, obs = with_state
    policy = vla(tiny_paligemma, observation_space, BOX, **head_keys("flow"))
    calls = []

    def nan_at_step_2(module, inputs, output):
        calls.append(len(calls))
        return output.masked_fill(torch.tensor(len(calls) == 3), float("nan"))  # the third call: step 2

    policy.expert.register_forward_hook(nan_at_step_2)
    with pytest.raises(NonFiniteError) as raised:
        policy.act(obs)
    error = raised.value
    assert (error.what, error.key) == ("flow velocity", f"denoising step 2 of {FLOW.steps}"), error
    assert error.value != error.value and "observation 0 of the batch: x_3" in error.where  # NaN
    assert len(calls) == FLOW.steps  # the chain ran to its end, then was checked once


@pytest.mark.parametrize("head", ["flow", "l1"])
def test_a_bfloat16_vlm_with_lora_feeds_a_float32_head_and_the_log_probability_still_recomputes(
    tiny_paligemma, with_state, head
):
    observation_space, obs = with_state
    policy = vla(tiny_paligemma, observation_space, BOX, dtype="bfloat16", lora=LoraConfig(rank=2), **head_keys(head))
    assert policy.network.hf.dtype == torch.bfloat16
    assert {p.dtype for p in policy.network.head.parameters()} == {torch.float32}  # trained in full, in float32
    torch.manual_seed(3)
    records, logprobs, values = policy.act(obs)
    outputs = policy(obs, records)
    assert torch.allclose(outputs.logprobs, logprobs, atol=1e-5, rtol=0), (outputs.logprobs - logprobs).abs().max()
    assert torch.allclose(outputs.value, values, atol=1e-5)
    (outputs.logprobs.sum() + outputs.value.sum()).backward()
    untouched = [name for name, p in policy.named_parameters() if p.requires_grad and p.grad is None]
    assert untouched == []  # the adapters, the head and the value head all get a gradient


@pytest.mark.parametrize("head", ["tokens", "flow"])
def test_the_value_loss_trains_the_vlm_only_with_value_gradient_model(tiny_paligemma, with_state, head):
    """`model.value_gradient`: the value's gradient reaches the VLM's weights with `model` (the
    default) and only the value head's with `head`; the action's log-probability trains the VLM
    either way, and the value is the same number."""
    observation_space, obs = with_state
    values = {}
    for where in ("model", "head"):
        policy = vla(tiny_paligemma, observation_space, BOX, value_gradient=where, **head_keys(head))
        torch.manual_seed(3)
        records, _, _ = policy.act(obs)
        outputs = policy(obs, records)
        outputs.value.sum().backward()
        values[where] = outputs.value.detach()

        def reached(module: torch.nn.Module) -> bool:
            return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())

        assert reached(policy.network.value_head)
        assert reached(policy.network.model) == (where == "model"), where
        policy.zero_grad(set_to_none=True)
        policy(obs, records).logprobs.sum().backward()
        assert reached(policy.network.model)
    assert torch.equal(values["model"], values["head"])

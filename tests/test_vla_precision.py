"""A Hugging Face VLA's precision and memory keys on the real `model.id: hf` policy (issue 42):
`model.dtype: bfloat16` loads the base in bfloat16 and trains LoRA adapters in float32; the
combinations the precedence table forbids are exit 2; gradient checkpointing keeps fewer
activations for the same gradients; FSDP with CPU offload and checkpointing trains it on two ranks."""

from __future__ import annotations

import pytest
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.config.model_sections import LoraConfig
from fleetrl.errors import ConfigError
from fleetrl.parallel.wrap import enable_gradient_checkpointing
from fleetrl.plan.load import load_config
from tests.fsdp_transformer_ranks import SPACES, trajectory
from tests.ranks import spawn_ranks
from tests.vla_support import minigrid_batch, vla, vla_offload_rank, vla_overrides


def test_bfloat16_weights_train_float32_adapters_and_act_in_bfloat16(tiny_paligemma):
    config = load_config(None, vla_overrides(tiny_paligemma, "dtype: bfloat16"))
    worker = ActorWorker(config, *SPACES)
    dtypes = {name: p.dtype for name, p in worker.policy.named_parameters()}
    trainable = {name for name, p in worker.policy.named_parameters() if p.requires_grad}
    assert trainable and all(dtypes[name] == torch.float32 for name in trainable)  # adapters, value head
    assert {dtypes[name] for name in dtypes if name not in trainable} == {torch.bfloat16}  # the frozen base
    before = {name: p.detach().clone() for name, p in worker.policy.named_parameters() if p.requires_grad}
    metrics = worker.train(trajectory(config, 0), 0.0)
    assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values() if isinstance(value, float))
    moved = [
        name for name, p in worker.policy.named_parameters() if name in before and not torch.equal(p, before[name])
    ]
    assert moved
    from fleetrl.workers.rollout_worker import rollout_dtype

    assert rollout_dtype(config) == torch.bfloat16  # auto: the weights are bfloat16 already


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["rollout.dtype=float32"], "rollout.dtype"),
        (["actor.strategy=fsdp"], "model.dtype"),
    ],
)
def test_the_precedence_table_s_contradictions_are_exit_2(tiny_paligemma, overrides, key):
    with pytest.raises(ConfigError) as error:
        load_config(None, [*vla_overrides(tiny_paligemma, "dtype: bfloat16"), *overrides])
    assert error.value.key == key


def test_flash_attention_without_its_package_is_refused_before_anything_starts(tiny_paligemma, capsys):
    from fleetrl.cli import main
    from tests.vla_support import VLA_CONFIG

    args = ["train", str(VLA_CONFIG), f"model.path={tiny_paligemma}", "model.attn_implementation=flash_attention_2"]
    assert main([*args, "--dry-run"]) == 2
    assert "config error at 'model.attn_implementation'" in capsys.readouterr().err


def saved_bytes(policy, obs, actions) -> int:
    """Bytes autograd keeps for backward in one loss-path forward."""
    kept = []

    def pack(tensor):
        kept.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs = policy(obs, actions)
    (outputs.logprobs.sum() + outputs.value.sum()).backward()
    return sum(kept)


def test_gradient_checkpointing_keeps_fewer_activations_for_the_same_gradients(tiny_paligemma):
    observation_space, action_space, obs = minigrid_batch()
    plain = vla(tiny_paligemma, observation_space, action_space, lora=LoraConfig(rank=2))
    checkpointed = vla(tiny_paligemma, observation_space, action_space, lora=LoraConfig(rank=2))
    enable_gradient_checkpointing(checkpointed.network)
    actions = torch.tensor([0, 1, 2, 3])
    kept, recomputed = saved_bytes(plain, obs, actions), saved_bytes(checkpointed, obs, actions)
    assert recomputed < 0.6 * kept, (recomputed, kept)
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        if a.requires_grad:
            assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_fsdp_with_cpu_offload_and_checkpointing_trains_the_vla_on_two_ranks(tiny_paligemma):
    runs = spawn_ranks(vla_offload_rank, str(tiny_paligemma), world=2, timeout_s=300)
    assert all(run["units"] > 2 and run["finite"] and run["moved"] for run in runs), runs
    assert runs[0]["policy_loss"] == pytest.approx(runs[1]["policy_loss"])  # one all-reduced update

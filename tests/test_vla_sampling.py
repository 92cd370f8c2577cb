"""Sampling a VLA's token actions as the anchors do (issue 42): `model.temperature` and
`model.top_k` shape the distribution acting samples from and the loss path scores alike, and the
autoregressive path decodes a chunk of several multi-token actions with the KV cache, one token
per pass after the prompt's, agreeing with the teacher-forced loss path."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from tests.vla_support import minigrid_batch, vla


def test_temperature_divides_the_bins_logits_in_acting_and_in_the_loss_path(tiny_paligemma):
    observation_space, action_space, obs = minigrid_batch()
    plain = vla(tiny_paligemma, observation_space, action_space)
    hot = vla(tiny_paligemma, observation_space, action_space, temperature=1.6)  # RLinf's LIBERO setting
    with torch.no_grad():
        log_p, _ = plain.distribution(obs)
        hot_log_p, _ = hot.distribution(obs)
    assert torch.allclose(hot_log_p, torch.log_softmax(log_p / 1.6, dim=-1), atol=1e-5)
    actions, log_probs, _ = hot.act(obs)
    assert torch.allclose(hot(obs, actions).logprobs, log_probs, atol=1e-5)


def test_top_k_samples_only_the_k_most_likely_bins_and_scores_them_so(tiny_paligemma):
    observation_space, action_space, obs = minigrid_batch()
    policy = vla(tiny_paligemma, observation_space, action_space, top_k=2)
    with torch.no_grad():
        log_p, _ = policy.distribution(obs)
    allowed = log_p.topk(2, dim=-1).indices.squeeze(1)  # (B, 2): each sample's two most likely actions
    seen = torch.stack([policy.act(obs)[0] for _ in range(40)], dim=1)  # (B, 40)
    assert all(set(seen[b].tolist()) <= set(allowed[b].tolist()) for b in range(len(seen)))
    assert all(len(set(seen[b].tolist())) == 2 for b in range(len(seen)))  # both of them, not only the first
    outputs = policy(obs, seen[:, 0])
    assert torch.isfinite(outputs.logprobs).all() and (outputs.entropy <= np.log(2) + 1e-5).all()


def test_a_chunk_of_multi_token_actions_decodes_with_the_kv_cache_as_the_loss_path_scores_it(tiny_paligemma):
    """Two-dimensional Box actions in chunks of 3: six tokens, sampled one per pass after the
    prompt's with the cache; the loss path's teacher-forced pass gives the same log-probs."""
    observation_space, _, obs = minigrid_batch()
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = vla(tiny_paligemma, observation_space, box, decode="autoregressive", action_chunk=3)
    lengths = []
    hook = policy.network.hf.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        actions, log_probs, _ = policy.act(obs)
    finally:
        hook.remove()
    prompt = policy.prompts.tokens(obs, torch.device("cpu"))[0].shape[1]
    assert lengths == [prompt, 1, 1, 1, 1, 1]  # the prompt once, then each next token on the cache
    assert actions.shape == (4, 3, 2) and log_probs.shape == (4, 3, 2)
    assert torch.allclose(policy(obs, actions).logprobs, log_probs, atol=1e-4)


def test_bidirectional_action_attention_lets_every_action_position_see_the_others(tiny_paligemma, published):
    """OFT's parallel decoding: with `model.action_attention: bidirectional` the first action
    token's distribution depends on the later action positions; the prompt's outputs do not
    change; acting and the loss path still agree (PaliGemma's prefix-LM and Qwen's causal LM)."""
    observation_space, _, obs = minigrid_batch()
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    for folder in (tiny_paligemma, published("qwen2_vl")):
        causal = vla(folder, observation_space, box)
        both = vla(folder, observation_space, box, action_attention="bidirectional")
        with torch.no_grad():
            log_p, value = causal.distribution(obs)
            both_log_p, both_value = both.distribution(obs)
        assert torch.allclose(value, both_value, atol=1e-6)  # read before the first action position
        assert not torch.allclose(log_p[:, 0], both_log_p[:, 0], atol=1e-6)
        actions, log_probs, _ = both.act(obs)
        assert torch.allclose(both(obs, actions).logprobs, log_probs, atol=1e-5)

"""`Policy`: a network plus the action distribution its action space calls for.

The network is the built-in MLP (`model.id: mlp`; image and Dict observations go through the
encoders of models/encoders.py first), the built-in transformer (`model.id: transformer`,
models/transformer.py), or the user's own (`model.id: module:attr`). A user network is built as `Net(observation_space, num_action_params, **model.kwargs)` and its
`forward(obs)` returns `(action_params, value)`: action_params of shape (B, num_action_params) —
logits for Discrete actions, Gaussian means for Box actions — and value of shape (B,); a network
with an auxiliary prediction (the transformer's `model.predict_keys`) returns its per-sample
error (B,) third. fleetrl owns
the Gaussian's state-independent log std. docs/guides/model.md ("Your own network") has an example.

`forward(obs, actions)` is the loss path (what DDP wraps): `LossOutputs`; `act` is inference only.
`to_env(records)` turns what `act` returned and the trajectory records into the env's actions:
every policy a rollout worker acts with has it (here the identity: the record is the action).

Token policies (`model.action_bins`): a 1-D Box action becomes K tokens (one per dimension), each
a categorical over `action_bins` values (`ActionTokens`). Their log-probs and entropies are
per token, shape (B, K) (`logprob_shape == (K,)`); a loss aggregates them (e.g. as
`algorithm.logprob_type` / `entropy_type` say). Every other policy returns (B,).

Action chunks (`model.action_chunk` K > 1): one inference emits K actions. The network emits K
times the parameters of one action (the transformer: K action queries, K·d for a token policy),
and the Policy splits them on a chunk axis: actions (B, K, *one action), log-probs and entropies
per action (B, K) — per token (B, K, d) for a token policy — and the value (B,) of the decision.
A loss combines them over the actions the env actually executed (`Trajectory.steps`).

`distribution_inputs(params)` is the tensor that fixes the action distribution — normalised
log-probs for categorical and token policies, [mean, log std] for Gaussian ones — and `kl(old,
new)` compares two of them (a behavioural-cloning term).
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from fleetrl.config.model_sections import ModelConfig
from fleetrl.entry_points import resolve_entry_point
from fleetrl.models.distributions import (
    ActionTokens,
    Categorical,
    DiagonalGaussian,
    categorical_kl,
    gaussian_kl,
    num_action_params,
)
from fleetrl.models.encoders import ObservationEncoder
from fleetrl.models.loss_outputs import LossOutputs
from fleetrl.models.mlp import ActorCriticMLP
from fleetrl.models.transformer import TransformerPolicy
from fleetrl.observations import needs_encoder


def build_network(config: ModelConfig, observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
    per_query = num_action_params(action_space)
    queries = config.action_chunk  # one per action of a chunk; per action dimension for token policies
    if config.action_bins is not None:
        queries, per_query = queries * per_query, config.action_bins  # one logit per value of each dimension
    params = queries * per_query
    if config.id == "mlp":
        encoder = None
        if needs_encoder(observation_space):
            encoder = ObservationEncoder(observation_space, config.image_encoder, config.embed_dim)
        return ActorCriticMLP(
            observation_space,
            params,
            config.hidden_sizes,
            config.activation,
            config.shared_trunk,
            config.ortho_init,
            encoder,
        )
    if config.id == "transformer":
        return TransformerPolicy(
            observation_space,
            queries,
            per_query,
            config.embed_dim,
            config.num_layers,
            config.num_heads,
            config.patch_size,
            config.keypoints,
            config.shared_trunk,
            tuple(config.critic_keys),
            tuple(config.predict_keys),
            config.standardize_inputs,
        )
    return resolve_entry_point("model.id", config.id)(observation_space, params, **config.kwargs)


def hf_policy_class(action_head: str) -> type[nn.Module]:
    """The `model.id: hf` policy class of an action head."""
    if action_head == "flow":
        from fleetrl.models.hf.flow_policy import FlowVLAPolicy

        return FlowVLAPolicy
    if action_head == "l1":
        from fleetrl.models.hf.l1_policy import L1VLAPolicy

        return L1VLAPolicy
    from fleetrl.models.hf.policy import VLAPolicy

    return VLAPolicy


class Policy(nn.Module):
    def __init__(
        self,
        network: nn.Module,
        action_space: gym.Space,
        init_log_std: float = 0.0,
        action_bins: int | None = None,
        action_chunk: int = 1,
        token_readout: str = "mode",
    ):
        super().__init__()
        self.network = network
        self.action_chunk = action_chunk
        self.token_readout = token_readout
        self.tokens = ActionTokens(action_space, action_bins) if action_bins is not None else None
        self.continuous = isinstance(action_space, gym.spaces.Box) and self.tokens is None
        if self.continuous:
            self.log_std = nn.Parameter(torch.full(action_space.shape, float(init_log_std)))
        # shape of one sample's log-prob in trajectories: per token for token policies
        self.logprob_shape: tuple = (self.tokens.count,) if self.tokens is not None else ()
        if action_chunk > 1:
            self.logprob_shape = (action_chunk, *self.logprob_shape)

    @classmethod
    def from_config(cls, config: ModelConfig, observation_space, action_space) -> Policy:
        """The policy `config` describes; with `model.id: hf` the policy of its `model.action_head`
        (models/hf/: policy.py for tokens, l1_policy.py, flow_policy.py), which has this interface
        (imported only then: transformers is the optional `vla` extra)."""
        if config.id == "hf":
            return hf_policy_class(config.action_head).from_config(config, observation_space, action_space)
        return cls(
            build_network(config, observation_space, action_space),
            action_space,
            config.init_log_std,
            config.action_bins,
            config.action_chunk,
            config.token_readout,
        )

    def split(self, params: torch.Tensor) -> torch.Tensor:
        """(B, K·P) network output → (B, K, P): one row of action parameters per chunk action."""
        return params.unflatten(-1, (self.action_chunk, -1)) if self.action_chunk > 1 else params

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> LossOutputs:
        """Loss path: log-prob of `actions`, entropy and value, all (B,); for token policies the
        log-prob and entropy are per token, (B, K); with chunks per action, (B, K[, d])."""
        params, value, *prediction = self.network(obs)
        error = prediction[0] if prediction else None
        params = self.split(params)
        if self.tokens is not None:
            log_p = self.tokens.log_probs(params)
            return LossOutputs(
                Categorical.log_prob(log_p, self.tokens.encode(actions)), Categorical.entropy(log_p), value, error
            )
        if self.continuous:
            return LossOutputs(
                DiagonalGaussian.log_prob(params, self.log_std, actions),
                DiagonalGaussian.entropy(params, self.log_std),
                value,
                error,
            )
        log_p = Categorical.normalize(params)
        return LossOutputs(Categorical.log_prob(log_p, actions), Categorical.entropy(log_p), value, error)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False):
        """Inference: (actions, their log-probs, values). Token policies return the tokens'
        action values and per-token log-probs (B, K); chunk policies (B, K, ...) (module docstring).
        A deterministic token policy with `token_readout` `expected` acts with each dimension's
        expected value, and reports its mode tokens' log-probs."""
        params, value = self.network(obs)[:2]
        params = self.split(params)
        if self.tokens is not None:
            log_p = self.tokens.log_probs(params)
            tokens = Categorical.mode(log_p) if deterministic else Categorical.sample(log_p)
            if deterministic and self.token_readout == "expected":
                return self.tokens.expected(log_p), Categorical.log_prob(log_p, tokens), value
            return self.tokens.decode(tokens), Categorical.log_prob(log_p, tokens), value
        if self.continuous:
            actions = params if deterministic else DiagonalGaussian.sample(params, self.log_std)
            return actions, DiagonalGaussian.log_prob(params, self.log_std, actions), value
        log_p = Categorical.normalize(params)
        actions = Categorical.mode(log_p) if deterministic else Categorical.sample(log_p)
        return actions, Categorical.log_prob(log_p, actions), value

    @torch.no_grad()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.network(obs)[1]

    def to_env(self, records: torch.Tensor) -> torch.Tensor:
        """The env's actions for `act`'s: the same (this policy records the action itself)."""
        return records

    def distribution_inputs(self, params: torch.Tensor) -> torch.Tensor:
        """The network's action parameters → the tensor that fixes the action distribution (see
        the module docstring); `kl` compares two of them."""
        if self.tokens is not None:
            return self.tokens.log_probs(params)
        if self.continuous:
            return torch.cat([params, self.log_std.expand_as(params)], dim=-1)
        return Categorical.normalize(params)

    def kl(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """Per-sample KL(old ‖ new) between two `distribution_inputs` (B,): of the whole action,
        so summed over a token policy's tokens and a Gaussian's dimensions."""
        if self.tokens is not None:
            return categorical_kl(old, new).sum(-1)
        if self.continuous:
            old_mean, old_log_std = old.chunk(2, dim=-1)
            new_mean, new_log_std = new.chunk(2, dim=-1)
            return gaussian_kl(old_mean, old_log_std, new_mean, new_log_std)
        return categorical_kl(old, new)

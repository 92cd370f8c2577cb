"""PPO's `algorithm` section and the rules on it (`algorithm.name: ppo`; algorithms built on PPO extend both).

Each key's type, choices and range stand on its field (checked by the loader); the functions here
are the rules that relate several keys, run through PPO's registered spec: `validate_ppo` once
the config is read, `check_ppo_layout` once the actor world size is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fleetrl.config.constraints import AtLeastOne, Finite, NonNegative, Positive, UnitInterval
from fleetrl.config.keys import effective_minibatch_size, get, minibatch_key
from fleetrl.config.schema import AlgorithmConfig, Config
from fleetrl.errors import ConfigError


@dataclass
class PPOConfig(AlgorithmConfig):
    """Proximal Policy Optimization's own keys (Schulman et al. 2017; docs: concepts/algorithms.md,
    PPO)."""

    gae_lambda: Annotated[float, UnitInterval] = 0.95
    """GAE's λ: bias (0) against variance (1) of the advantages."""
    update_epochs: Annotated[int, Positive] = 4
    """Passes over each iteration's data."""
    clip_coef: Annotated[float, NonNegative] = 0.2
    """ε of the clipped probability ratio, 1 ± ε."""
    anneal_clip: bool = False
    """Decay `clip_coef` linearly to 0 over the run, as RL-Zoo's `lin_0.2`."""
    clip_vloss: bool = False
    """Clip the value update around the old values (by `clip_coef`)."""
    vf_coef: Annotated[float, NonNegative] = 0.5
    """Weight of the value loss."""
    ent_coef: Annotated[float, Finite] = 0.0
    """Weight of the entropy bonus; below 0 a penalty, which sharpens the policy. (It does not make a
    deterministic evaluation follow what RL taught the samples: it sharpens each state's current mode,
    and on Meta-World it cost the argmax policy 19 points, the sampled 14: docs/benchmarks/metaworld.md.)"""
    norm_adv: bool = True
    """Normalise advantages per minibatch (false with `adv_type: grpo`)."""
    critic_warmup_steps: Annotated[int, NonNegative] = 0
    """Env steps (counted as `runner.total_env_steps`) at the start of the run that train the value
    function alone: the policy loss and entropy bonus are left out of the loss. For RL started from
    a supervised policy (`runner.init_from`), whose critic has never seen its own returns: the first
    updates' advantages would otherwise be noise that undoes the supervised policy (docs:
    guides/manipulation.md). A network whose policy and value share layers (the transformer) still
    moves its policy a little through them: `approx_kl` shows how much."""
    kl_coef: Annotated[float, NonNegative] = 0.0
    """Weight of a KL penalty to the reference policy — the weights the run started from
    (`runner.init_from`, which it needs): each sample's k3 estimate exp(d) − d − 1, d = log π_ref − log π
    of the taken action at `logprob_type`'s level, averaged like the other terms; the metric
    `reference_kl` is its mean. Holds RL near a supervised start. The reference is a second copy of
    the policy on every actor rank and in every checkpoint, and costs one forward pass without
    gradients over each update's batch (docs: concepts/algorithms.md, KL to the reference). 0: none."""
    target_kl: Annotated[float, Positive] | None = None
    """Stop the epoch loop once the approximate KL exceeds this (agreed across ranks; null: never)."""
    adv_type: Literal["gae", "grpo", "vtrace"] = "gae"
    """`gae`; `grpo`: an episode's (return − group mean) / group std over episodes that started from
    one state (docs: concepts/algorithms.md, GRPO advantages); `vtrace`: IMPALA's V-trace targets and
    advantages, from the actor's policy and critic at the update's start, corrected for the policy
    that acted (docs: concepts/algorithms.md, Samples an older policy acted)."""
    max_staleness: Annotated[int, NonNegative] | None = None
    """Drop (and count) batches holding a sample more than this many policy versions old when it would
    be trained: a sample's age is the actor's version at the update's start minus the version that
    acted, one version per update (`runner.weight_sync_interval` and `runner.asynchronous` make
    samples old; docs: concepts/async.md). null: none dropped."""
    off_policy_correction: Literal["auto", "none", "decoupled"] = "auto"
    """`decoupled`: the clipped ratio is to the proximal policy (the actor's weights at the update's
    start: one extra forward pass over the batch, or `proximal_logprob`'s approximation), and each
    sample's term is weighed by the truncated importance weight min(`importance_cap`, π_proximal /
    π_acting) (Hilton et al. 2021), for samples an older policy acted; `none`: PPO's ratio to the
    acting policy; `auto`: `decoupled` with `runner.asynchronous`, else `none` (docs:
    concepts/algorithms.md, Samples an older policy acted)."""
    proximal_logprob: Literal["forward", "loglinear"] = "forward"
    """Where the decoupled objective's proximal log-probs come from: `forward`, the forward pass over
    the batch at the update's start; `loglinear` (AReaL's proximal log-probability approximation),
    none: log π_proximal ≈ log π_acting + α (log π_θ − log π_acting), the log-prob recorded at acting
    and the trained policy's (no gradient through it) interpolated by the sample's age a in policy
    versions, α = a / (a + 1) — exact for samples 0 versions old. Needs `runner.asynchronous` and the
    decoupled objective, not `adv_type: vtrace` (docs: concepts/async.md, The proximal policy
    without a forward pass)."""
    importance_cap: Annotated[float, Positive] = 1.0
    """ρ̄: the truncation of the importance weight π_proximal / π_acting, in the decoupled objective and
    in V-trace's targets."""
    trace_cap: Annotated[float, Positive] = 1.0
    """c̄ of V-trace (`adv_type: vtrace`): the traces λ·min(c̄, π_proximal / π_acting) that carry
    corrections back through time."""
    group_size: Annotated[int, AtLeastOne] = 8
    """`grpo`: envs i … i+g−1 (consecutive, g = group_size) are reset with one seed each iteration and
    form a group (at least 2, a divisor of the envs per actor rank)."""
    logprob_type: Literal["chunk_level", "action_level", "token_level"] = "action_level"
    """One clipped PPO ratio per executed action (its tokens' log-probs summed); `chunk_level`: one
    per decision, over a chunk's executed actions; `token_level` (needs `model.action_bins`): one per
    token, averaged (fleetrl/algos/common/logprobs.py; docs: guides/action-chunks-and-fsdp.md)."""
    entropy_type: Literal["chunk_level", "action_level", "token_level"] = "action_level"
    """The entropy bonus summed over an action's tokens and averaged over a chunk's executed actions;
    `chunk_level`: summed over them; `token_level` (needs `model.action_bins`): the mean per token."""

    @property
    def resets_envs_each_iteration(self) -> bool:
        return self.adv_type == "grpo"

    @property
    def reset_group_size(self) -> int:
        return self.group_size if self.adv_type == "grpo" else 1

    @property
    def staleness_bound(self) -> int | None:
        return self.max_staleness


def decoupled(config: Config) -> bool:
    """Whether PPO's ratio is to the proximal policy, weighed by the truncated importance weight
    (`algorithm.off_policy_correction`; `auto`: in asynchronous training)."""
    correction = config.algorithm.off_policy_correction
    return correction == "decoupled" or (correction == "auto" and config.runner.asynchronous)


def interpolates_proximal(config: Config) -> bool:
    """Whether the decoupled objective's proximal log-probs are interpolated by each sample's age
    (`algorithm.proximal_logprob: loglinear`) instead of computed by a forward pass."""
    return decoupled(config) and config.algorithm.proximal_logprob == "loglinear"


def needs_proximal_pass(config: Config) -> bool:
    """Whether an update starts with a forward pass over its batch at the actor's current weights:
    for the decoupled objective's proximal log-probs (unless interpolated), or V-trace's log-probs
    and values."""
    return (decoupled(config) and not interpolates_proximal(config)) or config.algorithm.adv_type == "vtrace"


def reference_kl_coef(config: Config) -> float:
    """`algorithm.kl_coef`: the weight of the KL to the reference policy; 0 for an algorithm whose
    section has no such key (behaviour cloning's, which builds on PPO's actor)."""
    algo = config.algorithm
    return algo.kl_coef if isinstance(algo, PPOConfig) else 0.0


def validate_ppo(config: Config) -> None:
    """Token-level ratios and entropies, GRPO advantages, the KL to the reference, and the
    minibatch dividing the batch."""
    algo, model = config.algorithm, config.model
    for key in ("algorithm.logprob_type", "algorithm.entropy_type"):
        if get(config, key) == "token_level" and not model.emits_tokens:
            raise ConfigError(
                key,
                "token_level",
                "'action_level' or 'chunk_level' for a policy that emits no tokens",
                "token_level needs a policy that emits tokens (model.action_bins; with model.id hf, "
                "model.action_head tokens)",
            )
    if algo.adv_type == "grpo":
        if algo.group_size < 2:
            raise ConfigError("algorithm.group_size", algo.group_size, "an integer >= 2 with adv_type grpo")
        if config.env.num_envs % algo.group_size:
            raise ConfigError(
                "algorithm.group_size",
                algo.group_size,
                f"a divisor of env.num_envs ({config.env.num_envs}): groups are consecutive envs",
            )
        if algo.norm_adv:
            raise ConfigError(
                "algorithm.norm_adv",
                True,
                "false with algorithm.adv_type grpo",
                "group-relative advantages are normalised within each group already, and "
                "steps outside complete episodes must keep advantage 0",
            )
    if algo.kl_coef > 0:
        validate_reference(config)
    if algo.proximal_logprob == "loglinear":
        validate_loglinear(config)
    if config.batch_size % effective_minibatch_size(config):
        key = minibatch_key(config)
        raise ConfigError(
            key,
            get(config, key),
            f"a divisor of the batch algorithm.num_steps * env.num_envs = "
            f"{algo.num_steps} * {config.env.num_envs} = {config.batch_size}",
        )


def validate_reference(config: Config) -> None:
    """`algorithm.kl_coef` > 0 needs the weights it holds the policy near (`runner.init_from`) and a
    checkpoint that can keep them (the full format)."""
    coef = config.algorithm.kl_coef
    if config.runner.init_from is None:
        raise ConfigError(
            "algorithm.kl_coef",
            coef,
            "0.0 without runner.init_from (or set runner.init_from to the run or checkpoint to stay near)",
            "the KL is to the reference policy, the weights the run starts from; a run from random "
            "weights has none to be held near",
        )
    if config.actor.checkpoint_format != "full":
        raise ConfigError(
            "algorithm.kl_coef",
            coef,
            f"0.0 with actor.checkpoint_format {config.actor.checkpoint_format!r} (or actor.checkpoint_format full)",
            "the reference policy is kept in the checkpoint beside the policy, which the full format holds",
        )


def validate_loglinear(config: Config) -> None:
    """`algorithm.proximal_logprob: loglinear` approximates the decoupled objective's proximal
    policy from each sample's age, which the asynchronous controller hands the actor; V-trace's
    targets need the proximal policy's values, which only the forward pass gives."""
    key, value = "algorithm.proximal_logprob", "loglinear"
    if not config.runner.asynchronous:
        raise ConfigError(
            key,
            value,
            "'forward' in synchronous training (or runner.asynchronous true)",
            "the interpolation weighs each sample by its age in policy versions, which the actor is "
            "given in asynchronous training only",
        )
    if not decoupled(config):
        raise ConfigError(
            key,
            value,
            f"'forward' with algorithm.off_policy_correction {config.algorithm.off_policy_correction!r} "
            "(or off_policy_correction decoupled or auto)",
            "it approximates the decoupled objective's proximal policy, which PPO's ratio to the acting "
            "policy has none of",
        )
    if config.algorithm.adv_type == "vtrace":
        raise ConfigError(
            key,
            value,
            "'forward' with algorithm.adv_type vtrace",
            "V-trace's targets are computed before the update from the proximal policy's log-probs and "
            "values: the forward pass runs for them anyway",
        )


def check_ppo_layout(config: Config, world: int) -> None:
    """GRPO groups never span actor ranks; the KL's reference policy is a full copy on every rank,
    never an FSDP shard."""
    algo = config.algorithm
    if algo.kl_coef > 0 and world > 1 and config.actor.strategy == "fsdp":
        raise ConfigError(
            "algorithm.kl_coef",
            algo.kl_coef,
            f"0.0 with actor.strategy fsdp over {world} actor ranks (or actor.strategy ddp)",
            "the reference policy is a full, unsharded copy of the policy on every rank; sharded "
            "actors are not supported",
        )
    if algo.adv_type == "grpo" and (config.env.num_envs // world) % algo.group_size:
        raise ConfigError(
            "algorithm.group_size",
            algo.group_size,
            f"a divisor of the envs per actor rank env.num_envs / {world} = "
            f"{config.env.num_envs // world} (a group must not span actor ranks)",
        )

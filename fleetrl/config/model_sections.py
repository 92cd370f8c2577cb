"""The `model:` section, one dataclass per kind of model, chosen by `model.id`.

As the `algorithm` section is its algorithm's own dataclass (chosen by `algorithm.name`), the
`model` section is its model's: `mlp`, `transformer` and `hf` each hold the keys that model
reads, and any other id (`module:attr`, a network of your own) holds `CustomModelConfig`'s. A key
of another kind is therefore an unknown key (exit 2 naming the kinds that have it), never a value
silently ignored. `ModelConfig` holds what every kind reads; code that takes any model types its
argument as `ModelConfig` and reads a kind's own keys only after checking `id` (or through the
properties below, which every kind answers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from fleetrl.config.constraints import (
    ActionStats,
    AtLeastOne,
    Finite,
    Note,
    Positive,
    PromptTemplate,
    Range,
    UnitInterval,
)

DEFAULT_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"  # OpenVLA's
FLOAT16 = Note("float16 is not offered: it needs loss scaling, which fleetrl does not do; bfloat16 does not")


@dataclass
class ModelConfig:
    """The policy network: fleetrl's MLP or transformer, a Hugging Face VLA, or one of your own.
    `model.id` chooses the kind; the keys below it are each kind's own."""

    id: str = "mlp"
    """`mlp`, `transformer`, `hf` (a Hugging Face VLA folder: `model.path`), or `module:attr` naming an
    `nn.Module` class of your own (docs: guides/model.md). A key of another kind is an error that
    says whose it is."""
    action_chunk: Annotated[int, AtLeastOne] = 1
    """Actions per inference (K), any model: the env executes them as consecutive env steps, stopping
    at an episode's end; one decision per chunk, its reward discounted within it (docs:
    guides/action-chunks-and-fsdp.md)."""
    action_bins: Annotated[int, Range(2)] | None = None
    """Box actions as tokens: each dimension (of each chunked action) discretised into this many
    evenly spaced values, one categorical each (null: a Gaussian; docs: guides/model.md, Token-level
    action policies)."""
    token_readout: Literal["mode", "expected"] = "mode"
    """A token policy's deterministic action (evaluations; sampling is unchanged): `mode`, each
    dimension's most likely bin; `expected`, the bins' values weighted by their probabilities, which
    may lie between two bins. `fleetrl eval` takes it as an override (docs: guides/model.md,
    Token-level action policies). Fleetrl's own networks only: a VLA chooses its action tokens one
    after another."""

    @property
    def prediction_weight(self) -> float | None:
        """The weight of the policy's auxiliary prediction loss; None: the policy predicts nothing."""
        return None

    @property
    def emits_tokens(self) -> bool:
        """Whether the policy's actions are tokens (per-token log-probs, `token_level` ratios)."""
        return self.action_bins is not None


@dataclass
class MlpModelConfig(ModelConfig):
    """With `model.id: mlp`: fleetrl's MLP, image keys through a CNN encoder first."""

    id: str = "mlp"
    """`mlp`."""
    hidden_sizes: list[Annotated[int, Positive]] = field(default_factory=lambda: [64, 64])
    """The trunk's hidden layers (`[]`: the heads read the observation, or its encoder's features,
    directly); an off-policy algorithm builds its actor and critics from them too."""
    activation: Literal["tanh", "relu", "elu", "gelu"] = "tanh"
    """The activation between the hidden layers (and those of the networks an algorithm builds from
    `hidden_sizes` itself, such as an actor-critic's separate critics)."""
    shared_trunk: bool = False
    """One trunk for policy and value, or one each (the default): one each keeps the value loss's
    gradients out of the policy."""
    init_log_std: Annotated[float, Finite] = 0.0
    """Initial log std of the Gaussian policy (Box actions)."""
    ortho_init: bool = True
    """Orthogonal initialisation: hidden layers and encoders with gain √2, the policy head 0.01, the
    value head 1 (as CleanRL and SB3); an auxiliary value head an algorithm adds too."""
    image_encoder: Literal["auto", "nature_cnn", "grid_cnn", "flatten"] = "auto"
    """The encoder of image keys (`auto`: `nature_cnn` from 36 pixels a side, `grid_cnn` from 7,
    `flatten` below; docs: guides/model.md, Images, instructions and the transformer policy)."""
    embed_dim: Annotated[int, Positive] = 64
    """Width of the text encoder's token embeddings (an instruction observation)."""


@dataclass
class TransformerModelConfig(ModelConfig):
    """With `model.id: transformer`: fleetrl's transformer over image patches (or keypoints),
    instruction words and vectors (docs: guides/model.md)."""

    id: str = "transformer"
    """`transformer`."""
    embed_dim: Annotated[int, Positive] = 64
    """Width of the token embeddings and of every block."""
    num_layers: Annotated[int, Positive] = 2
    """The number of blocks."""
    num_heads: Annotated[int, Positive] = 4
    """Attention heads per block (a divisor of `embed_dim`)."""
    patch_size: Annotated[int, Positive] | None = None
    """Image patch side in pixels (null: about 7×7 patches per image; 1 for a 7×7 grid, one token per
    cell)."""
    keypoints: Annotated[int, Positive] | None = None
    """Read each image as this many learned keypoints instead of patches: a small CNN's feature maps,
    each reduced by a softmax over its positions to the expected (x, y) of its activation, one token
    each (Levine et al. 2016; docs: guides/manipulation.md)."""
    shared_trunk: bool = True
    """One trunk for policy and value (the default: the value is one more query), or one each."""
    critic_keys: list[str] = field(default_factory=list)
    """With `shared_trunk: false`: observation keys only the critic's trunk reads, never the
    policy's: an asymmetric critic (Pinto et al. 2018) that knows the simulator's true state
    (`PandaTasks`' `sim_state`) while the policy acts from its camera (docs: guides/manipulation.md)."""
    predict_keys: list[str] = field(default_factory=list)
    """With `keypoints`: observation keys the policy's image keypoints learn to predict (a linear
    read-out, an auxiliary regression loss in every training step; Levine et al. 2016). The policy
    never reads them: the simulator's state (`PandaTasks`' `sim_state`) teaches the camera's
    keypoints where things are (docs: guides/manipulation.md)."""
    predict_coef: Annotated[float, Positive] = 100.0
    """Weight of the `predict_keys` loss: the mean squared error of the prediction, in the keys' own
    units (metres for `sim_state`: an error of 10 cm costs 1)."""
    standardize_inputs: bool = False
    """Centre and scale each element of every float vector input (a state, proprioception) by its
    mean and standard deviation over the behaviour-cloning demonstrations before the input's
    token projection. `fleetrl sft` computes them; they are part of the weights (checkpoints,
    `runner.init_from`, evaluation), so the RL stage's config must set this too. Meta-World's raw
    state mixes positions that vary by centimetres with quaternion elements near 1: one linear
    token of it resolves a goal's position slowly (docs: guides/model.md)."""
    init_log_std: Annotated[float, Finite] = 0.0
    """Initial log std of the Gaussian policy (Box actions without `action_bins`)."""

    @property
    def prediction_weight(self) -> float | None:
        return self.predict_coef if self.predict_keys else None


@dataclass
class CustomModelConfig(ModelConfig):
    """With `model.id: module:attr`: a network class of your own (docs: guides/model.md)."""

    id: str = ""
    """The `module:attr` of your network class (there is no default one)."""
    kwargs: dict = field(default_factory=dict)
    """Passed to the network's constructor after the observation space and the number of action
    parameters (checked against its signature before anything starts)."""
    init_log_std: Annotated[float, Finite] = 0.0
    """Initial log std of the Gaussian policy (Box actions without `action_bins`)."""
    ortho_init: bool = True
    """Orthogonal initialisation (gain 1) of an auxiliary value head an algorithm adds to the network."""


@dataclass
class LoraConfig:
    """`model.lora`: LoRA adapters through peft (docs: guides/vla.md); only they and the value head
    train."""

    rank: Annotated[int, Positive] = 32
    """r: the adapters' inner dimension (RLinf trains OpenVLA-OFT at 32)."""
    alpha: Annotated[float, Positive] = 32.0
    """lora_alpha: the update is scaled by alpha / rank."""
    dropout: Annotated[float, UnitInterval] = 0.0
    """lora_dropout (0: acting and the loss path see the same model)."""
    target_modules: list[str] | None = None
    """Module names to adapt (null: every linear layer but the output head, peft's `all-linear`)."""


@dataclass
class FlowConfig:
    """`model.flow`, with `model.action_head: flow`: the flow-matching action expert and its
    denoising chain (docs: guides/vla.md, Continuous actions)."""

    steps: Annotated[int, AtLeastOne] = 10
    """Euler steps from noise to the action chunk, in acting and in the loss path (π0's 10): each
    one forward of the expert."""
    noise: Literal["sde", "ode"] = "sde"
    """`sde`: a stochastic chain (πRL's flow-SDE, a fixed noise schedule) whose log-probability the RL
    algorithms train on; `ode`: the deterministic chain (supervised training and evaluation only: it
    has no log-probability). Deterministic acting (evaluation) takes the ODE either way."""
    noise_level: Annotated[float, Positive] = 0.5
    """a in σ_t = a·√(t / (1 − t)): the SDE's noise scale (πRL's 0.5)."""
    width: Annotated[int, Positive] = 256
    """The expert's width (an even multiple of `heads`)."""
    layers: Annotated[int, Positive] = 4
    """The expert's layers, each self-attention, cross-attention to the VLM's prefix, MLP."""
    heads: Annotated[int, Positive] = 4
    """Attention heads in each of the expert's attentions."""


@dataclass
class L1Config:
    """`model.l1`, with `model.action_head: l1`: OpenVLA-OFT's L1 regression head (docs:
    guides/vla.md, Continuous actions)."""

    width: Annotated[int, Positive] = 256
    """The MLP's hidden width (action j's D hidden states, concatenated → width → width → D)."""
    init_log_std: Annotated[float, Finite] = -1.0
    """Initial log-std of the RL Gaussian around the regressed chunk (learned, state-independent,
    one per action dimension; in normalised units, where the action space spans [-1, 1])."""


@dataclass
class HfModelConfig(ModelConfig):
    """With `model.id: hf`: a Hugging Face vision-language model acting through its vocabulary, an L1
    regression head or a flow-matching action expert (`action_head`; docs: guides/vla.md)."""

    id: str = "hf"
    """`hf`."""
    action_bins: Annotated[int, Range(2)] = 256
    """The action tokens: the last this many ids of the vocabulary; a Box dimension is binned on
    them, a Discrete action is one of the first n (OpenVLA's 256)."""
    path: str | None = None
    """A local model folder (config.json, safetensors, processor, tokenizer); never fetched (docs:
    guides/vla.md)."""
    trust_remote_code: bool = False
    """Let the folder run modelling code of its own."""
    prompt_template: Annotated[str, PromptTemplate] = DEFAULT_PROMPT
    """The prompt; `{instruction}` is the env's text observation."""
    decode: Literal["parallel", "autoregressive"] = "parallel"
    """All K·D action tokens in one pass (OpenVLA-OFT), or one at a time with the KV cache
    (OpenVLA)."""
    action_stats: Annotated[dict, ActionStats] | None = None
    """`{q01: [...], q99: [...]}` per action dimension, normalised to [-1, 1] (null: the action
    space's bounds)."""
    lora: LoraConfig | None = None
    """LoRA adapters, `{rank, alpha, dropout, target_modules}` below (null: every parameter trains)."""
    action_attention: Literal["causal", "bidirectional"] = "causal"
    """With `decode: parallel`: the action positions attend to one another both ways (OpenVLA-OFT's
    parallel decoding) instead of causally; the prompt attends as its family's rule says either
    way."""
    temperature: Annotated[float, Positive] = 1.0
    """Token actions are sampled from the bins' logits divided by this (RLinf's LIBERO configs
    sample at 1.6); the loss path's log-probs and entropies are of the same tempered
    distribution, so a policy-gradient ratio compares like with like. Deterministic acting takes the argmax
    either way."""
    top_k: Annotated[int, Positive] | None = None
    """Each token is sampled among its k most likely bins only (the others get probability 0, in
    the loss path too); null: among all bins."""
    dtype: Annotated[Literal["float32", "bfloat16"], FLOAT16] = "float32"
    """The dtype the folder's weights load in, on the actor and on the rollout: `bfloat16` halves
    their memory; with LoRA the adapters and the value head still train in float32 (their master
    weights and Adam state), without it every weight, gradient and Adam state is bfloat16. One rank
    or DDP ranks; under FSDP use `actor.fsdp_param_dtype` instead (the precedence table: docs:
    guides/vla.md, Precision)."""
    action_head: Literal["tokens", "l1", "flow"] = "tokens"
    """How the model acts: `tokens` (vocabulary ids, OpenVLA: `decode`, `action_bins`, `temperature`,
    `top_k` apply), `l1` (OpenVLA-OFT's L1 regression over the action positions: `model.l1`) or
    `flow` (a flow-matching action expert, π0/SmolVLA: `model.flow`); the last two act in
    continuous actions, normalised to [-1, 1] as the tokens are (docs: guides/vla.md, Continuous
    actions)."""
    flow: FlowConfig | None = None
    """With `action_head: flow`: the expert and its chain, `{steps, noise, noise_level, width,
    layers, heads}` below (null: their defaults)."""
    l1: L1Config | None = None
    """With `action_head: l1`: the head, `{width, init_log_std}` below (null: their defaults)."""
    state_key: str | None = "state"
    """With `action_head` l1 or flow: the observation key read as proprioception, one token (π0's
    state token: the expert's first token, or one input position of the VLM for l1), where the
    env has it (a 1-D Box); null: none. The tokens head reads no state."""
    value_gradient: Literal["model", "head"] = "model"
    """Where the value loss trains: `model`, the value head and, through the hidden state it reads,
    the VLM (RLinf's), so the value loss, even in a critic warm-up (`algorithm.critic_warmup_steps`),
    moves the policy too; `head`, the value head alone on the VLM's hidden state detached: only the
    policy's loss moves the policy, and the critic learns on the features that loss shapes (the
    value loss's pull on a fully fine-tuned VLM is measured in docs: benchmarks/vla-heads.md, Reading)."""
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"
    """The attention kernel transformers builds the model with: `auto` is PyTorch's
    scaled-dot-product attention (`sdpa`) where the architecture has it and `eager` where it has not
    (Gemma 2's soft-capped attention, PaliGemma 2's); `flash_attention_2` where the `flash_attn`
    package is installed (a CUDA GPU; checked before anything starts)."""

    @property
    def emits_tokens(self) -> bool:
        return self.action_head == "tokens"

    @property
    def flow_chain(self) -> FlowConfig:
        """`model.flow`, its defaults where the config gives none."""
        return self.flow or FlowConfig()

    @property
    def l1_head(self) -> L1Config:
        """`model.l1`, its defaults where the config gives none."""
        return self.l1 or L1Config()


MODEL_SECTIONS: dict[str, type[ModelConfig]] = {
    "mlp": MlpModelConfig,
    "transformer": TransformerModelConfig,
    "hf": HfModelConfig,
}
BUILTIN_MODELS = tuple(MODEL_SECTIONS)  # model.id values that are no entry point


def model_section(model_id: str) -> type[ModelConfig]:
    """The `model` section's dataclass for `model.id`: a built-in model's own, else a custom one's."""
    return MODEL_SECTIONS.get(model_id, CustomModelConfig)


def model_kinds_with(key: str) -> list[str]:
    """The kinds of model (built-in ids, and `module:attr` for a custom network) that have `key`."""
    kinds = {**MODEL_SECTIONS, "module:attr": CustomModelConfig}
    return [name for name, section in kinds.items() if key in section.__dataclass_fields__]

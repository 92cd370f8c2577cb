"""`model.id: transformer` — a small vision-language-action transformer.

One sequence per sample, read by a stack of pre-norm transformer blocks (`blocks`, named by
`wrap_units()` so that each block is wrapped on its own: its own FSDP unit, all-gathered only
while it runs, and with `actor.gradient_checkpointing` recomputed on its own in backward):

    [image patches] [instruction tokens] [other keys, one token each] [action queries] [value query]

- an image (uint8, HWC or CHW) is cut into `model.patch_size` patches, each projected to
  `model.embed_dim` (a strided convolution, as in ViT); a 7×7 MiniGrid view with patch 1 gives
  one token per cell. With `model.keypoints: N` it is read instead as N learned keypoints
  (`ImageKeypoints`): the image coordinates of what a small CNN responds to, one token each;
- token ids (a mission, `envs.text`) are embedded; padding is masked out of attention;
- any other key (a one-hot direction, a state vector) is projected to one token (with
  `model.standardize_inputs` first standardised by the demonstrations' mean and std per element);
- the action queries are learned embeddings, one per action token: K for a token policy
  (`model.action_bins`: K action dimensions, each a categorical over the bins), one for a
  Discrete action or a Gaussian's means. Each query's output is projected to its logits (or
  means); the value query's output to the value. The value query is the sequence's last, or,
  with `model.shared_trunk: false`, the one query of a second trunk of its own (the critic's),
  whose gradients never reach the policy.

Every input token gets a learned position embedding. The network follows fleetrl's model
interface — obs → (action parameters (B, queries·outputs), value (B,)) — so `Policy` turns the
logits into token log-probs and entropies exactly as for any other network.
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl.errors import ConfigError
from fleetrl.models.encoders import channels_first, pixel_scale
from fleetrl.observations import image_layout, is_image, is_tokens, leaf_spaces


class Tokens(NamedTuple):
    """What a tokenizer gives the trunk: its tokens (B, n, dim); `padding` (B, n), True where
    attention ignores a token (None: none ignored); `positions` (B, n, 2), the image coordinates
    the tokens were made from (keypoints only: what `model.predict_keys` reads out)."""

    tokens: torch.Tensor
    padding: torch.Tensor | None = None
    positions: torch.Tensor | None = None


class ImagePatches(nn.Module):
    """uint8 images → (B, patches, dim)."""

    def __init__(self, space: gym.spaces.Box, dim: int, patch_size: int | None):
        super().__init__()
        channels, height, width, self.channels_last = image_layout(space)
        patch = patch_size or max(1, min(height, width) // 7)  # about 7×7 patches by default
        if patch > min(height, width):
            raise ConfigError(
                "model.patch_size",
                patch_size,
                f"at most the image's side ({min(height, width)})",
                f"shape {space.shape}",
            )
        self.scale = pixel_scale(space)
        self.project = nn.Conv2d(channels, dim, patch, stride=patch)
        self.count = (height // patch) * (width // patch)

    def forward(self, images: torch.Tensor) -> Tokens:
        pixels = channels_first(images, self.channels_last, self.scale)
        x = self.project(pixels.to(self.project.weight.dtype))  # bfloat16 under FSDP mixed precision
        return Tokens(x.flatten(2).transpose(1, 2))


class ImageKeypoints(nn.Module):
    """uint8 images → (B, keypoints, dim): a spatial-softmax keypoint encoder (Levine et al. 2016,
    "End-to-end training of deep visuomotor policies"; robomimic's image encoder).

    A small CNN computes one feature map per keypoint at half the image's resolution; a softmax over
    each map's positions turns it into the expected (x, y) of its activation, in [-1, 1]; each
    keypoint's two coordinates are projected to one token. Where things are is then an explicit
    number the blocks can subtract the end effector's position from. Patches carry it only in
    which token holds the object and in that token's learned position embedding, which a few
    hundred demonstrations do not teach (docs/guides/manipulation.md, Results)."""

    def __init__(self, space: gym.spaces.Box, dim: int, keypoints: int, channels: int = 32):
        super().__init__()
        in_channels, height, width, self.channels_last = image_layout(space)
        self.scale = pixel_scale(space)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, keypoints, 1),
        )
        rows, columns = (height + 1) // 2, (width + 1) // 2  # the stride-2 convolution's output
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, rows), torch.linspace(-1, 1, columns), indexing="ij")
        self.register_buffer("grid", torch.stack([xs, ys], dim=-1).reshape(-1, 2), persistent=False)
        self.project = nn.Linear(2, dim)
        self.count = keypoints

    def expected_positions(self, images: torch.Tensor) -> torch.Tensor:
        """(B, keypoints, 2): each keypoint's expected (x, y), -1 at the left (top) edge, 1 at the right (bottom)."""
        pixels = channels_first(images, self.channels_last, self.scale)
        maps = self.features(pixels.to(self.project.weight.dtype)).flatten(2)
        return maps.float().softmax(dim=-1) @ self.grid

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """(B, keypoints, 2) positions → (B, keypoints, dim) tokens."""
        return self.project(positions.to(self.project.weight.dtype))

    def forward(self, images: torch.Tensor) -> Tokens:
        positions = self.expected_positions(images)
        return Tokens(self.embed(positions), positions=positions)


class InstructionTokens(nn.Module):
    """Token ids (B, L), 0-padded → (B, L, dim) and the padding mask (True: ignore)."""

    def __init__(self, space: gym.spaces.Box, dim: int):
        super().__init__()
        self.embedding = nn.Embedding(int(space.high.max()) + 1, dim, padding_idx=0)
        self.count = int(space.shape[0])

    def forward(self, tokens: torch.Tensor) -> Tokens:
        return Tokens(self.embedding(tokens.long()), padding=tokens == 0)


class VectorToken(nn.Module):
    """Any other leaf → one token. With `standardize` (`model.standardize_inputs`) each element is
    first centred and scaled by the buffers `mean` and `std` — part of the weights, so that every
    checkpoint, `runner.init_from` and evaluation reads the statistics behaviour cloning set
    (`set_statistics`); until then they are 0 and 1."""

    def __init__(self, space: gym.spaces.Box, dim: int, standardize: bool = False):
        super().__init__()
        size = int(np.prod(space.shape))
        self.project = nn.Linear(size, dim)
        self.count = 1
        self.standardize = standardize
        if standardize:  # only then: checkpoints of models without them load as they were saved
            self.register_buffer("mean", torch.zeros(size))
            self.register_buffer("std", torch.ones(size))

    def set_statistics(self, mean: np.ndarray, std: np.ndarray) -> None:
        self.mean.copy_(torch.as_tensor(mean, dtype=self.mean.dtype).flatten())
        self.std.copy_(torch.as_tensor(std, dtype=self.std.dtype).flatten())

    def forward(self, x: torch.Tensor) -> Tokens:
        x = x.flatten(1)
        if self.standardize:
            x = (x.float() - self.mean) / self.std
        return Tokens(self.project(x.to(self.project.weight.dtype)).unsqueeze(1))


def tokenizer(
    space: gym.Space, dim: int, patch_size: int | None, keypoints: int | None, standardize: bool = False
) -> nn.Module:
    if is_image(space) and keypoints is not None:
        return ImageKeypoints(space, dim, keypoints)
    if is_image(space):
        return ImagePatches(space, dim, patch_size)
    if is_tokens(space):
        return InstructionTokens(space, dim)
    return VectorToken(space, dim, standardize)


class TransformerTrunk(nn.Module):
    """Observation → the outputs of its `queries` learned queries (B, queries, dim): every input's
    tokens, then the queries, with learned positions, through the blocks and a final norm."""

    def __init__(
        self,
        observation_space: gym.Space,
        queries: int,
        embed_dim: int,
        num_layers: int,
        num_heads: int,
        patch_size: int | None,
        keypoints: int | None,
        standardize: bool = False,
    ):
        super().__init__()
        leaves = leaf_spaces(observation_space)
        self.keyed = isinstance(leaves, dict)
        leaves = leaves if self.keyed else {"obs": leaves}
        self.inputs = nn.ModuleDict(
            {
                key: tokenizer(leaf, embed_dim, patch_size, keypoints, standardize)
                for key, leaf in sorted(leaves.items())
            }
        )
        self.queries = queries
        length = sum(part.count for part in self.inputs.values()) + queries
        self.query_embedding = nn.Parameter(torch.randn(queries, embed_dim) * 0.02)
        self.position = nn.Parameter(torch.randn(length, embed_dim) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                embed_dim, num_heads, 4 * embed_dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, obs) -> torch.Tensor:
        return self.read(obs)[0]

    def set_input_statistics(self, statistics: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Each standardised vector input's (mean, std), by observation key ("obs" for a
        non-Dict observation); a key this trunk does not read is ignored."""
        for key, part in self.inputs.items():
            if isinstance(part, VectorToken) and part.standardize:
                part.set_statistics(*statistics[key])

    def read(self, obs) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(the queries' outputs, each keypoint image's positions (B, keypoints, 2))."""
        if not self.keyed:
            obs = {"obs": obs}
        tokens, masks, positions = [], [], []
        for key, part in self.inputs.items():
            embedded, padding, found = part(obs[key])
            tokens.append(embedded)
            masks.append(padding if padding is not None else embedded.new_zeros(embedded.shape[:2], dtype=torch.bool))
            if found is not None:
                positions.append(found)
        batch = tokens[0].shape[0]
        tokens.append(self.query_embedding.expand(batch, -1, -1))
        masks.append(torch.zeros(batch, self.queries, dtype=torch.bool, device=tokens[0].device))
        x = torch.cat(tokens, dim=1) + self.position
        padding = torch.cat(masks, dim=1)
        for block in self.blocks:
            x = block(x, src_key_padding_mask=padding)
        return self.norm(x[:, -self.queries :]), positions


def policy_space(
    observation_space: gym.Space, critic_keys: tuple[str, ...], shared_trunk: bool, predict_keys: tuple[str, ...] = ()
) -> gym.Space:
    """The observation the policy's trunk reads: all of it but `critic_keys` (`model.critic_keys`)
    and the keys it learns to predict (`model.predict_keys`)."""
    if not critic_keys and not predict_keys:
        return observation_space
    keys = sorted(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else []
    if critic_keys and shared_trunk:
        raise ConfigError(
            "model.critic_keys", list(critic_keys), "[] unless model.shared_trunk is false", "one trunk reads every key"
        )
    hidden = set(critic_keys) | set(predict_keys)
    for name, listed in (("model.critic_keys", critic_keys), ("model.predict_keys", predict_keys)):
        unknown = [key for key in listed if key not in keys]
        if unknown:
            reason = f"unknown: {unknown}"
        elif listed and hidden == set(keys):
            reason = "it lists every key" if set(listed) == set(keys) else "with the other list, every key"
        else:
            continue
        raise ConfigError(
            name, list(listed), f"some of the observation's keys {keys}, not all: the policy must read one", reason
        )
    return gym.spaces.Dict({key: space for key, space in observation_space.spaces.items() if key not in hidden})


class TransformerPolicy(TransformerTrunk):
    """See the module docstring: the policy's trunk, with `queries` action queries each projected to
    `outputs` numbers.

    `shared_trunk`: the value is one more query of this trunk, or (False) the one query of a second
    trunk, the critic's. One trunk costs half the compute, but the value loss's gradients then move
    the policy too: a critic warm-up, meant to leave the policy alone, changed a behaviour-cloned
    policy's actions by a KL of 0.27-0.52 in its first iteration (docs/guides/manipulation.md).

    `predict_keys` (with `keypoints`): a linear read-out of the keypoints' positions predicts these
    observation keys, and `forward` returns its per-sample squared error as a third output: the
    auxiliary loss that teaches the camera's keypoints where the simulator says things are. The
    policy reads neither the keys nor the prediction."""

    def __init__(
        self,
        observation_space: gym.Space,
        queries: int,
        outputs: int,
        embed_dim: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        patch_size: int | None = None,
        keypoints: int | None = None,
        shared_trunk: bool = True,
        critic_keys: tuple[str, ...] = (),
        predict_keys: tuple[str, ...] = (),
        standardize_inputs: bool = False,
    ):
        if embed_dim % num_heads:
            raise ConfigError(
                "model.num_heads", num_heads, f"a divisor of model.embed_dim ({embed_dim})", "each head reads a slice"
            )
        dims = (embed_dim, num_layers, num_heads, patch_size, keypoints, standardize_inputs)
        reads = policy_space(observation_space, critic_keys, shared_trunk, predict_keys)
        super().__init__(reads, queries + int(shared_trunk), *dims)
        self.action_queries = queries
        self.critic = None if shared_trunk else TransformerTrunk(observation_space, 1, *dims)
        self.action_head = nn.Linear(embed_dim, outputs)
        self.value_head = nn.Linear(embed_dim, 1)
        self.predict_keys = tuple(predict_keys)
        self.predictor = None
        if predict_keys:  # policy_space checked the keys; rules.validate_trunk_keys that keypoints is set
            images = sum(isinstance(part, ImageKeypoints) for part in self.inputs.values())
            size = sum(int(np.prod(observation_space[key].shape)) for key in predict_keys)
            self.predictor = nn.Linear(2 * keypoints * images, size)
        nn.init.orthogonal_(self.action_head.weight, 0.01)  # near-uniform initial policy, as the MLP's
        nn.init.zeros_(self.action_head.bias)

    def set_input_statistics(self, statistics: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """`model.standardize_inputs`: the statistics of both trunks' vector inputs."""
        super().set_input_statistics(statistics)
        if self.critic is not None:
            self.critic.set_input_statistics(statistics)

    def wrap_units(self) -> list[nn.Module]:
        """The blocks, each sharded (FSDP) and checkpointed on its own (parallel/wrap.py); the
        tokenizers, embeddings, final norms and heads stay with the root unit."""
        critic_blocks = [] if self.critic is None else list(self.critic.blocks)
        return [*self.blocks, *critic_blocks]

    def forward(self, obs) -> tuple[torch.Tensor, ...]:
        """(action parameters, value), and with `predict_keys` the prediction's squared error (B,)."""
        x, positions = self.read(obs)
        value_query = x[:, -1] if self.critic is None else self.critic(obs)[:, 0]
        # float32 out whatever the compute dtype: the policy's log-softmax, log-probs and
        # entropies in full precision (under FSDP mixed precision the blocks compute in bfloat16)
        actions = self.action_head(x[:, : self.action_queries]).flatten(1).float()
        value = self.value_head(value_query).squeeze(-1).float()
        if self.predictor is None:
            return actions, value
        predicted = self.predictor(torch.cat([found.flatten(1) for found in positions], dim=1)).float()
        truth = torch.cat([obs[key].flatten(1).float() for key in self.predict_keys], dim=1)
        return actions, value, (predicted - truth).pow(2).mean(-1)

"""LoRA through peft: only the adapters and the value head train, and only they are the state.

`model.lora: {rank, alpha, dropout, target_modules}` wraps the model with peft's LoRA (None
target modules: the family's default, families.py — peft's "all-linear" for every family so far:
every linear layer but the output head, vision tower, projector and language model, as RLinf
fine-tunes OpenVLA-OFT). peft freezes the base weights.

The policy's state_dict then holds only its trainable tensors (adapters, value head) and
`base_hash`, the base folder's sha256 (`folder.base_hash`): checkpoints stay small, a weight sync
sends only what changed, and loading a state made on another base is refused with exit 2, naming
both. Loading accepts the frozen base tensors as missing (they come from `model.path`).

`merged_model` folds the adapters into the base weights (peft's `merge_and_unload`): a plain
transformers model that `fleetrl export` saves as a standard folder.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from fleetrl.config.model_sections import LoraConfig, ModelConfig
from fleetrl.errors import ConfigError
from fleetrl.models.hf.folder import base_hash

HASH_KEY = "base_hash"


def apply_lora(network: nn.Module, config: LoraConfig, path: str, default_targets="all-linear") -> nn.Module:
    """`network.model` wrapped with LoRA adapters (on `config.target_modules`, else the family's
    `default_targets`); the value head stays trainable."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = config.target_modules or (default_targets if isinstance(default_targets, str) else list(default_targets))
    peft_config = PeftLoraConfig(
        r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout, target_modules=targets
    )
    try:
        with warnings.catch_warnings():  # peft asks transformers a deprecated question; nothing for the user
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(network.model, peft_config)
    except ValueError as error:
        raise ConfigError(
            "model.lora.target_modules", config.target_modules, "module names of the model", str(error)
        ) from None
    network.register_buffer(HASH_KEY, fingerprint(path))
    # the fingerprint a loaded state is checked against, out of the state's reach: a DCP load
    # writes the checkpoint's values into the buffer itself before the state is loaded
    network.base_fingerprint = fingerprint(path)
    network.base_path = path
    return model


def keep_trainable_state(policy: nn.Module) -> None:
    """Make `policy`'s state its trainable tensors and the base fingerprint (module docstring).
    Call once the adapters are in and before anything is frozen for inference."""
    trainable = frozenset(name for name, p in policy.named_parameters() if p.requires_grad)
    hash_key = next(name for name, _ in policy.named_buffers() if name.endswith(HASH_KEY))

    def drop_frozen(module, state: dict, prefix: str, local_metadata) -> None:
        for key in [key for key in state if key[len(prefix) :] not in trainable and key[len(prefix) :] != hash_key]:
            del state[key]

    def check_base(state: dict, prefix: str, *args) -> None:
        saved = state.get(prefix + hash_key)
        if saved is not None:
            same_base(saved, policy.network.base_fingerprint, policy.network.base_path)

    def allow_missing_base(module, incompatible) -> None:
        incompatible.missing_keys[:] = [key for key in incompatible.missing_keys if key in trainable]

    policy._register_state_dict_hook(drop_frozen)
    policy._register_load_state_dict_pre_hook(check_base)
    policy.register_load_state_dict_post_hook(allow_missing_base)


def same_base(saved: torch.Tensor, own: torch.Tensor, path: str) -> None:
    """A ConfigError naming `path` unless the two fingerprints (uint8 hex digests) agree."""
    if not torch.equal(saved.cpu(), own.cpu()):
        raise ConfigError(
            "model.path",
            path,
            f"the base model the adapters were trained on (sha256 {bytes(saved.tolist()).decode()})",
            f"this folder's sha256 is {bytes(own.tolist()).decode()}",
        )


def check_resumed_base(config: ModelConfig, policy_state: dict) -> None:
    """Before any worker starts: a checkpoint's adapters against `model.path` (exit 2 if the
    base differs), so a resume on another base fails as a config error, not inside an actor.
    `policy_state` needs only the fingerprint (a sharded checkpoint's: `dcp.model_tensors`)."""
    saved = next((value for key, value in policy_state.items() if key.endswith(HASH_KEY)), None)
    if config.id == "hf" and config.lora is not None and saved is not None:
        same_base(saved, fingerprint(config.path), config.path)


def fingerprint(path: str) -> torch.Tensor:
    """`base_hash(path)` as the uint8 buffer a policy's state holds."""
    return torch.tensor(list(base_hash(path).encode()), dtype=torch.uint8)


def merged_model(network: nn.Module) -> nn.Module:
    """The transformers model with the adapters merged in (or the model itself without LoRA)."""
    model = network.model
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model

"""`fleetrl init-model`: a randomly initialised VLM as a standard Hugging Face folder.

Two ways:

- `--family NAME --size SIZE`: the family's builder at a named size (families.py, builders.py):
  its own model and processor classes, a word-level tokenizer built here, the action tokens as
  the last `bins` ids of the vocabulary. What comes out loads with transformers' Auto classes and
  trains through exactly the path a real checkpoint takes (`model.id: hf`, `model.path`).
- `--config FILE`: any `config.json` a user has — random weights in its exact shapes, built by
  the class transformers' `AutoModelForImageTextToText` maps it to, in the config's own dtype.
  The processor and tokenizer files beside FILE (not its weights, not its code) are copied, so a
  real checkpoint's folder gives a random-weight twin that acts as the real one would (its memory
  and speed are the real one's); without them the folder has a model only, and `fleetrl train`
  refuses it, naming the missing processor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fleetrl.errors import ConfigError, UserError
from fleetrl.models.hf.families import family_named
from fleetrl.models.hf.folder import copy_processor_files


def build_model(family: str, size: str, bins: int = 256, seed: int = 0) -> tuple[torch.nn.Module, object]:
    """(model, processor) of `family` at `size`, randomly initialised from `seed`; bfloat16
    unless tiny (built in bfloat16 too: a 3 B model in float32 would need 12 GB just to start)."""
    chosen = family_named(family)
    if size not in chosen.sizes:
        raise ConfigError("--size", size, f"one of {sorted(chosen.sizes)} for {family}")
    if bins < 2:
        raise ConfigError("--action-bins", bins, "at least 2")
    torch.manual_seed(seed)
    with default_dtype(torch.float32 if size == "tiny" else torch.bfloat16):
        return chosen.builder(chosen.sizes[size], bins)


class default_dtype:
    """`with default_dtype(dtype):` parameters created inside are `dtype`."""

    def __init__(self, dtype: torch.dtype):
        self.dtype, self.before = dtype, torch.get_default_dtype()

    def __enter__(self) -> None:
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc_info) -> None:
        torch.set_default_dtype(self.before)


def empty_out(out: Path) -> Path:
    out = Path(out)
    if (out / "config.json").exists():
        raise UserError(f"{out} holds a model already (config.json): choose an empty folder")
    return out


def init_model(family: str, size: str, out: Path, bins: int = 256, seed: int = 0) -> Path:
    """Write the family's folder at `size` to `out`, which must not hold a model already."""
    out = empty_out(out)
    model, processor = build_model(family, size, bins, seed)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def init_from_config(config_file: Path, out: Path, seed: int = 0) -> Path:
    """Random weights in `config_file`'s exact shapes, with the processor files beside it (module
    docstring); a config that ships code of its own, or that transformers does not map to an
    image-text-to-text class, is exit 2."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config_file = Path(config_file)
    if not config_file.is_file():
        raise ConfigError("--config", str(config_file), "an existing config.json")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError("--config", str(config_file), "a JSON file", str(error)) from None
    if "auto_map" in raw:
        raise ConfigError(
            "--config", str(config_file), "a config of transformers' own classes", "it names code of its own (auto_map)"
        )
    out = empty_out(out)
    try:
        config = AutoConfig.from_pretrained(str(config_file), local_files_only=True)
        dtype = getattr(config, "dtype", None) or torch.float32
        torch.manual_seed(seed)
        with default_dtype(dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))):
            model = AutoModelForImageTextToText.from_config(config)
    except (ValueError, KeyError, OSError) as error:
        raise ConfigError(
            "--config", str(config_file), "the config.json of an image-text-to-text model", str(error)
        ) from None
    model.save_pretrained(out)
    copy_processor_files(config_file.parent, out, skip=(config_file.name,))
    return out

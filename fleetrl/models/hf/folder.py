"""A Hugging Face model folder: what fleetrl requires of it, loading it, and its fingerprint.

`model.path` is a local folder as `save_pretrained` writes it — never a hub id: everything loads
with `local_files_only`, so nothing is fetched. Before transformers sees it, the folder is
checked for what loading needs, and a missing piece is a `ConfigError` (exit 2) naming the folder
and the file:

- `config.json`;
- the weights as safetensors: `model.safetensors`, or `model.safetensors.index.json` and every
  shard it lists;
- the processor: `processor_config.json` or `preprocessor_config.json`;
- the tokenizer: `tokenizer.json` (a fast tokenizer) or `tokenizer.model` (sentencepiece).

The model loads through `AutoModelForImageTextToText` and the processor through `AutoProcessor`;
`model.trust_remote_code` (off by default) lets a folder that ships its own modelling code run it.

`base_hash` is the sha256 of config.json and the weight files: LoRA checkpoints record it, and a
resume against another base model is refused (the adapters would be meaningless on it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch

from fleetrl.errors import ConfigError

log = logging.getLogger("fleetrl")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
INDEX = "model.safetensors.index.json"
VALUE_HEAD_FILE = "value_head.safetensors"  # fleetrl's critic beside an exported model; loaded when present


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files; a ConfigError naming the first one missing."""
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    if not (folder / INDEX).is_file():
        raise ConfigError(
            "model.path", str(folder), "a model folder with weights", "missing: model.safetensors (or " + INDEX + ")"
        )
    shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    for shard in shards:
        if not (folder / shard).is_file():
            raise ConfigError("model.path", str(folder), "a model folder with every shard", f"missing: {shard}")
    return [folder / shard for shard in shards]


def check_folder(path: str | None) -> Path:
    """The folder, checked as the module docstring says."""
    if not path:
        raise ConfigError("model.path", path, "a local Hugging Face model folder (fleetrl init-model makes one)")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError("model.path", path, "an existing local folder (hub ids are not fetched)")
    if not (folder / "config.json").is_file():
        raise ConfigError("model.path", str(folder), "a Hugging Face model folder", "missing: config.json")
    weight_files(folder)
    for kind, names in (("processor", PROCESSOR_FILES), ("tokenizer", TOKENIZER_FILES)):
        if not any((folder / name).is_file() for name in names):
            raise ConfigError(
                "model.path", str(folder), f"a model folder with its {kind}", f"missing: {' or '.join(names)}"
            )
    return folder


def load_folder(path: str | None, trust_remote_code: bool = False, dtype: torch.dtype = torch.float32):
    """(model, processor) from the checked folder, through transformers' Auto classes."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = check_folder(path)
    options = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    try:
        processor = AutoProcessor.from_pretrained(folder, **options)
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype, **options)
    except (ValueError, OSError, KeyError) as error:
        hint = "" if trust_remote_code else " (a folder with its own modelling code needs model.trust_remote_code)"
        raise ConfigError(
            "model.path", str(folder), "a folder transformers' Auto classes load", f"{error}{hint}"
        ) from error
    return model.eval(), processor


def base_hash(path: str) -> str:
    """sha256 over config.json and the weight files, in order (see the module docstring)."""
    folder = Path(path).expanduser()
    digest = hashlib.sha256()
    for file in [folder / "config.json", *weight_files(folder)]:
        digest.update(file.name.encode())
        with open(file, "rb") as stream:
            while block := stream.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()

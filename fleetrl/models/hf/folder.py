"""A Hugging Face model folder: what fleetrl requires of it, loading it, and its fingerprint.

`model.path` is a local folder as `save_pretrained` writes it — never a hub id: everything loads
with `local_files_only`, so nothing is fetched. Before transformers sees it (`fleetrl train
--dry-run` and the doctor stop here), the folder is checked by reading its `config.json`, its
processor files and its safetensors headers — no weight is read, no model built — and a problem is
a `ConfigError` (exit 2) naming the folder:

- `config.json`, whose `model_type` is one of a family fleetrl drives (families.py);
- a folder that ships modelling code of its own (`auto_map`) needs `model.trust_remote_code`,
  and its `model_type` must still be a family's (the code is run, the family drives it) with an
  `AutoModelForImageTextToText` entry in `auto_map`;
- the weights as safetensors: `model.safetensors`, or `model.safetensors.index.json` and every
  shard it lists, each as long as its header says (a truncated download is named);
- the processor: `processor_config.json` or `preprocessor_config.json`;
- the tokenizer: `tokenizer.json` (a fast tokenizer) or `tokenizer.model` (sentencepiece).

The model loads through `AutoModelForImageTextToText` (in `model.dtype`, with
`model.attn_implementation`); the processor is the folder's own processor class, with its image
processor's PIL backend and without a video processor: fleetrl shows images only, and the video
processors of SmolVLM2 and Qwen2-VL need torchvision, which does not import beside this torch build.

`base_hash` is the sha256 of config.json and the weight files: LoRA checkpoints record it, and a
resume against another base model is refused (the adapters would be meaningless on it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import struct
from pathlib import Path

import torch

from fleetrl.errors import ConfigError
from fleetrl.models.hf.families import SUPPORTED_TYPES, Family, family_for

log = logging.getLogger("fleetrl")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
INDEX = "model.safetensors.index.json"
VALUE_HEAD_FILE = "value_head.safetensors"  # fleetrl's critic beside an exported model; loaded when present
AUTO_CLASS = "AutoModelForImageTextToText"


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


def check_safetensors(file: Path) -> None:
    """The file is as long as its header says (8 bytes of header length, the JSON header, then
    every tensor's bytes); only the header is read."""
    size = file.stat().st_size
    problem = None
    with open(file, "rb") as stream:
        start = stream.read(8)
        length = struct.unpack("<Q", start)[0] if len(start) == 8 else None
        if length is None or 8 + length > size:
            problem = "its header is cut short"
        else:
            try:
                header = json.loads(stream.read(length))
                end = max(
                    (entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0
                )
            except (ValueError, KeyError, TypeError, IndexError):
                problem = "its header is not safetensors JSON"
            else:
                if 8 + length + end > size:
                    problem = f"it is truncated: {size} bytes, its header needs {8 + length + end}"
    if problem:
        raise ConfigError(
            "model.path", str(file.parent), "a model folder with intact weights", f"{file.name}: {problem}"
        )


def read_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as error:
        raise ConfigError("model.path", str(folder), "a config.json that is JSON", str(error)) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ConfigError("model.path", str(folder), "a config.json naming its model_type", "it names none")
    return config


def check_remote_code(folder: Path, config: dict, trust_remote_code: bool) -> None:
    """A folder with code of its own: run only when allowed, and only where a family drives it."""
    auto_map = config.get("auto_map")
    if not auto_map:
        return
    if not trust_remote_code:
        raise ConfigError(
            "model.trust_remote_code",
            False,
            f"true to run the modelling code {folder} ships (auto_map: {sorted(auto_map)})",
            f"fleetrl drives it only where its model_type is one of {SUPPORTED_TYPES}",
        )
    if AUTO_CLASS not in auto_map:
        raise ConfigError(
            "model.path",
            str(folder),
            f"a remote-code folder whose auto_map names an {AUTO_CLASS} class",
            f"it names {sorted(auto_map)}",
        )


def check_folder(path: str | None, trust_remote_code: bool = False) -> tuple[Path, Family]:
    """The folder and its family, checked as the module docstring says (no weight read)."""
    if not path:
        raise ConfigError("model.path", path, "a local Hugging Face model folder (fleetrl init-model makes one)")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError("model.path", path, "an existing local folder (hub ids are not fetched)")
    if not (folder / "config.json").is_file():
        raise ConfigError("model.path", str(folder), "a Hugging Face model folder", "missing: config.json")
    config = read_config(folder)
    family = family_for(config["model_type"], str(folder))
    check_remote_code(folder, config, trust_remote_code)
    for file in weight_files(folder):
        check_safetensors(file)
    for kind, names in (("processor", PROCESSOR_FILES), ("tokenizer", TOKENIZER_FILES)):
        if not any((folder / name).is_file() for name in names):
            raise ConfigError(
                "model.path", str(folder), f"a model folder with its {kind}", f"missing: {' or '.join(names)}"
            )
    return folder, family


def check_attention(implementation: str) -> None:
    """`model.attn_implementation`: FlashAttention 2 only where its package imports."""
    if implementation == "flash_attention_2":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError(
                "model.attn_implementation",
                implementation,
                "sdpa or eager (flash_attn is not installed here)",
                "FlashAttention 2 needs the flash_attn package and a CUDA GPU",
            )


def processor_class_name(folder: Path) -> str | None:
    for name in PROCESSOR_FILES:
        if (folder / name).is_file():
            found = json.loads((folder / name).read_text()).get("processor_class")
            if found:
                return found
    return None


def load_processor(folder: Path, trust_remote_code: bool = False):
    """The folder's processor class without a video processor (module docstring), its image
    processor's PIL backend, its tokenizer."""
    import transformers
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    options = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    name = processor_class_name(folder)
    processor_class = getattr(transformers, name, None) if name else None
    if processor_class is None or "video_processor" not in processor_class.get_attributes():
        return AutoProcessor.from_pretrained(folder, **options)
    kwargs = {}
    if (folder / "processor_config.json").is_file():
        kwargs = json.loads((folder / "processor_config.json").read_text())
    kwargs = {key: value for key, value in kwargs.items() if key in ("image_seq_len", "chat_template")}
    image_processor = AutoImageProcessor.from_pretrained(folder, backend="pil", **options)
    tokenizer = AutoTokenizer.from_pretrained(folder, **options)
    return images_only(processor_class)(image_processor, tokenizer, None, **kwargs)


def images_only(processor_class: type) -> type:
    """`processor_class`, accepting no video processor (its class check would need torchvision)."""

    class ImagesOnly(processor_class):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = processor_class.__name__
    return ImagesOnly


def load_folder(
    path: str | None,
    trust_remote_code: bool = False,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str | None = None,
):
    """(model, processor, family) from the checked folder, through transformers' Auto classes."""
    from transformers import AutoModelForImageTextToText

    folder, family = check_folder(path, trust_remote_code)
    options = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        options["attn_implementation"] = attn_implementation
    try:
        processor = load_processor(folder, trust_remote_code)
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype, **options)
    except (ValueError, OSError, KeyError, ImportError) as error:
        raise ConfigError("model.path", str(folder), "a folder transformers' Auto classes load", str(error)) from error
    return model.eval(), processor, family


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5")


def copy_processor_files(source: Path, out: Path, skip: tuple[str, ...] = ()) -> None:
    """The processor's, tokenizer's and chat template's files of `source` into `out`: every file
    but config.json, the weights and their index, modelling code and `skip`. Copied rather than
    saved: a processor loaded without its video processor (`load_processor`) cannot save itself,
    and the copy is byte for byte what the folder shipped."""
    leave = {"config.json", INDEX, VALUE_HEAD_FILE, *skip}
    for file in sorted(Path(source).iterdir()):
        if file.is_file() and file.name not in leave and not file.name.endswith((*WEIGHT_SUFFIXES, ".py")):
            shutil.copy2(file, Path(out) / file.name)


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

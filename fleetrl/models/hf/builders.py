"""Randomly initialised VLMs of the families fleetrl drives, at named sizes (`fleetrl init-model`).

Tests and CPU users cannot download a checkpoint, so they make one: the family's own model
class from its own config (random weights), its own processor class (image processor + the
word-level tokenizer of `tokenizer.py`, built here), and the action tokens as the last `bins` ids
of the vocabulary. `families.py` names each family's builder and sizes; `init_model.py` writes
what one returns as a standard folder.

Sizes: `tiny` (two layers everywhere, widths of 32-64: seconds on a CPU) and the family's real
dimensions with this small vocabulary (`3b`: PaliGemma-3B's Gemma-2B + SigLIP-So400m, ~2.5 B
parameters; `2b`: SmolVLM's SmolLM2-1.7B + SigLIP, ~1.7 B). transformers is imported inside the
builders: the family table (and so a dry run) reads the sizes without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fleetrl.models.hf.tokenizer import BOS, EOS, PAD, UNK, build_tokenizer

SPECIALS = [PAD, EOS, BOS, UNK]


@dataclass(frozen=True)
class Dims:
    """The widths of one size: vision tower and language model."""

    vision_hidden: int
    vision_mlp: int
    vision_layers: int
    vision_heads: int
    image_size: int
    patch_size: int
    text_hidden: int
    text_mlp: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    head_dim: int
    pixel_shuffle: int = 1
    """Patches per side that the connector merges into one image token (SmolVLM's scale factor:
    3 in the real 2 B model, 27×27 patches → 81 tokens); 1 where there is no such connector."""


def vision_sizes(dims: Dims) -> dict[str, int]:
    """The vision tower's config arguments, the same for SigLIP and Idefics3's SigLIP."""
    return dict(
        hidden_size=dims.vision_hidden,
        intermediate_size=dims.vision_mlp,
        num_hidden_layers=dims.vision_layers,
        num_attention_heads=dims.vision_heads,
        image_size=dims.image_size,
        patch_size=dims.patch_size,
    )


def text_sizes(dims: Dims, tokenizer) -> dict[str, int]:
    """The language model's config arguments (Gemma's and Llama's names agree), its special ids
    from `tokenizer`."""
    ids = tokenizer.convert_tokens_to_ids
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=dims.text_hidden,
        intermediate_size=dims.text_mlp,
        num_hidden_layers=dims.text_layers,
        num_attention_heads=dims.text_heads,
        num_key_value_heads=dims.text_kv_heads,
        head_dim=dims.head_dim,
        pad_token_id=ids(PAD),
        bos_token_id=ids(BOS),
        eos_token_id=ids(EOS),
    )


PALIGEMMA_SIZES = {
    "tiny": Dims(32, 64, 2, 2, 32, 8, 64, 128, 2, 2, 1, 32),
    "3b": Dims(1152, 4304, 27, 16, 224, 14, 2048, 16384, 18, 8, 1, 256),
}
SMOLVLM_SIZES = {
    "tiny": Dims(32, 64, 2, 2, 32, 8, 64, 128, 2, 2, 1, 32, pixel_shuffle=2),
    "2b": Dims(1152, 4304, 27, 16, 384, 14, 2048, 8192, 24, 32, 32, 64, pixel_shuffle=3),
}


def paligemma(dims: Dims, bins: int) -> tuple[torch.nn.Module, object]:
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessorPil,
        SiglipVisionConfig,
    )

    tokenizer = build_tokenizer(
        [*SPECIALS, "<image>"], [f"<loc{i:0>4}>" for i in range(1024)] + [f"<seg{i:0>3}>" for i in range(128)], bins
    )
    ids = tokenizer.convert_tokens_to_ids
    # no pooling head, as PaliGemma's own config has it: the model reads the patch features, so a
    # head would be weights (and LoRA adapters) that no loss ever reaches
    vision = SiglipVisionConfig(**vision_sizes(dims), projection_dim=dims.text_hidden, vision_use_head=False)
    text = GemmaConfig(**text_sizes(dims, tokenizer))
    config = PaliGemmaConfig(
        vision_config=vision, text_config=text, image_token_id=ids("<image>"), projection_dim=dims.text_hidden
    )
    image_processor = SiglipImageProcessorPil(
        size={"height": dims.image_size, "width": dims.image_size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    image_processor.image_seq_length = (dims.image_size // dims.patch_size) ** 2
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return PaliGemmaForConditionalGeneration(config), processor


def smolvlm(dims: Dims, bins: int) -> tuple[torch.nn.Module, object]:
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        LlamaConfig,
    )
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig

    image_tokens = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
    grid = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    tokenizer = build_tokenizer([*SPECIALS, *image_tokens, *grid], [], bins)
    ids = tokenizer.convert_tokens_to_ids
    scale = dims.pixel_shuffle
    vision = Idefics3VisionConfig(**vision_sizes(dims))
    text = LlamaConfig(**text_sizes(dims, tokenizer), tie_word_embeddings=True)
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=ids("<image>"),
        scale_factor=scale,
        tie_word_embeddings=True,
    )
    edge = {"longest_edge": dims.image_size}
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False, size=edge, max_image_size=edge, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    image_seq_len = (dims.image_size // dims.patch_size) ** 2 // scale**2
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=image_seq_len)
    return Idefics3ForConditionalGeneration(config), processor

"""Folders of each family fleetrl drives, built by transformers' own classes from the family's
PUBLISHED configuration — not by `fleetrl init-model` — as a user's checkpoint would be.

Everything the processor decides stays as the real checkpoint ships it: the image size, the
image splitting (on for SmolVLM), `image_seq_len` / `image_seq_length`, the pixel-shuffle scale
factor, Qwen's patch, merge and temporal sizes and pixel bounds, the resampling, mean and std, the
special and image tokens at their real ids, the vocabulary's size and the model's (padded)
embedding size. Only widths and depths shrink (hidden 32, one or two layers, Qwen's M-RoPE
sections scaled with the head size) and the weights are random. The tokenizer is a word-level one
of the real size with the real special tokens at their real ids (the BPE merges cannot be fetched;
fleetrl reads only ids); its ordinary ids hold fleetrl's prompt and instruction words, then filler.

The values are those of the checkpoints' config.json, preprocessor_config.json,
processor_config.json and tokenizer files as published (2024-2025): google/paligemma-3b-pt-224,
google/paligemma2-3b-pt-224, HuggingFaceTB/SmolVLM-256M-Instruct,
HuggingFaceTB/SmolVLM2-256M-Video-Instruct, Qwen/Qwen2-VL-2B-Instruct, Qwen/Qwen2.5-VL-3B-Instruct.
Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fleetrl.models.hf.tokenizer import vocabulary_words

SMALL_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
SMALL_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def layout_tokenizer(size: int, specials: dict[str, int], named: dict[str, str], first_word: int):
    """A fast word-level tokenizer of `size` ids: `specials` at their ids (added special tokens),
    fleetrl's words from `first_word` on, filler `<wN>` elsewhere; `named`: bos/eos/pad/unk and
    the processor's named tokens (image_token, ...)."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokens: list[str | None] = [None] * size
    for token, index in specials.items():
        tokens[index] = token
    for offset, word in enumerate(vocabulary_words()):
        assert tokens[first_word + offset] is None, "the words fit between the special tokens"
        tokens[first_word + offset] = word
    vocab = {token or f"<w{index}>": index for index, token in enumerate(tokens)}
    backend = Tokenizer(WordLevel(vocab, unk_token=named["unk_token"]))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[ \t\r]+"), behavior="removed"),
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.Punctuation(),
        ]
    )
    backend.add_special_tokens(sorted(specials, key=specials.get))
    base = {key: named[key] for key in ("bos_token", "eos_token", "pad_token", "unk_token") if named.get(key)}
    extra = {key: value for key, value in named.items() if key not in base and value}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **base, extra_special_tokens=extra)
    assert len(tokenizer) == size
    return tokenizer


def write(
    folder: Path, model, image_processor, tokenizer, processor_config: dict, extra_files: dict | None = None
) -> Path:
    """Save the pieces as the published folder holds them (processor_config.json by hand: the
    processor classes with a video processor cannot be built without torchvision)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps(processor_config, indent=2))
    for name, content in (extra_files or {}).items():
        (folder / name).write_text(json.dumps(content, indent=2))
    return folder


# ---------------------------------------------------------------------------------- PaliGemma


def paligemma_tokenizer():
    """Gemma's 256,000 ids, then PaliGemma's 1024 <locNNNN> and 128 <segNNN>, then <image>."""
    specials = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "<image>": 257152}
    specials |= {f"<loc{i:0>4}>": 256000 + i for i in range(1024)}
    specials |= {f"<seg{i:0>3}>": 257024 + i for i in range(128)}
    named = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    return layout_tokenizer(257153, specials, named | {"image_token": "<image>"}, first_word=108)


def paligemma(folder: Path, version: int = 1) -> Path:
    """google/paligemma-3b-pt-224 (version 1: Gemma) or google/paligemma2-3b-pt-224 (Gemma 2)."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipImageProcessorPil

    vision = {
        **SMALL_VISION,
        "model_type": "siglip_vision_model",
        "image_size": 224,
        "patch_size": 14,
        "num_image_tokens": 256,
        "vision_use_head": False,
        "projection_dim": 32,
    }
    text = {**SMALL_TEXT, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 257216}
    if version == 1:
        text |= {"model_type": "gemma", "hidden_activation": "gelu_pytorch_tanh"}
    else:  # Gemma 2: soft-capped logits and attention, query scaling by the head size, sliding window
        text |= {
            "model_type": "gemma2",
            "num_key_value_heads": 2,
            "query_pre_attn_scalar": 16,
            "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0,
            "sliding_window": 4096,
            "hidden_activation": "gelu_pytorch_tanh",
        }
    config = PaliGemmaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=257152,
        projection_dim=32,
        hidden_size=32,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    image_processor = SiglipImageProcessorPil(
        size={"height": 224, "width": 224}, resample=3, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    image_processor.image_seq_length = 256
    torch.manual_seed(0)
    return write(
        folder,
        PaliGemmaForConditionalGeneration(config),
        image_processor,
        paligemma_tokenizer(),
        {"processor_class": "PaliGemmaProcessor"},
    )


# ----------------------------------------------------------------------- Idefics3 / SmolVLM(2)


def smolvlm_tokenizer():
    """SmolLM2's 49,152 ids (<|endoftext|>, <|im_start|>, <|im_end|> first), then <global-img>,
    the 36 <row_r_col_c>, <fake_token_around_image>, <image>, 88 reserved tokens and
    <end_of_utterance>: 49,280 ids."""
    specials = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<global-img>": 49152}
    specials |= {f"<row_{r}_col_{c}>": 49153 + (r - 1) * 6 + (c - 1) for r in range(1, 7) for c in range(1, 7)}
    specials |= {"<fake_token_around_image>": 49189, "<image>": 49190, "<end_of_utterance>": 49279}
    specials |= {f"<|reserved_special_token_{i}|>": 49191 + i for i in range(88)}
    named = {
        "bos_token": "<|im_start|>",
        "eos_token": "<end_of_utterance>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "image_token": "<image>",
        "fake_image_token": "<fake_token_around_image>",
        "global_image_token": "<global-img>",
        "end_of_utterance_token": "<end_of_utterance>",
    }
    return layout_tokenizer(49280, specials, named, first_word=17)


def smolvlm(folder: Path, version: int = 1) -> Path:
    """HuggingFaceTB/SmolVLM-256M-Instruct (version 1: model_type idefics3) or
    SmolVLM2-256M-Video-Instruct (2: smolvlm): SmolLM2-135M + SigLIP-B/16 at 512 px, pixel
    shuffle 4 (64 tokens a tile), images resized to 2048 px and split into 512 px tiles."""
    import transformers

    prefix = "Idefics3" if version == 1 else "SmolVLM"
    vision = {**SMALL_VISION, "image_size": 512, "patch_size": 16}
    text = {
        **SMALL_TEXT,
        "model_type": "llama",
        "num_key_value_heads": 1,
        "head_dim": 16,
        "vocab_size": 49280,
        "rope_theta": 100000,
        "tie_word_embeddings": True,
        "pad_token_id": 2,
    }
    config = getattr(transformers, f"{prefix}Config")(
        vision_config=vision, text_config=text, scale_factor=4, image_token_id=49190, tie_word_embeddings=True
    )
    image_processor = getattr(transformers, f"{prefix}ImageProcessorPil")(
        do_image_splitting=True,
        size={"longest_edge": 2048},
        max_image_size={"longest_edge": 512},
        resample=1,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    video = {  # SmolVLM2's video_preprocessor_config.json, as published (fleetrl never reads it)
        "video_processor_type": "SmolVLMVideoProcessor",
        "processor_class": "SmolVLMProcessor",
        "size": {"longest_edge": 512},
        "fps": 1,
        "max_frames": 64,
    }
    torch.manual_seed(0)
    return write(
        folder,
        getattr(transformers, f"{prefix}ForConditionalGeneration")(config),
        image_processor,
        smolvlm_tokenizer(),
        {"processor_class": f"{prefix}Processor", "image_seq_len": 64},
        {"video_preprocessor_config.json": video} if version == 2 else {},
    )


# ------------------------------------------------------------------------ Qwen2-VL / Qwen2.5-VL


def qwen_tokenizer(version: int):
    """Qwen2's 151,643 BPE ids, then its chat and vision markers (and Qwen2.5's tool and FIM
    tokens): 151,657 ids (Qwen2-VL), 151,665 (Qwen2.5-VL); the model's embedding has 151,936."""
    markers = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ]
    if version == 2:
        markers += ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>"]
        markers += ["<|repo_name|>", "<|file_sep|>"]
    specials = {token: 151643 + i for i, token in enumerate(markers)}
    named = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "vision_bos_token": "<|vision_start|>",
        "vision_eos_token": "<|vision_end|>",
    }
    return layout_tokenizer(151643 + len(markers), specials, named, first_word=10)


def qwen_vl(folder: Path, version: int = 1) -> Path:
    """Qwen/Qwen2-VL-2B-Instruct (version 1) or Qwen/Qwen2.5-VL-3B-Instruct (2): 14 px patches,
    2×2 merged into one token, still images as 2 frames, 3,136 to 12,845,056 pixels; M-RoPE."""
    import transformers

    text = {
        **SMALL_TEXT,
        "num_key_value_heads": 1,
        "vocab_size": 151936,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},  # [16, 24, 24] of a 128 head, for 16
        "tie_word_embeddings": True,
    }
    if version == 1:
        vision = {"depth": 1, "embed_dim": 32, "num_heads": 2, "hidden_size": 32, "mlp_ratio": 2}
        vision |= {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3}
        config_class, model_class = transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
    else:  # windowed attention in the vision tower, full attention in the listed blocks
        vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32}
        vision |= {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3}
        vision |= {"window_size": 112, "fullatt_block_indexes": [1], "tokens_per_second": 2, "hidden_act": "silu"}
        config_class, model_class = transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
    config = config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
        bos_token_id=151643,
        eos_token_id=151645,
        tie_word_embeddings=True,
    )
    image_processor = transformers.Qwen2VLImageProcessorPil(
        size={"shortest_edge": 3136, "longest_edge": 12845056},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        resample=3,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )
    torch.manual_seed(0)
    processor = "Qwen2VLProcessor" if version == 1 else "Qwen2_5_VLProcessor"
    return write(folder, model_class(config), image_processor, qwen_tokenizer(version), {"processor_class": processor})


BUILDERS = {  # fixture name: (builder, version)
    "paligemma": (paligemma, 1),
    "paligemma2": (paligemma, 2),
    "smolvlm": (smolvlm, 1),
    "smolvlm2": (smolvlm, 2),
    "qwen2_vl": (qwen_vl, 1),
    "qwen2_5_vl": (qwen_vl, 2),
}


def build(name: str, folder: Path) -> Path:
    make, version = BUILDERS[name]
    return make(folder, version)

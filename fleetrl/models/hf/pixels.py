"""Observation images → the pixel inputs a family's model takes, made in torch on the model's device.

The folder's image processor decides the geometry, as it would for a real image: each maker asks
it once, with a blank image of the observation's size, how many images it makes of it and at what
size (SigLIP's fixed square; Idefics3/SmolVLM's grid of tiles plus the global image, as
`do_image_splitting` says; Qwen2-VL's native-resolution patch grid, within its min/max pixels).
Every batch then goes through the same geometry in torch: scaled to [0, 1], resized (bicubic, or
bilinear where the processor resamples bilinearly: torch has no Lanczos, which Idefics3 uses),
clamped as the processor's uint8 round-trip clamps, normalised with the processor's mean and std,
and cut or flattened as the processor cuts it. The resampling kernel is the one difference from
running the processor on each observation; the number of images, their sizes and order, and so
the image tokens the prompt holds for them, are the processor's own (`tests/test_hf_families.py`
compares both on the same image).

Three layouts (`Family.pixels`):
- `flat`: (B, 3, H, W) at the processor's fixed size (PaliGemma).
- `tiles`: (B, N, 3, M, M) and an all-true pixel mask; N = rows × cols tiles of the image resized
  to (rows·M, cols·M), then the whole image at M × M — or N = 1 without splitting (Idefics3, SmolVLM).
- `patches`: (B·h·w, 3·T·p·p) flattened patches and `image_grid_thw` (B, 3), the image resized to
  (h·p, w·p) and each patch repeated over the T = temporal_patch_size frames of a still image
  (Qwen2-VL, Qwen2.5-VL).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

BILINEAR = 2  # PIL's resampling codes, as image processors store them
NEAREST = 0


def blank(height: int, width: int) -> Image.Image:
    """A black RGB image of the observation's size: what the processor is asked about."""
    return Image.fromarray(np.zeros((height, width, 3), np.uint8))


class PixelMaker:
    """Shared: the processor's normalisation and resampling; `__call__` per layout."""

    def __init__(self, image_processor, height: int, width: int):
        self.height, self.width = height, width
        self.mean = torch.tensor(image_processor.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(image_processor.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        resample = int(getattr(image_processor, "resample", 3) or 3)
        self.mode = {BILINEAR: "bilinear", NEAREST: "nearest"}.get(resample, "bicubic")

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """[0, 1] → the processor's normalised values (before resizing: both are linear, so the
        order does not change the result, and the small observation is cheaper to normalise)."""
        return (x - self.mean.to(x.device)) / self.std.to(x.device)

    def resize(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """Normalised (B, 3, H, W) → (B, 3, *size), clamped to what [0, 1] normalises to, as the
        processor's uint8 image is; antialiased where it shrinks."""
        if tuple(x.shape[-2:]) == tuple(size):
            return x
        shrinks = size[0] < x.shape[-2] or size[1] < x.shape[-1]
        smooth = {} if self.mode == "nearest" else {"align_corners": False, "antialias": shrinks}
        x = F.interpolate(x, size=size, mode=self.mode, **smooth)
        mean, std = self.mean.to(x.device), self.std.to(x.device)
        return torch.maximum(torch.minimum(x, (1 - mean) / std), -mean / std)

    def __call__(self, x: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class FlatPixels(PixelMaker):
    """One image per sample at the processor's fixed size."""

    def __init__(self, image_processor, height: int, width: int):
        super().__init__(image_processor, height, width)
        size = image_processor.size
        self.size = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2

    def __call__(self, x: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.resize(self.normalise(x), self.size).to(dtype)}


class TiledPixels(PixelMaker):
    """Idefics3/SmolVLM: the processor's tiles and global image (module docstring)."""

    def __init__(self, image_processor, height: int, width: int):
        super().__init__(image_processor, height, width)
        made = image_processor(images=[[blank(height, width)]], return_row_col_info=True, return_tensors="pt")
        self.rows, self.cols = int(made["rows"][0][0]), int(made["cols"][0][0])
        self.images, _, self.side, side = made["pixel_values"].shape[1:]
        assert self.side == side and self.images == max(self.rows * self.cols, 0) + 1, "square tiles, then one"

    def __call__(self, x: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        m = self.side
        x = self.normalise(x)
        whole = self.resize(x, (m, m))
        if self.rows:
            grid = self.resize(x, (self.rows * m, self.cols * m))
            tiles = grid.unflatten(2, (self.rows, m)).unflatten(4, (self.cols, m))  # B, C, r, m, c, m
            tiles = tiles.permute(0, 2, 4, 1, 3, 5).flatten(1, 2)  # B, r·c, C, m, m (row-major)
            frames = torch.cat([tiles, whole.unsqueeze(1)], dim=1)
        else:
            frames = whole.unsqueeze(1)
        mask = torch.ones((frames.shape[0], frames.shape[1], m, m), dtype=torch.bool, device=x.device)
        return {"pixel_values": frames.to(dtype), "pixel_attention_mask": mask}


class PatchPixels(PixelMaker):
    """Qwen2-VL/Qwen2.5-VL: native-resolution patches and their grid (module docstring)."""

    def __init__(self, image_processor, height: int, width: int):
        super().__init__(image_processor, height, width)
        made = image_processor(images=[blank(height, width)], return_tensors="pt")
        self.grid = made["image_grid_thw"][0].tolist()  # [1, h, w] in patches
        self.patch, self.merge = image_processor.patch_size, image_processor.merge_size
        self.frames = image_processor.temporal_patch_size

    def __call__(self, x: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        _, h, w = self.grid
        p, m = self.patch, self.merge
        x = self.resize(self.normalise(x), (h * p, w * p))
        batch, channels = x.shape[:2]
        patches = x.reshape(batch, channels, h // m, m, p, w // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)
        patches = patches.unsqueeze(6).expand(*patches.shape[:6], self.frames, p, p)  # a still image's frames
        grid = torch.tensor([self.grid] * batch, dtype=torch.long, device=x.device)
        return {"pixel_values": patches.reshape(batch * h * w, -1).to(dtype), "image_grid_thw": grid}


LAYOUTS = {"flat": FlatPixels, "tiles": TiledPixels, "patches": PatchPixels}

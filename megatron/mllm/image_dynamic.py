# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Qwen2-VL-style dynamic resolution of images (``--image-preprocess dynamic``).

The image keeps its aspect ratio and (nearly) its size: each side is rounded to a multiple of
``factor = patch x merge`` (``--vision-patch-size`` x 2), then, if the area falls outside
``[--min-pixels, --max-pixels]``, both sides are scaled by one factor into the bounds (down
rounding down, up rounding up) before being put on that grid again. The resized ``W x H``
image is one vision-encoder unit of ``(H / p) x (W / p)`` patches, ordered so that each 2 x 2
block of patches is consecutive: the 2 x 2 merge (4 patches per LLM token, as
:func:`megatron.mllm.batch.pooling_pairs` averages consecutive tokens) then pools neighbours.

As with tiling (:class:`megatron.mllm.preprocess.ImageTiling`), the metadata half
(:meth:`DynamicResolution.item`) reads only the image's size from its header, and the payload
half (:meth:`DynamicResolution.features`) yields exactly the units it announced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from megatron.mllm.preprocess import (
    VISION_TOKENS_PER_LLM_TOKEN,
    DecodeError,
    ImageTiling,
    decode_rgb,
)
from orchestration.workload import Item

IMAGE_PREPROCESS_CHOICES = ("tile", "dynamic")
"""``--image-preprocess``: InternVL tiling, or Qwen2-VL dynamic resolution."""

MERGE = 2
"""Patches per side of a merge block (2 x 2 patches make one LLM token)."""

DEFAULT_MIN_PIXELS = 56 * 56
"""``--min-pixels`` default: Qwen2-VL's (4 LLM tokens at patch 14)."""

DEFAULT_MAX_PIXELS = 224 * 224
"""``--max-pixels`` default: 256 patches (64 LLM tokens) at patch 14, sized for the CPU demo
(Qwen2-VL's is 28 x 28 x 1280)."""


@dataclass(frozen=True)
class DynamicResolution:
    """How images become one vision-encoder unit each, at (nearly) their own resolution."""

    patch_size: int
    """``--vision-patch-size``: pixels per patch side."""

    min_pixels: int
    """``--min-pixels``: smallest area of a resized image."""

    max_pixels: int
    """``--max-pixels``: largest area of a resized image."""

    def __post_init__(self):
        f = self.factor
        if self.patch_size < 1:
            raise ValueError(f"--vision-patch-size must be >= 1, got {self.patch_size}")
        if self.min_pixels < 1:
            raise ValueError(f"--min-pixels must be >= 1, got {self.min_pixels}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"--min-pixels {self.min_pixels} is more than --max-pixels {self.max_pixels}"
            )
        if self.max_pixels < f * f:
            raise ValueError(
                f"--max-pixels {self.max_pixels} is less than one {f} x {f} block of 2 x 2 "
                f"patches of --vision-patch-size {self.patch_size} ({f * f} pixels): no image "
                "fits"
            )

    @property
    def factor(self) -> int:
        """Pixels per side of a merge block: resized sides are multiples of it."""
        return self.patch_size * MERGE

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """``(width, height)`` an image of this size is resized to.

        Raises:
            DecodeError: the image is so elongated that no grid within the bounds keeps its
                aspect ratio (even its short side at one block is over ``--max-pixels``).
        """
        f = self.factor
        w = max(f, round(width / f) * f)
        h = max(f, round(height / f) * f)
        if w * h > self.max_pixels:
            shrink = math.sqrt(width * height / self.max_pixels)
            w = max(f, math.floor(width / shrink / f) * f)
            h = max(f, math.floor(height / shrink / f) * f)
        elif w * h < self.min_pixels:
            grow = math.sqrt(self.min_pixels / (width * height))
            w = math.ceil(width * grow / f) * f
            h = math.ceil(height * grow / f) * f
        if w * h > self.max_pixels:
            raise DecodeError(
                f"an image of {width} x {height} pixels cannot be resized to multiples of {f} "
                f"within --max-pixels {self.max_pixels} (it would take {w} x {h}); raise "
                "--max-pixels or use --image-preprocess tile"
            )
        return w, h

    def item(self, width: int, height: int) -> Item:
        """The item of an image of this size: one unit of its patches, a quarter of them as LLM
        tokens."""
        w, h = self.resized(width, height)
        patches = (w // self.patch_size) * (h // self.patch_size)
        return Item((patches,), patches // VISION_TOKENS_PER_LLM_TOKEN)

    def features(self, data: bytes) -> list[np.ndarray]:
        """Decode an encoded image and return its one unit, ``[patches, 3 p p]``.

        Raises:
            DecodeError: the bytes are not an image Pillow can decode, or it cannot be resized.
        """
        from PIL import Image

        img = decode_rgb(data)
        w, h = self.resized(*img.size)
        pixels = np.asarray(img.resize((w, h), Image.Resampling.BICUBIC))
        return [self._patches(pixels)]

    def _patches(self, pixels: np.ndarray) -> np.ndarray:
        """``[h, w, 3]`` uint8 pixels to ``[(h/p)(w/p), 3 p p]`` uint8 patches: merge blocks
        row-major, the 2 x 2 patches of a block consecutive (row-major within it)."""
        p = self.patch_size
        rows, cols = pixels.shape[0] // self.factor, pixels.shape[1] // self.factor
        x = pixels
        # (block row, patch row in block, pixel row, block col, patch col, pixel col, channel)
        x = x.reshape(rows, MERGE, p, cols, MERGE, p, 3)
        x = x.transpose(0, 3, 1, 4, 6, 2, 5)
        return np.ascontiguousarray(x.reshape(rows * cols * MERGE * MERGE, 3 * p * p))


def image_preprocessor(mode: str, patch_size: int, tile_size: int, max_tiles: int,
                       min_pixels: int, max_pixels: int):  # fmt: skip
    """The images' preprocessing of ``--image-preprocess mode``, from its flags.

    Raises:
        ValueError: a bad flag or combination, naming the flags.
    """
    if mode == "tile":
        return ImageTiling(tile_size, patch_size, max_tiles)
    if mode == "dynamic":
        return DynamicResolution(patch_size, min_pixels, max_pixels)
    raise ValueError(f"--image-preprocess must be one of {', '.join(IMAGE_PREPROCESS_CHOICES)}")

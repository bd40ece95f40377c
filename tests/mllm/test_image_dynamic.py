# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Qwen2-VL-style dynamic resolution: the resize rule, header metadata == decoded units."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from megatron.mllm.batch import encoder_features
from megatron.mllm.image_dynamic import DynamicResolution, image_preprocessor
from megatron.mllm.preprocess import IMAGE_MEAN, IMAGE_STD, DecodeError, ImageTiling, image_size

QWEN2_VL = DynamicResolution(14, 56 * 56, 28 * 28 * 1280)
"""Qwen2-VL's defaults: patch 14 (blocks of 28), 3136 to 1,003,520 pixels."""


@pytest.mark.parametrize(
    "size,resized",
    [
        # Within the bounds: each side rounded to a multiple of 28.
        ((224, 224), (224, 224)),
        ((500, 300), (504, 308)),  # 17.86 -> 18 blocks, 10.71 -> 11
        ((42, 42), (56, 56)),  # 1.5 rounds to 2 (half to even)
        # Over --max-pixels: 1932 x 1092 > 1,003,520; scaled by sqrt(2073600 / 1003520) = 1.4375
        # and rounded down: 1920 / 1.4375 / 28 = 47.7, 1080 / 1.4375 / 28 = 26.8.
        ((1920, 1080), (1316, 728)),
        # Under --min-pixels: 28 x 28 < 3136; scaled by sqrt(3136 / 1200) = 1.6166 and rounded
        # up: 30 * 1.6166 / 28 = 1.73, 40 * 1.6166 / 28 = 2.31.
        ((30, 40), (56, 84)),
    ],
)
def test_resize_rule_against_hand_computed_qwen2_vl_examples(size, resized):
    assert QWEN2_VL.resized(*size) == resized
    w, h = resized
    item = QWEN2_VL.item(*size)
    assert item.units == ((w // 14) * (h // 14),)
    assert item.llm_tokens == (w // 28) * (h // 28)


def test_bad_flags_and_an_image_that_cannot_fit_are_errors():
    with pytest.raises(ValueError, match="^--min-pixels 5000 is more than --max-pixels 4000$"):
        DynamicResolution(14, 5000, 4000)
    with pytest.raises(ValueError, match="--max-pixels 700 is less than one 28 x 28 block"):
        DynamicResolution(14, 100, 700)
    with pytest.raises(ValueError, match="--min-pixels must be >= 1"):
        image_preprocessor("dynamic", 14, 448, 6, 0, 4000)
    assert isinstance(image_preprocessor("tile", 4, 16, 4, 0, 0), ImageTiling)
    # 1000 x 10 at two blocks' area: its short side stays one block, its long side 14.
    narrow = DynamicResolution(14, 100, 28 * 28 * 2)
    with pytest.raises(DecodeError, match="1000 x 10 pixels cannot be resized to multiples of 28"):
        narrow.item(1000, 10)


def _png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@settings(max_examples=12, deadline=None)
@given(width=st.integers(1, 160), height=st.integers(1, 160), seed=st.integers(0, 2**16))
def test_header_metadata_equals_the_decoded_units(width, height, seed):
    prep = DynamicResolution(4, 16 * 16, 64 * 64)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    data = _png(pixels)
    item = prep.item(*image_size(data))
    (unit,) = prep.features(data)
    assert (unit.shape[0],) == item.units and unit.shape[1] == 3 * 4 * 4
    assert unit.dtype == np.uint8  # raw pixels: normalised where the encoder runs
    assert 16 * 16 <= item.units[0] * 4 * 4 <= 64 * 64  # the resized area, within the bounds
    assert item.llm_tokens * 4 == item.units[0]


def test_patches_of_a_merge_block_are_consecutive():
    # 16 x 8 at patch 2 is already on the grid of 4-pixel blocks and inside the bounds: no
    # resampling, so the patches are read straight from the pixels.
    prep = DynamicResolution(2, 16, 1000)
    pixels = np.random.default_rng(0).integers(0, 256, (8, 16, 3), dtype=np.uint8)
    assert prep.resized(16, 8) == (16, 8)
    (unit,) = prep.features(_png(pixels))
    x = pixels
    expected = []
    for block_row in range(2):
        for block_col in range(4):
            for r in range(2):
                for c in range(2):
                    y0, x0 = 4 * block_row + 2 * r, 4 * block_col + 2 * c
                    patch = x[y0 : y0 + 2, x0 : x0 + 2]  # [p, p, 3]
                    expected.append(patch.transpose(2, 0, 1).ravel())
    np.testing.assert_array_equal(unit, np.stack(expected))


def test_pixel_patches_are_normalised_per_channel_where_the_encoder_runs():
    # The loader's patches are uint8; the encoder's input is (x / 255 - mean) / std of each
    # patch element's channel (channel-major: 3 blocks of p * p), computed exactly as float32.
    p = 3
    rows = np.random.default_rng(1).integers(0, 256, (5, 3 * p * p), dtype=np.uint8)
    got = encoder_features(torch.from_numpy(rows)).numpy()
    channel = np.arange(3 * p * p) // (p * p)
    mean = np.asarray(IMAGE_MEAN, np.float32)[channel]
    std = np.asarray(IMAGE_STD, np.float32)[channel]
    np.testing.assert_array_equal(got, (rows.astype(np.float32) / np.float32(255) - mean) / std)
    assert got.dtype == np.float32
    feats = torch.randn(4, 6)
    assert encoder_features(feats) is feats  # features already: unchanged
    with pytest.raises(ValueError, match="3 channels"):
        encoder_features(torch.zeros(2, 4, dtype=torch.uint8))

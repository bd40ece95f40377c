# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Real preprocessing of images and audio, and the token counts it yields, from headers alone.

Each modality has two halves that must agree exactly: the *metadata* half computes an item's
encoder units and LLM tokens from what a header says (an image's size, an audio file's frame
count and sample rate), so the balancer can plan before anything is decoded; the *payload*
half decodes the bytes and produces one ``[unit_tokens, input_dim]`` array per unit.

An image unit is its patches' raw ``uint8`` pixels, not yet normalised: post-balancing moves
units between ranks, and a byte per channel is a quarter of float32 and less than the encoded
file (``tools/bench/payload_bytes.py``). The vision encoder's input is normalised on the device
where it runs (:func:`megatron.mllm.batch.encoder_features`), the same on every rank. Audio
units are float32 log-mels.

- Images (InternVL style): the image is resized to the grid of ``--image-tile-size`` tiles
  (at most ``--image-max-tiles``) whose aspect ratio is closest to its own, cut into tiles, and
  a thumbnail of the whole image is added when there is more than one tile. Every tile is one
  encoder unit of ``(tile / patch)^2`` patches, each ``3 x p x p`` pixels, channel-major.
- Audio (Whisper style): decoded with soundfile, mixed to mono, resampled to 16 kHz, log-mel
  features of ``--audio-feature-dim`` bins every 10 ms, cut into 30 s windows (one unit each;
  the last window is not padded).

Both encoders' outputs are pooled into fewer LLM tokens (a 2 x 2 patch merge for images, 4
frames per token for audio), as :func:`megatron.mllm.batch.pooling_pairs` does.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

from orchestration.workload import Item

VISION_TOKENS_PER_LLM_TOKEN = 4
"""Patches merged into one LLM token (a 2 x 2 pixel shuffle)."""

AUDIO_FRAMES_PER_LLM_TOKEN = 4
"""Mel frames pooled into one LLM token."""

SAMPLE_RATE = 16000
"""The rate every clip is resampled to, in Hz."""

HOP_LENGTH = 160
"""Samples between mel frames (10 ms at 16 kHz)."""

FFT_SIZE = 400
"""Samples per analysis window (25 ms at 16 kHz)."""

IMAGE_MEAN = (0.485, 0.456, 0.406)
"""Per-channel mean the pixels are normalised by (the ImageNet statistics)."""

IMAGE_STD = (0.229, 0.224, 0.225)
"""Per-channel standard deviation the pixels are normalised by."""


class DecodeError(ValueError):
    """An image or audio file that cannot be read; the caller names the sample."""


def _llm_tokens(encoder_tokens: int, per_llm_token: int) -> int:
    return max(1, -(-encoder_tokens // per_llm_token))


@dataclass(frozen=True)
class ImageTiling:
    """How images become vision-encoder units."""

    tile_size: int
    """``--image-tile-size``: pixels per tile side."""

    patch_size: int
    """``--vision-patch-size``: pixels per patch side."""

    max_tiles: int
    """``--image-max-tiles``: most tiles per image (the thumbnail not counted)."""

    def __post_init__(self):
        if self.tile_size < 1 or self.tile_size % self.patch_size:
            raise ValueError(
                f"--image-tile-size {self.tile_size} must be a positive multiple of "
                f"--vision-patch-size {self.patch_size}"
            )
        if self.max_tiles < 1:
            raise ValueError(f"--image-max-tiles must be >= 1, got {self.max_tiles}")

    @property
    def tile_tokens(self) -> int:
        """Patches of one tile: its encoder tokens."""
        return (self.tile_size // self.patch_size) ** 2

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """``(columns, rows)`` of tiles for an image of this size.

        The grid's aspect ratio is the closest to the image's (in log space); among equally
        close grids the largest whose tiles the image fills at least half of, else the smallest.
        """
        aspect = math.log(width / height)
        grids = [
            (c, r) for c in range(1, self.max_tiles + 1) for r in range(1, self.max_tiles // c + 1)
        ]
        best = min(abs(math.log(c / r) - aspect) for c, r in grids)
        close = sorted(
            (g for g in grids if abs(math.log(g[0] / g[1]) - aspect) <= best + 1e-9),
            key=lambda g: (g[0] * g[1], g[0]),
        )
        filled = [g for g in close if width * height >= 0.5 * g[0] * g[1] * self.tile_size**2]
        return filled[-1] if filled else close[0]

    def item(self, width: int, height: int) -> Item:
        """The item of an image of this size: its units (tiles, thumbnail) and LLM tokens."""
        cols, rows = self.grid(width, height)
        tiles = cols * rows + (1 if cols * rows > 1 else 0)
        units = (self.tile_tokens,) * tiles
        return Item(units, _llm_tokens(sum(units), VISION_TOKENS_PER_LLM_TOKEN))

    def features(self, data: bytes) -> list[np.ndarray]:
        """Decode an encoded image and return each unit's ``[tile_tokens, 3 p p]`` uint8 patches.

        Raises:
            DecodeError: the bytes are not an image Pillow can decode.
        """
        from PIL import Image

        img = decode_rgb(data)
        t = self.tile_size
        cols, rows = self.grid(*img.size)
        resized = np.asarray(img.resize((cols * t, rows * t), Image.Resampling.BICUBIC))
        tiles = [
            resized[r * t : (r + 1) * t, c * t : (c + 1) * t]
            for r in range(rows)
            for c in range(cols)
        ]
        if len(tiles) > 1:
            tiles.append(np.asarray(img.resize((t, t), Image.Resampling.BICUBIC)))
        return [self._patches(tile) for tile in tiles]

    def _patches(self, tile: np.ndarray) -> np.ndarray:
        """``[t, t, 3]`` uint8 pixels to ``[(t/p)^2, 3 p p]`` uint8 patches, row-major."""
        p, n = self.patch_size, self.tile_size // self.patch_size
        x = tile.reshape(n, p, n, p, 3).transpose(0, 2, 4, 1, 3)
        return np.ascontiguousarray(x.reshape(n * n, 3 * p * p))


def decode_rgb(data: bytes):
    """An encoded image decoded to an RGB ``PIL.Image``.

    Raises:
        DecodeError: the bytes are not an image Pillow can decode.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except Exception as e:  # Pillow raises many types for bad data
        raise DecodeError(f"cannot decode the image: {e}") from e


def image_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` of an encoded image from its header, without decoding pixels.

    Raises:
        DecodeError: the bytes are not an image Pillow recognises.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except Exception as e:
        raise DecodeError(f"cannot read the image header: {e}") from e


@dataclass(frozen=True)
class AudioFeatures:
    """How audio becomes audio-encoder units."""

    feature_dim: int
    """``--audio-feature-dim``: mel bins per frame."""

    window_seconds: float = 30.0
    """Seconds of audio per encoder unit."""

    @property
    def window_frames(self) -> int:
        """Mel frames per full window."""
        return int(self.window_seconds * SAMPLE_RATE) // HOP_LENGTH

    def item(self, frames: int, sample_rate: int) -> Item:
        """The item of a clip of ``frames`` samples at ``sample_rate`` (a header's numbers)."""
        total = num_mel_frames(frames, sample_rate)
        w = self.window_frames
        units = (w,) * (total // w) + ((total % w,) if total % w else ())
        return Item(units, _llm_tokens(total, AUDIO_FRAMES_PER_LLM_TOKEN))

    def features(self, data: bytes) -> list[np.ndarray]:
        """Decode an encoded clip and return each window's ``[frames, feature_dim]`` log-mels.

        Raises:
            DecodeError: the bytes are not audio soundfile can decode, or hold no samples.
        """
        import soundfile

        try:
            wave, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        except Exception as e:
            raise DecodeError(f"cannot decode the audio: {e}") from e
        if wave.shape[0] == 0:
            raise DecodeError("the audio has no samples")
        mels = log_mel(resample(wave.mean(axis=1), rate), self.feature_dim)
        w = self.window_frames
        return [mels[i : i + w] for i in range(0, mels.shape[0], w)]


def audio_header(data: bytes) -> tuple[int, int]:
    """``(frames, sample_rate)`` of an encoded clip from its header.

    Raises:
        DecodeError: the bytes are not audio soundfile recognises, or hold no samples.
    """
    import soundfile

    try:
        info = soundfile.info(io.BytesIO(data))
    except Exception as e:
        raise DecodeError(f"cannot read the audio header: {e}") from e
    if info.frames <= 0:
        raise DecodeError("the audio has no samples")
    return info.frames, info.samplerate


def resampled_length(frames: int, sample_rate: int) -> int:
    """Samples of a clip of ``frames`` at ``sample_rate`` once resampled to 16 kHz."""
    return max(1, frames * SAMPLE_RATE // sample_rate)


def num_mel_frames(frames: int, sample_rate: int) -> int:
    """Mel frames of a clip (centred frames: one per hop, plus one)."""
    return 1 + resampled_length(frames, sample_rate) // HOP_LENGTH


def resample(wave: np.ndarray, sample_rate: int) -> np.ndarray:
    """``wave`` at ``sample_rate`` resampled to 16 kHz by linear interpolation."""
    n = resampled_length(wave.shape[0], sample_rate)
    if sample_rate == SAMPLE_RATE:
        return wave.astype(np.float32, copy=False)
    t = np.arange(n, dtype=np.float64) * (sample_rate / SAMPLE_RATE)
    return np.interp(t, np.arange(wave.shape[0]), wave).astype(np.float32)


def mel_filterbank(num_mels: int) -> np.ndarray:
    """``[num_mels, FFT_SIZE // 2 + 1]`` triangular filters on the HTK mel scale, 0 - 8 kHz."""
    bins = FFT_SIZE // 2 + 1
    hz = np.linspace(0.0, SAMPLE_RATE / 2, bins)

    def to_mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    edges = 700.0 * (10.0 ** (np.linspace(0.0, to_mel(SAMPLE_RATE / 2), num_mels + 2) / 2595) - 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (hz[None] - lo) / np.maximum(mid - lo, 1e-9)
    down = (hi - hz[None]) / np.maximum(hi - mid, 1e-9)
    return np.maximum(0.0, np.minimum(up, down)).astype(np.float32)


def log_mel(wave: np.ndarray, num_mels: int) -> np.ndarray:
    """``[1 + len // HOP_LENGTH, num_mels]`` log-mel features of a 16 kHz clip (Whisper's
    scaling: log10, floored 8 below the clip's maximum, then ``(x + 4) / 4``)."""
    half = FFT_SIZE // 2
    padded = np.pad(wave, (half, half))
    frames = 1 + wave.shape[0] // HOP_LENGTH
    starts = np.arange(frames) * HOP_LENGTH
    # Frames past the padded end (a clip shorter than a window) read zeros.
    padded = np.pad(padded, (0, max(0, starts[-1] + FFT_SIZE - padded.shape[0])))
    window = np.hanning(FFT_SIZE + 1)[:-1].astype(np.float32)
    segments = padded[starts[:, None] + np.arange(FFT_SIZE)[None]] * window
    power = np.abs(np.fft.rfft(segments, axis=1)) ** 2
    mels = np.log10(np.maximum(power @ mel_filterbank(num_mels).T, 1e-10))
    mels = np.maximum(mels, mels.max() - 8.0)
    return ((mels + 4.0) / 4.0).astype(np.float32)

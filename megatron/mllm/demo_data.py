# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A small, real multimodal Energon dataset built from nothing but installed packages.

``make demo-data`` (``tools/make_demo_data.py``) writes WebDataset shards of mixed samples,
prepares them as Energon's ``energon prepare`` would (``.nv-meta/`` with the shard counts, the
split, the tar indices and ``index.sqlite``, done through Energon's own preparator), and trains
a small byte-level BPE tokenizer on the captions into ``DIR/tokenizer``:

- image-text (captioning): a digit drawn as a seven-segment figure with Pillow, of random size,
  aspect ratio and colours, saved as PNG, captioned from its label;
- audio-text: a tone whose pitch and glide encode the label, synthesised with numpy and written
  with soundfile (FLAC or WAV, at 8, 16 or 22.05 kHz), captioned from its label.

Every sample is one ``json`` part (its type, label and caption) plus its ``png`` or ``flac`` /
``wav`` part. Beside it, ``DIR/documents`` is a second Energon dataset of interleaved documents
(text runs between several digit images and tones, in reading order) and VQA samples (a digit
image, a question, an answer; some questions place the image with ``<image>``), and
``DIR/blend.yaml`` an Energon metadataset blending the two (``--data-path DIR/blend.yaml``).
Everything is drawn from one seed: the same arguments give the same bytes.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass

import numpy as np

from megatron.mllm.tokenizer import train_tokenizer

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
"""Label names, for the captions."""

_SEGMENTS = {  # which of the segments a..g each digit lights (a top, clockwise, g middle)
    0: "abcdef", 1: "bc", 2: "abdeg", 3: "abcdg", 4: "bcfg",
    5: "acdfg", 6: "acdefg", 7: "abc", 8: "abcdefg", 9: "abcdfg",
}  # fmt: skip

IMAGE_CAPTIONS = (
    "a drawing of the digit {name}",
    "the number {name} painted on a plain background",
    "a picture showing {name}",
)
"""Caption templates of image samples."""

AUDIO_CAPTIONS = ("a tone that says {name}", "the sound of the number {name}")
"""Caption templates of audio samples."""

VQA_QUESTIONS = (
    "which digit is drawn here?",
    "what number does this picture show?",
    "in <image> which digit do you see?",
)
"""Questions of VQA samples (the last places the image inside the question)."""

DOCUMENT_LINKS = ("next comes", "then we hear", "and after that", "followed by")
"""Words between a document's items."""

DOCUMENTS_DIR = "documents"
"""Where, under the dataset directory, the interleaved and VQA dataset goes."""

BLEND_FILE = "blend.yaml"
"""The metadataset YAML blending the two datasets."""

TOKENIZER_DIR = "tokenizer"
"""Where, under the dataset directory, the tokenizer goes."""


@dataclass(frozen=True)
class DemoSpec:
    """What the demo dataset holds."""

    num_samples: int = 320
    """Samples in all."""

    num_shards: int = 4
    """WebDataset shards (samples are dealt out in order)."""

    audio_fraction: float = 0.4
    """Share of audio-text samples; the rest are image-text."""

    seed: int = 1234
    """Seed of every drawn value."""

    vocab_size: int = 384
    """Tokenizer vocabulary (special tokens and the 256 bytes included)."""

    max_image_side: int = 96
    """Largest image side in pixels (the smallest is 16)."""

    max_audio_seconds: float = 2.0
    """Longest clip (the shortest is 0.25 s)."""

    num_documents: int = 96
    """Samples of the documents dataset (0: none, and no blend)."""

    vqa_fraction: float = 0.5
    """Share of VQA samples in the documents dataset; the rest are interleaved documents."""

    max_document_items: int = 3
    """Most items of an interleaved document (the fewest is 2)."""


def draw_digit(label: int, width: int, height: int, rng: np.random.Generator) -> bytes:
    """A PNG of ``label`` as a seven-segment figure filling a ``width x height`` image."""
    from PIL import Image, ImageDraw

    bg = tuple(int(v) for v in rng.integers(0, 96, 3))
    fg = tuple(int(v) for v in rng.integers(160, 256, 3))
    img = Image.new("RGB", (width, height), bg)
    draw = ImageDraw.Draw(img)
    x0, x1 = 0.2 * width, 0.8 * width
    y0, ym, y1 = 0.1 * height, 0.5 * height, 0.9 * height
    lines = {
        "a": ((x0, y0), (x1, y0)), "b": ((x1, y0), (x1, ym)), "c": ((x1, ym), (x1, y1)),
        "d": ((x0, y1), (x1, y1)), "e": ((x0, ym), (x0, y1)), "f": ((x0, y0), (x0, ym)),
        "g": ((x0, ym), (x1, ym)),
    }  # fmt: skip
    stroke = max(1, min(width, height) // 8)
    for seg in _SEGMENTS[label]:
        draw.line(lines[seg], fill=fg, width=stroke)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def synth_tone(
    label: int, seconds: float, sample_rate: int, fmt: str, rng: np.random.Generator
) -> bytes:
    """A clip whose pitch (and upward glide) encode ``label``, encoded as ``fmt``."""
    import soundfile

    n = max(1, int(seconds * sample_rate))
    t = np.arange(n) / sample_rate
    f0 = 200.0 * 2 ** (label / 6)
    glide = 1.0 + 0.3 * (label % 3)
    phase = 2 * np.pi * f0 * (t + (glide - 1) * t**2 / (2 * max(seconds, 1e-3)))
    wave = 0.5 * np.sin(phase) + 0.02 * rng.standard_normal(n)
    out = io.BytesIO()
    soundfile.write(out, wave.astype(np.float32), sample_rate, format=fmt.upper())
    return out.getvalue()


def demo_samples(spec: DemoSpec) -> list[dict]:
    """The WebDataset samples of ``spec``: ``__key__``, ``json`` and one media part each."""
    rng = np.random.default_rng(spec.seed)
    samples = []
    for i in range(spec.num_samples):
        label = int(rng.integers(0, 10))
        name = DIGIT_NAMES[label]
        key = f"{i:06d}"
        if rng.random() < spec.audio_fraction:
            seconds = float(rng.uniform(0.25, spec.max_audio_seconds))
            rate = int(rng.choice([8000, 16000, 22050]))
            fmt = "flac" if rng.random() < 0.7 else "wav"
            caption = AUDIO_CAPTIONS[int(rng.integers(len(AUDIO_CAPTIONS)))].format(name=name)
            media = {fmt: synth_tone(label, seconds, rate, fmt, rng)}
            kind = "audio_caption"
        else:
            w, h = (int(v) for v in rng.integers(16, spec.max_image_side + 1, 2))
            caption = IMAGE_CAPTIONS[int(rng.integers(len(IMAGE_CAPTIONS)))].format(name=name)
            media = {"png": draw_digit(label, w, h, rng)}
            kind = "caption"
        info = {"type": kind, "label": label, "caption": caption}
        samples.append({"__key__": key, "json": json.dumps(info).encode(), **media})
    return samples


def _image_part(label: int, spec: DemoSpec, rng: np.random.Generator) -> bytes:
    w, h = (int(v) for v in rng.integers(16, spec.max_image_side + 1, 2))
    return draw_digit(label, w, h, rng)


def _audio_part(label: int, spec: DemoSpec, rng: np.random.Generator) -> tuple[str, bytes]:
    seconds = float(rng.uniform(0.25, spec.max_audio_seconds))
    rate = int(rng.choice([8000, 16000, 22050]))
    fmt = "flac" if rng.random() < 0.7 else "wav"
    return fmt, synth_tone(label, seconds, rate, fmt, rng)


def document_samples(spec: DemoSpec) -> list[dict]:
    """The samples of the documents dataset: VQA samples and interleaved documents."""
    rng = np.random.default_rng([spec.seed, 1])
    samples = []
    for i in range(spec.num_documents):
        key = f"{i:06d}"
        if rng.random() < spec.vqa_fraction:
            label = int(rng.integers(0, 10))
            question = VQA_QUESTIONS[int(rng.integers(len(VQA_QUESTIONS)))]
            info = {"type": "vqa", "context": question, "answer": DIGIT_NAMES[label]}
            samples.append(
                {"__key__": key, "json": json.dumps(info).encode(),
                 "png": _image_part(label, spec, rng)}
            )  # fmt: skip
            continue
        sample, sequence = {"__key__": key}, []
        for j in range(int(rng.integers(2, spec.max_document_items + 1))):
            label = int(rng.integers(0, 10))
            if rng.random() < 0.5:
                part = f"img{j}.png"
                sample[part] = _image_part(label, spec, rng)
                words = f"the digit {DIGIT_NAMES[label]}"
            else:
                fmt, data = _audio_part(label, spec, rng)
                part = f"clip{j}.{fmt}"
                sample[part] = data
                words = f"a tone for {DIGIT_NAMES[label]}"
            link = "first" if j == 0 else DOCUMENT_LINKS[int(rng.integers(len(DOCUMENT_LINKS)))]
            sequence += [f"{'' if j == 0 else ' '}{link} {words}: ", {"media": part}]
        if rng.random() < 0.5:
            sequence.append(" that is all.")
        info = {"type": "interleaved", "sequence": sequence}
        samples.append({**sample, "json": json.dumps(info).encode()})
    return samples


def document_texts(samples: list[dict]) -> list[str]:
    """Every text of the documents dataset's samples, for the tokenizer's corpus."""
    texts = []
    for s in samples:
        info = json.loads(s["json"])
        if info["type"] == "vqa":
            texts += [info["context"], info["answer"]]
        else:
            texts += [x for x in info["sequence"] if isinstance(x, str)]
    return texts


def write_energon_dataset(
    directory: str,
    samples: list[dict],
    num_shards: int,
    split_parts: tuple[tuple[str, float], ...] = (("train", 1.0),),
) -> list[str]:
    """Write ``samples`` as WebDataset shards under ``directory`` and prepare them for Energon
    (``.nv-meta/``: shard counts, the split, tar indices, ``dataset.yaml``).

    Args:
        split_parts: ``(part, share)`` of the split, in order: each part takes its share of the
            shards, consecutive in shard order (``energon prepare``'s ratios, unshuffled); by
            default a single ``train`` part.

    Returns:
        The shard file names, in order.
    """
    import webdataset

    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    os.makedirs(directory, exist_ok=True)
    num_shards = max(1, min(num_shards, len(samples)))
    per_shard = -(-len(samples) // num_shards) if samples else 0
    names = []
    for s in range(num_shards):
        name = f"shard-{s:06d}.tar"
        names.append(name)
        with webdataset.TarWriter(os.path.join(directory, name)) as writer:
            for sample in samples[s * per_shard : (s + 1) * per_shard]:
                writer.write(sample)
    WebdatasetPreparator.prepare_dataset(
        EPath(directory), names, split_parts_ratio=list(split_parts), shuffle_seed=None, workers=1
    )
    # Mixed sample types: Energon reads them as a crude dataset (a cooker per type).
    with open(os.path.join(directory, ".nv-meta", "dataset.yaml"), "w", encoding="utf-8") as f:
        f.write("__module__: megatron.energon\n__class__: CrudeWebdataset\n")
        f.write("subflavors:\n  source: orchweave-demo\n")
    return names


def write_blend(path: str, datasets: list[tuple[str, float]]) -> None:
    """Write an Energon v2 metadataset YAML blending ``(path relative to it, weight)``s."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("__module__: megatron.energon\n__class__: MetadatasetV2\n")
        f.write("splits:\n  train:\n    blend:\n")
        for rel, weight in datasets:
            f.write(f"      - weight: {weight:g}\n        path: {rel}\n")


def build_demo_dataset(directory: str, spec: DemoSpec = DemoSpec()) -> str:
    """Build the demo dataset and its tokenizer under ``directory``.

    Returns:
        The tokenizer directory (``--tokenizer-model``).
    """
    samples = demo_samples(spec)
    write_energon_dataset(directory, samples, spec.num_shards)
    captions = [json.loads(s["json"])["caption"] for s in samples]
    corpus = captions + [name for name in DIGIT_NAMES] + list(IMAGE_CAPTIONS + AUDIO_CAPTIONS)
    if spec.num_documents > 0:
        documents = document_samples(spec)
        write_energon_dataset(os.path.join(directory, DOCUMENTS_DIR), documents, 2)
        corpus += document_texts(documents)
        write_blend(os.path.join(directory, BLEND_FILE), [(".", 2.0), (DOCUMENTS_DIR, 1.0)])
    tokenizer_dir = os.path.join(directory, TOKENIZER_DIR)
    train_tokenizer(corpus, tokenizer_dir, spec.vocab_size)
    return tokenizer_dir

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Scan an Energon dataset: its per-sample metadata as JSONL, and its workload statistics.

Usage (from the repository root)::

    python tools/scan_dataset.py DIR [--output PATH] [--tokenizer-model TOK_DIR]
        [--image-preprocess {tile,dynamic}] [--image-tile-size T] [--image-max-tiles N]
        [--min-pixels A] [--max-pixels A] [--vision-patch-size P] [--audio-feature-dim D]
        [--prompt-format {caption,chat}] [--json]

``DIR`` may also be a metadataset YAML: every dataset of its ``blend`` or ``blend_epochized``
is scanned in turn, in the split part its entry reads (ids ``label/shard/key``; the JSONL then
defaults to beside the YAML).

Every sample's metadata is computed as the trainer computes it with the same flags: text
tokens from the tokenizer, image and audio token counts from the media *headers* (nothing is
decoded). The JSONL (default ``DIR/metadata.jsonl``) is the form ``--workload`` reads, in
dataset order, with ``shard/key`` ids, so the data's imbalance can be looked at with
``tools/balance_report.py`` and SEMU before training. The report printed is
``tools/workload.py``'s on that file. Errors print one ``error:`` line and exit with status 2.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from megatron.mllm.cli.args import ToolParser, number, report_error
from megatron.mllm.image_dynamic import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MIN_PIXELS,
    IMAGE_PREPROCESS_CHOICES,
    image_preprocessor,
)
from orchestration.workload import WorkloadError, write_jsonl
from orchestration.workload_report import format_report, workload_report
from orchestration.workload_spec import SampleStream


def build_parser() -> ToolParser:
    """The command-line interface of this tool."""
    p = ToolParser(description="Write an Energon dataset's sample metadata as JSONL and report it.")
    p.add_argument("directory", metavar="DIR", help="the Energon dataset (--data-path)")
    p.add_argument("--output", metavar="PATH", help="the JSONL (default DIR/metadata.jsonl)")
    p.add_argument(
        "--tokenizer-model", metavar="TOK_DIR", help="tokenizer directory (default DIR/tokenizer)"
    )
    p.add_argument(
        "--image-preprocess", choices=IMAGE_PREPROCESS_CHOICES, default="tile",
        help="InternVL tiles or Qwen2-VL dynamic resolution (default tile)",
    )  # fmt: skip
    p.add_argument("--image-tile-size", type=number(int), default=448, help="default 448")
    p.add_argument("--image-max-tiles", type=number(int), default=6, help="default 6")
    p.add_argument(
        "--min-pixels",
        type=number(int),
        default=DEFAULT_MIN_PIXELS,
        help=f"dynamic resolution's smallest area (default {DEFAULT_MIN_PIXELS})",
    )
    p.add_argument(
        "--max-pixels",
        type=number(int),
        default=DEFAULT_MAX_PIXELS,
        help=f"dynamic resolution's largest area (default {DEFAULT_MAX_PIXELS})",
    )
    p.add_argument("--vision-patch-size", type=number(int), default=14, help="default 14")
    p.add_argument("--audio-feature-dim", type=number(int), default=128, help="default 128")
    p.add_argument("--prompt-format", choices=("caption", "chat"), default="caption",
                   help="the text template (default caption)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return p


def scan(directory: str, tokenizer_model: str, tile: int, max_tiles: int, patch: int, mels: int,
         image_preprocess: str = "tile", min_pixels: int = DEFAULT_MIN_PIXELS,
         max_pixels: int = DEFAULT_MAX_PIXELS, prompt_format: str = "caption"):  # fmt: skip
    """The metadata of every sample of the dataset at ``directory`` (or of each dataset of a
    metadataset YAML in turn, in the split part its entry reads, each sample once whatever its
    weight or repetitions), in dataset order, with the trainer's preprocessing flags
    (``--image-preprocess`` and the flags of the mode chosen, ``--prompt-format``).

    Raises:
        ConfigError: a bad tokenizer or tiling, or not an Energon dataset.
        WorkloadError: an empty dataset, or a sample that cannot be read (naming it).
    """
    from megatron.mllm.data_blend import blend_of
    from megatron.mllm.data_energon import EnergonStream
    from megatron.mllm.preprocess import AudioFeatures
    from megatron.mllm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("HuggingFaceTokenizer", tokenizer_model)
    try:
        tiling = image_preprocessor(
            image_preprocess, patch, tile, max_tiles, min_pixels, max_pixels
        )
    except ValueError as e:
        raise WorkloadError(str(e)) from e
    blend = blend_of([directory])
    metas = []
    for e in blend:  # each dataset's samples once (its split part), whatever it weighs
        stream = EnergonStream(
            e.path, tokenizer, tiling, AudioFeatures(mels), seed=0, prompt_format=prompt_format,
            label=e.label if len(blend) > 1 else "", split_part=e.split_part,
        )  # fmt: skip
        metas += [stream.sample_meta(stream.read(i)) for i in range(len(stream))]
    return metas


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool; returns the exit status (2 on a user error)."""
    from megatron.mllm.arguments import ConfigError

    args = build_parser().parse_args(argv)
    home = args.directory
    if os.path.isfile(home):  # a metadataset YAML
        home = os.path.dirname(os.path.abspath(home))
    output = args.output or os.path.join(home, "metadata.jsonl")
    tok = args.tokenizer_model or os.path.join(home, "tokenizer")
    try:
        metas = scan(
            args.directory, tok, args.image_tile_size, args.image_max_tiles,
            args.vision_patch_size, args.audio_feature_dim, args.image_preprocess,
            args.min_pixels, args.max_pixels, args.prompt_format,
        )  # fmt: skip
        try:
            with open(output, "w", encoding="utf-8") as f:
                write_jsonl(metas, f)
        except OSError as e:
            raise WorkloadError(f"cannot write {output}: {e.strerror}") from e
        report = workload_report(SampleStream(output), output, None)
    except (ConfigError, WorkloadError) as e:
        return report_error(str(e))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1, allow_nan=False) + "\n")
    else:
        sys.stdout.write(f"wrote {len(metas)} samples to {output}\n" + format_report(report))
    sys.stdout.flush()
    return 0

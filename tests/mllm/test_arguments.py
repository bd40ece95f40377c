# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's parser plus OrchWeave's flags, and the errors a bad layout gets."""

from __future__ import annotations

import pytest

from megatron.mllm.arguments import ConfigError, parse_arguments

BASE = [
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "128", "--max-position-embeddings", "128", "--vocab-size", "500",
    "--micro-batch-size", "2", "--train-iters", "3", "--lr", "1e-3",
]  # fmt: skip


def test_megatron_flags_and_ours_parse_with_derived_defaults():
    args = parse_arguments([*BASE, "--vision-hidden-size", "48", "--audio-num-layers", "0"], 2)
    assert args.data_parallel_size == 2
    assert args.global_batch_size == 4  # Megatron's default: mbs x dp
    assert args.vision_hidden_size == 48 and args.vision_ffn_hidden_size == 192
    assert args.vision_num_attention_heads == 4
    assert args.audio_num_layers == 0
    assert args.padded_vocab_size == 512  # Megatron pads to a multiple of 128 x TP
    assert args.workload == "omni-three-modality" and args.workload_seed == args.seed


@pytest.mark.parametrize(
    "flags,world,message",
    [
        (
            ["--pipeline-model-parallel-size", "2"],
            3,
            r"--pipeline-model-parallel-size 2 .* " r"does not divide the world size 3",
        ),
        (
            ["--tensor-model-parallel-size", "4"],
            2,
            r"--tensor-model-parallel-size 4 .*world size 2",
        ),
        (
            ["--pipeline-model-parallel-size", "3"],
            3,
            r"--num-layers 4 is not divisible by " r"--pipeline-model-parallel-size 3",
        ),
        (
            ["--global-batch-size", "6"],
            2,
            r"--global-batch-size 6 is not a multiple of "
            r"--micro-batch-size 2 x data-parallel size 2",
        ),
        (
            ["--vision-num-attention-heads", "5"],
            1,
            r"--vision-hidden-size 64 is not divisible by " r"--vision-num-attention-heads 5",
        ),
        (["--workload-token-scale", "0"], 1, r"--workload-token-scale must be positive"),
    ],
)
def test_bad_layouts_and_flags_name_the_flags(flags, world, message):
    with pytest.raises(ConfigError, match=message):
        parse_arguments([*BASE, *flags], world)

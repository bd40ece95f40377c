# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's parser plus OrchWeave's flags, and the errors a bad layout gets."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import timedelta

import pytest

from megatron.mllm.arguments import ConfigError, parse_arguments
from megatron.mllm.run_config import OPTION_GROUPS, EncoderArgs, RunConfig

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


def test_the_typed_run_config_carries_every_flag():
    args = parse_arguments(
        [*BASE, "--post-balance", "kk", "--post-balance-token-caps", "vision=100", "llm=900",
         "--no-check-plan-digest", "--balance-phases", "vision", "llm", "--pipeline-schedule",
         "dynamic", "--pipeline-model-parallel-size", "2", "--vision-chunks-per-stage", "2",
         "--audio-num-layers", "0", "--vision-num-layers", "4", "--projector-type", "affine",
         "--lr-warmup-iters", "1"],
        4,
    )  # fmt: skip
    run = RunConfig.from_args(args)
    assert run.parallel.data == 2 and run.num_microbatches == 1 and run.packing_limit == 256
    assert run.balance.post_balance == "kk" and not run.balance.check_plan_digest
    assert run.balance.token_caps == {"vision": 100, "llm": 900}
    assert run.balance.balance_phases == ["vision", "llm"]
    assert run.pipeline.chunks_per_stage() == {"vision": 2, "audio": 1, "llm": 1}
    assert run.uses_runtime and run.multimodal.projector_type == "affine"
    assert set(run.encoders) == {"vision"} and run.encoders["vision"].num_layers == 4
    assert run.training.train_iters == 3 and run.optimizer.lr == 1e-3
    assert run.ddp.use_distributed_optimizer is False
    # Every field of OrchWeave's config dataclasses is a flag whose help is its docstring.
    help_text = subprocess.run(
        [sys.executable, "-c", "from megatron.mllm.arguments import parse_arguments; "
         "parse_arguments(['--help'])"],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    for _, cls in OPTION_GROUPS:
        for f in dataclasses.fields(cls):
            names = f.metadata.get("argparse_meta", {}).get("arg_names")
            assert (names or ["--" + f.name.replace("_", "-")])[0] in help_text, f.name
    for f in dataclasses.fields(EncoderArgs):
        assert f"--audio-{f.name.replace('_', '-')}" in help_text, f.name
    assert "Hidden classes of synthetic images/audio" in help_text


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--lr-warmup-iters", "3"], r"--lr-warmup-iters 3 must be smaller than the decay"),
        (
            ["--max-position-embeddings", "64"],
            r"Megatron's argument validation failed: "
            r"max_position_embeddings \(64\) must be greater than or equal to seq_length",
        ),
        (
            ["--fp16", "--bf16"],
            r"Megatron's argument validation failed: assert not args\.bf16 \(arguments\.py:\d+\)",
        ),
        (["--post-balance", "auto", "--node-wise-a2a", "--gpus-per-node", "3"],
         r"--gpus-per-node 3 does not divide the data-parallel size 2"),  # fmt: skip
        (["--post-balance-token-caps", "video=10"], r"expected PHASE=TOKENS"),
        (["--step-prediction"], r"--step-prediction .* needs --timing-log-level 1 or 2"),
        (["--profile-trace", "t.json"], r"--profile-trace needs --profile"),
        (["--cost-calibration", "nowhere.json"],
         r"--cost-calibration nowhere.json: calibration file not found"),  # fmt: skip
        (["--profile", "--train-iters", "5"], r"--profile-step-end 12 is past --train-iters 5"),
        (["--profile", "--profile-step-start", "3", "--profile-step-end", "3"],
         r"--profile-step-start 3 must be >= 0 and below --profile-step-end 3"),  # fmt: skip
        (["--profile", "--profile-step-start", "0", "--profile-step-end", "1", "--profile-ranks",
          "2"], r"--profile-ranks 2 is not a rank of this 2-rank run"),  # fmt: skip
    ],
)
def test_bad_flags_are_config_errors_not_tracebacks(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_arguments([*BASE, *flags], 2)


def test_the_distributed_timeout_takes_fractions_of_a_minute_and_must_be_positive():
    # Megatron's flag is whole minutes; fractions let tests and short jobs fail within seconds.
    run = RunConfig.from_args(parse_arguments([*BASE, "--distributed-timeout-minutes", "0.15"], 1))
    assert run.distributed_timeout == timedelta(seconds=9)
    default = RunConfig.from_args(parse_arguments(BASE, 1)).distributed_timeout
    assert default == timedelta(minutes=10)  # Megatron's
    for bad in ("0", "-0.5", "nan"):
        with pytest.raises(
            ConfigError, match=r"--distributed-timeout-minutes must be a number > 0"
        ):
            parse_arguments([*BASE, "--distributed-timeout-minutes", bad], 1)

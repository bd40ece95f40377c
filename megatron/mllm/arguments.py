# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchWeave's command-line flags, added to Megatron-LM's parser, and their validation.

The LLM keeps Megatron's names (``--num-layers``, ``--hidden-size``, ``--seq-length``, ...);
the encoders, the workload and OrchWeave's features get flags of their own here.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from orchestration.workload_spec import DEFAULT_WORKLOAD


class ConfigError(ValueError):
    """A flag, or a combination of flags, that cannot work; the message names them."""


def add_mllm_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Extra-args provider for ``megatron.training.arguments.parse_args``."""
    group = parser.add_argument_group(title="OrchWeave: workload")
    group.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        help="Workload spec (path or built-in name, e.g. omni-three-modality) or a JSONL file "
        "of sample metadata. Default: %(default)s.",
    )
    group.add_argument(
        "--workload-seed",
        type=int,
        default=None,
        help="Seed of the generated sample stream and payloads. Default: --seed.",
    )
    group.add_argument(
        "--workload-token-scale",
        type=float,
        default=1.0,
        help="Multiply every token count of the workload by this factor (each rounded, at least "
        "1), to run a realistic mix on a small model. Default: %(default)s.",
    )
    group.add_argument(
        "--synthetic-num-classes",
        type=int,
        default=16,
        help="Hidden classes of synthetic images/audio; the text after an item names its class, "
        "so the LM loss can only reach its floor by reading the encoders. Default: %(default)s.",
    )

    for name, layers, feature_help in (("vision", 2, None), ("audio", 2, None)):
        group = parser.add_argument_group(title=f"OrchWeave: {name} encoder")
        group.add_argument(
            f"--{name}-num-layers",
            type=int,
            default=layers,
            help=f"Transformer layers of the {name} encoder. Default: %(default)s.",
        )
        group.add_argument(
            f"--{name}-hidden-size",
            type=int,
            default=None,
            help=f"Hidden size of the {name} encoder. Default: --hidden-size.",
        )
        group.add_argument(
            f"--{name}-num-attention-heads",
            type=int,
            default=None,
            help=f"Attention heads of the {name} encoder. Default: --num-attention-heads.",
        )
        group.add_argument(
            f"--{name}-ffn-hidden-size",
            type=int,
            default=None,
            help=f"MLP hidden size of the {name} encoder. Default: 4 x its hidden size.",
        )
    parser.add_argument_group(title="OrchWeave: vision encoder").add_argument(
        "--vision-patch-size",
        type=int,
        default=14,
        help="Pixels per patch side; each vision token is a 3 x p x p patch. Default: %(default)s.",
    )
    parser.add_argument_group(title="OrchWeave: audio encoder").add_argument(
        "--audio-feature-dim",
        type=int,
        default=128,
        help="Features per audio frame (mel bins) fed to the audio encoder. Default: %(default)s.",
    )

    group = parser.add_argument_group(title="OrchWeave: batch post-balancing (OrchMLLM)")
    group.add_argument(
        "--post-balance",
        choices=["none", "lpt", "kk", "auto"],
        default="none",
        help="Re-balance every iteration's work across data-parallel ranks after loading: "
        "per phase (each encoder, then the LLM) with PP=1, whole samples across DP groups with "
        "PP>1. lpt/kk: greedy or Karmarkar-Karp plus a refinement pass; auto: the best of all "
        "within a small budget. none: upstream Megatron. Default: %(default)s.",
    )
    group.add_argument(
        "--balance-phases",
        nargs="+",
        choices=["vision", "audio", "llm"],
        default=["vision", "audio", "llm"],
        help="Phases to balance with PP=1; the others keep the loader's assignment. "
        "Default: all.",
    )
    group.add_argument(
        "--node-wise-a2a",
        action="store_true",
        help="Move data with the node-wise all-to-all (one message per node pair) instead of "
        "one flat all-to-all.",
    )
    group.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="Ranks per node, for node-aware placement and --node-wise-a2a. Default: "
        "$LOCAL_WORLD_SIZE (set by torchrun), else the visible GPUs, else 8.",
    )
    group.add_argument(
        "--no-check-plan-digest",
        dest="check_plan_digest",
        action="store_false",
        help="Skip comparing the balance plan's digest across DP ranks every iteration.",
    )
    group.add_argument(
        "--post-balance-token-caps",
        nargs="+",
        default=[],
        metavar="PHASE=TOKENS",
        help="Largest summed tokens a rank may get in a phase (memory), e.g. vision=8192 "
        "llm=16384. A single item larger than its cap is an error naming the sample.",
    )
    group.add_argument(
        "--cost-calibration",
        default=None,
        help="Calibration JSON of measured per-layer times (tools/calibrate.py) for the "
        "balancer's cost model. Default: costs from the model's FLOPs.",
    )

    group = parser.add_argument_group(title="OrchWeave: pipeline runtime (PipeWeaver/DIP)")
    group.add_argument(
        "--pipeline-schedule",
        choices=["megatron", "1f1b", "interleaved", "dynamic"],
        default="megatron",
        help="megatron: megatron-core's own engine (encoders on stage 0, fixed padded shapes). "
        "1f1b / interleaved: the same orders in OrchWeave's schedule IR, run by its runtime "
        "(no padding). dynamic: every module cut into chunks over all stages, a new greedy "
        "dual-queue order every batch. Default: %(default)s.",
    )
    for name in ("vision", "audio", "llm"):
        group.add_argument(
            f"--{name}-chunks-per-stage",
            type=int,
            default=1,
            help=f"K: the {name} module is cut into pipeline-size x K chunks, chunk j on stage "
            f"j mod P (dynamic; interleaved uses the LLM's). Default: %(default)s.",
        )
    group.add_argument(
        "--encoder-sub-microbatch-tokens",
        type=int,
        default=0,
        help="Split each microbatch's images/audio into sub-microbatches of at most this many "
        "encoder tokens (whole items) that flow through the encoder chunks separately; 0 keeps "
        "one sub per encoder and microbatch. Default: %(default)s.",
    )
    group.add_argument(
        "--pipeline-recompute",
        choices=["none", "all"],
        default="none",
        help="Runtime schedules: recompute every chunk's forward in its backward (activation "
        "checkpointing per stage). Default: %(default)s.",
    )

    group = parser.add_argument_group(title="OrchWeave: projectors and logging")
    group.add_argument(
        "--projector-type",
        choices=["mlp", "affine"],
        default="mlp",
        help="Encoder-to-LLM projector (megatron-core MultimodalProjector). Default: %(default)s.",
    )
    group.add_argument(
        "--metrics-jsonl",
        default=None,
        help="Append one JSON object of metrics per iteration to this file (last rank only).",
    )
    return parser


def parse_arguments(argv: Sequence[str] | None = None, world_size: int | None = None):
    """Parse Megatron's flags plus ours, check the parallel layout, run Megatron's validation.

    Args:
        argv: command-line arguments without the program name; default ``sys.argv[1:]``.
        world_size: number of processes; default ``$WORLD_SIZE`` (as torchrun sets it) or 1.

    Returns:
        argparse.Namespace: validated arguments, Megatron's and ours.

    Raises:
        ConfigError: the layout or a flag combination cannot work.
    """
    from megatron.mllm import cpu_shim

    cpu_shim.apply()
    from megatron.training.arguments import parse_args, validate_args

    saved = sys.argv
    sys.argv = [
        saved[0] if saved else "pretrain_mllm.py",
        *(sys.argv[1:] if argv is None else argv),
    ]
    try:
        args = parse_args(extra_args_provider=add_mllm_args)
    finally:
        sys.argv = saved
    args.world_size = world_size if world_size is not None else int(os.getenv("WORLD_SIZE", "1"))
    check_layout(args)
    validate_args(args, {})
    finish_arguments(args)
    return args


def check_layout(args: argparse.Namespace) -> None:
    """Reject a parallel layout that does not divide the world size, naming the flags."""
    tp = args.tensor_model_parallel_size
    pp = args.pipeline_model_parallel_size
    cp = args.context_parallel_size
    model = tp * pp * cp
    if args.world_size % model != 0:
        raise ConfigError(
            f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} x "
            f"--context-parallel-size {cp} = {model} does not divide the world size "
            f"{args.world_size} (number of processes)"
        )
    if cp != 1:
        raise ConfigError("--context-parallel-size > 1 is not supported by OrchWeave yet")
    if args.num_layers % pp != 0 and args.pipeline_schedule == "megatron":
        raise ConfigError(
            f"--num-layers {args.num_layers} is not divisible by --pipeline-model-parallel-size "
            f"{pp}: the baseline splits the LLM layers evenly over the stages"
        )
    dp = args.world_size // model
    mbs, gbs = args.micro_batch_size, args.global_batch_size
    if gbs is not None and gbs % (mbs * dp) != 0:
        raise ConfigError(
            f"--global-batch-size {gbs} is not a multiple of --micro-batch-size {mbs} x "
            f"data-parallel size {dp}"
        )


def finish_arguments(args: argparse.Namespace) -> None:
    """Derive defaults of our flags and the fields Megatron derives from a tokenizer."""
    if args.seq_length is None:
        raise ConfigError("--seq-length is required")
    if args.vocab_size is None:
        raise ConfigError("--vocab-size is required (OrchWeave trains on synthetic token ids)")
    if args.workload_seed is None:
        args.workload_seed = args.seed
    if args.workload_token_scale <= 0:
        raise ConfigError(
            f"--workload-token-scale must be positive, got {args.workload_token_scale}"
        )
    for name in ("vision", "audio"):
        hidden = getattr(args, f"{name}_hidden_size") or args.hidden_size
        setattr(args, f"{name}_hidden_size", hidden)
        heads = getattr(args, f"{name}_num_attention_heads") or args.num_attention_heads
        setattr(args, f"{name}_num_attention_heads", heads)
        if hidden % heads != 0:
            raise ConfigError(
                f"--{name}-hidden-size {hidden} is not divisible by "
                f"--{name}-num-attention-heads {heads}"
            )
        if getattr(args, f"{name}_ffn_hidden_size") is None:
            setattr(args, f"{name}_ffn_hidden_size", 4 * hidden)
        if getattr(args, f"{name}_num_layers") < 0:
            raise ConfigError(f"--{name}-num-layers must be >= 0")
    # Megatron pads the vocabulary so that every TP shard has the same, aligned size.
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    args.padded_vocab_size = -(-args.vocab_size // multiple) * multiple
    if args.synthetic_num_classes < 1:
        raise ConfigError("--synthetic-num-classes must be >= 1")
    args.post_balance_caps = _parse_caps(args.post_balance_token_caps)
    for name in ("vision", "audio", "llm"):
        if getattr(args, f"{name}_chunks_per_stage") < 1:
            raise ConfigError(f"--{name}-chunks-per-stage must be >= 1")
    if args.encoder_sub_microbatch_tokens < 0:
        raise ConfigError("--encoder-sub-microbatch-tokens must be >= 0")
    pp = args.pipeline_model_parallel_size
    if args.pipeline_schedule != "megatron":
        for name in ("vision", "audio", "llm"):
            layers = args.num_layers if name == "llm" else getattr(args, f"{name}_num_layers")
            k = getattr(args, f"{name}_chunks_per_stage")
            if args.pipeline_schedule != "dynamic":
                k = 1 if name != "llm" or args.pipeline_schedule == "1f1b" else k
                if name != "llm":
                    continue
            if layers and layers < pp * k:
                raise ConfigError(
                    f"--pipeline-schedule {args.pipeline_schedule} cuts the {name} module into "
                    f"--pipeline-model-parallel-size {pp} x --{name}-chunks-per-stage {k} chunks, "
                    f"but it has only {layers} layers"
                )
    if args.pipeline_schedule == "megatron" and args.pipeline_recompute != "none":
        raise ConfigError(
            "--pipeline-recompute applies to OrchWeave's runtime; with --pipeline-schedule "
            "megatron use Megatron's --recompute-granularity"
        )
    if args.gpus_per_node is None:
        args.gpus_per_node = _default_gpus_per_node()
    if args.gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")


def _parse_caps(items: Sequence[str]) -> dict[str, int]:
    caps = {}
    for item in items:
        phase, _, value = item.partition("=")
        if phase not in ("vision", "audio", "llm") or not value.isdigit() or int(value) < 1:
            raise ConfigError(
                f"--post-balance-token-caps: expected PHASE=TOKENS with PHASE in vision, audio, "
                f"llm and TOKENS a positive integer, got {item!r}"
            )
        caps[phase] = int(value)
    return caps


def _default_gpus_per_node() -> int:
    if os.getenv("LOCAL_WORLD_SIZE"):
        return int(os.environ["LOCAL_WORLD_SIZE"])
    import torch

    return torch.cuda.device_count() or 8

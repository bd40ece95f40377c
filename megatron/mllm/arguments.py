# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchWeave's command-line flags, added to Megatron-LM's parser, and their validation.

The LLM and the run keep Megatron's names (``--num-layers``, ``--seq-length``, ...); the
encoders, the workload and OrchWeave's features get groups of their own, built from the config
dataclasses of :mod:`megatron.mllm.run_config` as Megatron builds its own groups.
:func:`parse_arguments` parses, checks and completes the arguments; ``RunConfig.from_args``
turns them into typed configs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import logging
import math
import os
import sys
import traceback
from typing import Sequence

from megatron.mllm.pipeline_arguments import check_pipeline
from megatron.mllm.post_balance_arguments import check_post_balance
from megatron.mllm.run_config import AUTO, ENCODER_NAMES, OPTION_GROUPS, EncoderArgs, WorkloadConfig
from orchestration.calibration import Calibration
from orchestration.locality import node_wise_layout_problem

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A flag, or a combination of flags, that cannot work; the message names them."""


ONE_REPLICA = 0
"""``world_size`` for a model looked at without a cluster (reports, tests): one model replica,
TP x PP x CP processes, so the data-parallel size is 1."""


def int_or_auto(text: str) -> int | str:
    """argparse type of a partitioner flag: an integer, or ``auto``."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def _group_factory(cls: type):
    """megatron-training's ``ArgumentGroupFactory`` for ``cls``, which also reads the type
    ``int | Literal["auto"]`` (argparse type :func:`int_or_auto`)."""
    import typing

    from megatron.training.argument_utils import ArgumentGroupFactory

    class Factory(ArgumentGroupFactory):
        def _extract_type(self, config_type):
            if typing.get_args(config_type) == (int, typing.Literal[AUTO]):
                return {"type": int_or_auto, "metavar": "N|auto"}
            return super()._extract_type(config_type)

    return Factory(cls)


class _EncoderGroupFactory:
    """Builds one encoder's group from :class:`EncoderArgs`: field ``num_layers`` of the vision
    encoder becomes ``--vision-num-layers`` (dest ``vision_num_layers``)."""

    def __init__(self, encoder: str):
        from megatron.training.argument_utils import ArgumentGroupFactory

        self.encoder = encoder
        self.factory = ArgumentGroupFactory(EncoderArgs)

    def build_group(self, parser: argparse.ArgumentParser) -> None:
        """Add the group to ``parser``."""
        group = parser.add_argument_group(title=f"OrchWeave: {self.encoder} encoder")
        for attribute in dataclasses.fields(EncoderArgs):
            kwargs = self.factory._build_argparse_kwargs_from_field(attribute)
            kwargs.pop("arg_names")
            kwargs["dest"] = f"{self.encoder}_{attribute.name}"
            flag = f"--{self.encoder}-{attribute.name.replace('_', '-')}"
            group.add_argument(flag, **kwargs)


def add_mllm_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Extra-args provider for ``megatron.training.arguments.parse_args``: OrchWeave's groups,
    built from the config dataclasses of :mod:`megatron.mllm.run_config`."""
    for title, cls in OPTION_GROUPS:
        _group_factory(cls).build_group(parser, title)
        if cls is WorkloadConfig:
            for encoder in ENCODER_NAMES:
                _EncoderGroupFactory(encoder).build_group(parser)
    # Megatron's timeout is whole minutes; fractions (a compatible superset) let a short job or
    # a test fail in seconds. It bounds every wait on another rank, OrchWeave's included.
    timeout = parser._option_string_actions["--distributed-timeout-minutes"]
    timeout.type = float
    timeout.help = (
        "Minutes (a number > 0; fractions allowed, 0.5 = 30 s) that any wait on another rank may "
        "last: the pipeline runtime's sends and receives, the post-balancing collectives, "
        "megatron-core's. On expiry the waiting rank stops with exit status 2 and one error line "
        "naming itself, what it waited on and the peer or group (on NCCL, collectives that do "
        "not block the host are ended by NCCL's watchdog instead)."
    )
    # A few of megatron-core 0.19.2's help texts carry a bare '%' ("10%"), which makes argparse's
    # --help raise; escape those so that --help prints.
    for action in parser._actions:
        if action.help and "%" in action.help and "%(" not in action.help:
            action.help = action.help.replace("%", "%%")
    return parser


def parse_arguments(argv: Sequence[str] | None = None, world_size: int | None = None):
    """Parse Megatron's flags plus ours, check the parallel layout, run Megatron's validation.

    Args:
        argv: command-line arguments without the program name; default ``sys.argv[1:]``.
        world_size: number of processes; default ``$WORLD_SIZE`` (as torchrun sets it) or 1;
            :data:`ONE_REPLICA` for exactly one model replica.

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
    # Megatron prints every argument (hundreds of lines) and its notes while validating: they
    # go to the debug log, so that the run's own log stays readable.
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            try:
                args = parse_args(extra_args_provider=add_mllm_args)
            except SystemExit:  # --help, or a usage error: what argparse printed is for the user
                sys.__stdout__.write(printed.getvalue())
                printed = io.StringIO()
                raise
            if world_size is None:
                world_size = int(os.getenv("WORLD_SIZE", "1"))
            if world_size == ONE_REPLICA:
                world_size = (
                    args.tensor_model_parallel_size
                    * args.pipeline_model_parallel_size
                    * args.context_parallel_size
                )
            args.world_size = world_size
            check_required(args)
            check_layout(args)
            check_data_parallel(args)
            try:
                validate_args(args, {})
            except AssertionError as e:
                # Megatron validates with asserts, some without a message: name the check.
                frame = traceback.extract_tb(e.__traceback__)[-1]
                what = str(e) or f"{frame.line} ({os.path.basename(frame.filename)}:{frame.lineno})"
                raise ConfigError(f"Megatron's argument validation failed: {what}") from e
    finally:
        sys.argv = saved
        if printed.getvalue():
            logger.debug("%s", printed.getvalue().rstrip("\n"))
    finish_arguments(args)
    return args


def check_required(args: argparse.Namespace) -> None:
    """Reject a run without a flag that has no default, naming it.

    Runs before Megatron's validation, whose bare asserts would fail on them with no message.
    """
    if args.micro_batch_size is None:
        raise ConfigError("--micro-batch-size is required")
    if args.seq_length is None:
        raise ConfigError("--seq-length is required")
    if args.data_path:
        check_data_path(args)
    if args.vocab_size is None:
        raise ConfigError(
            "--vocab-size is required (OrchWeave trains on synthetic token ids without "
            "--data-path)"
        )
    heads = args.num_attention_heads
    if args.hidden_size is not None and heads and args.hidden_size % heads:
        raise ConfigError(
            f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads {heads}"
        )


def check_data_path(args: argparse.Namespace) -> None:
    """Real data: a dataset directory, a blend or a metadataset YAML, and a tokenizer;
    ``--vocab-size`` defaults to the tokenizer's vocabulary."""
    from megatron.mllm.data_blend import blend_of
    from megatron.mllm.data_energon import check_prompt_format
    from megatron.mllm.tokenizer import load_tokenizer

    blend_of(args.data_path)
    if args.num_workers < 0:
        raise ConfigError(f"--num-workers must be >= 0, got {args.num_workers}")
    tokenizer = load_tokenizer(args.tokenizer_type, args.tokenizer_model)
    check_prompt_format(args.prompt_format, tokenizer)
    if args.vocab_size is None:
        args.vocab_size = tokenizer.vocab_size


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


def check_data_parallel(args: argparse.Namespace) -> None:
    """Reject the data-parallel options that OrchWeave's steps cannot run, naming the flag.

    Runs before Megatron's validation, which would reject ``--use-megatron-fsdp`` on a point
    beside this one (its checkpoint format).
    """
    if args.ddp_bucket_size is not None and not args.overlap_grad_reduce:
        raise ConfigError(
            "--ddp-bucket-size sizes the buckets of --overlap-grad-reduce: add it (without it "
            "the gradients are reduced in one bucket after the backward)"
        )
    if args.use_megatron_fsdp:
        raise ConfigError(FSDP_UNSUPPORTED)


FSDP_UNSUPPORTED = (
    "--use-megatron-fsdp is not supported by OrchWeave: megatron-core 0.19.2's Megatron-FSDP "
    "builds its device mesh without pipeline stages (PP > 1 fails), swaps its parameters in "
    "only around the wrapped model's forward (the balanced step and the pipeline runtime call "
    "encoder and layer chunks directly), and with sharded parameters needs every DP rank to "
    "run the same layers (a rank whose batch has no image skips the vision encoder); "
    "--use-distributed-optimizer shards the optimizer state in every mode"
)
"""Why ``--use-megatron-fsdp`` is refused, in every mode (the README's list of what is not
supported says the same): it would run only the PP = 1 baseline without balancing."""


def finish_arguments(args: argparse.Namespace) -> None:
    """Check our flags and derive their defaults, and the fields Megatron derives from a
    tokenizer, in place."""
    _check_schedules(args)
    _check_recompute(args)
    minutes = args.distributed_timeout_minutes
    if not 0 < minutes < math.inf:
        raise ConfigError(f"--distributed-timeout-minutes must be a number > 0, got {minutes}")
    if args.workload_seed is None:
        args.workload_seed = args.seed
    if args.workload_token_scale <= 0:
        raise ConfigError(
            f"--workload-token-scale must be positive, got {args.workload_token_scale}"
        )
    for name in ENCODER_NAMES:
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
    try:
        check_pipeline(args)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.gpus_per_node is None:
        args.gpus_per_node = _default_gpus_per_node()
    if args.gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")
    if args.step_prediction and args.timing_log_level < 1:
        raise ConfigError(
            "--step-prediction sets predictions beside measurements: it needs "
            "--timing-log-level 1 or 2"
        )
    _check_profiling(args)
    if args.cost_calibration:
        # Read here, on every rank: the balancer and the predictor read it later on some ranks
        # only, and a bad file must stop all of them with the same line.
        try:
            Calibration.load(args.cost_calibration)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"--cost-calibration {args.cost_calibration}: {e}") from None
    try:
        check_post_balance(args)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.post_balance != "none" and args.node_wise_a2a:
        problem = node_wise_layout_problem(
            args.world_size, args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
            args.gpus_per_node,
        )  # fmt: skip
        if problem:
            raise ConfigError(f"--node-wise-a2a: {problem}")


RECOMPUTE_MODULES_SUPPORTED = ("core_attn",)
"""``--recompute-modules`` that selective recompute may name: the one whose recompute in
OrchWeave's chunks is modelled by SEMU and tested against the trainer's measured memory."""


def _check_recompute(args: argparse.Namespace) -> None:
    """Megatron's ``--recompute-*`` rules, checked with the flags' names (megatron-core's
    ``TransformerConfig`` raises them later as bare errors), and the modules OrchWeave runs."""
    granularity = args.recompute_granularity
    if granularity == "full":
        if args.recompute_method is None or not args.recompute_num_layers:
            raise ConfigError(
                "--recompute-granularity full needs --recompute-method uniform|block and "
                "--recompute-num-layers N (layers per recomputed group, or recomputed per stage)"
            )
        if args.recompute_num_layers < 1:
            raise ConfigError(
                f"--recompute-num-layers must be >= 1, got {args.recompute_num_layers}"
            )
        return
    if args.recompute_method is not None or args.recompute_num_layers is not None:
        flag = "--recompute-method" if args.recompute_method is not None else (
            "--recompute-num-layers")  # fmt: skip
        raise ConfigError(f"{flag} applies to --recompute-granularity full only")
    modules = list(getattr(args, "recompute_modules", None) or RECOMPUTE_MODULES_SUPPORTED)
    unsupported = sorted(set(modules) - set(RECOMPUTE_MODULES_SUPPORTED))
    if granularity == "selective" and unsupported:
        raise ConfigError(
            f"--recompute-modules {' '.join(unsupported)} is not supported by OrchWeave: "
            f"selective recompute runs (and SEMU models) {', '.join(RECOMPUTE_MODULES_SUPPORTED)} "
            "only"
        )


def _check_schedules(args: argparse.Namespace) -> None:
    """megatron-core's ``OptimizerParamScheduler`` rules, checked with the flags' names (the
    scheduler asserts them without a message, after the process groups are up)."""
    # Steps count samples (training._scheduler): both sides scale by --global-batch-size.
    decay = args.lr_decay_iters or args.train_iters
    decay_flag = "--lr-decay-iters" if args.lr_decay_iters else "--train-iters"
    if decay is not None and decay <= 0:
        raise ConfigError(f"{decay_flag} {decay} must be positive (the learning-rate decay)")
    if decay is not None and args.lr_warmup_fraction is not None:
        if not 0 <= args.lr_warmup_fraction < 1:
            raise ConfigError(
                f"--lr-warmup-fraction {args.lr_warmup_fraction} must be >= 0 and below 1: the "
                f"warmup must end before the decay ({decay_flag} {decay})"
            )
    elif decay is not None and args.lr_warmup_iters >= decay:
        raise ConfigError(
            f"--lr-warmup-iters {args.lr_warmup_iters} must be smaller than the decay iterations "
            f"({decay_flag} {decay})"
        )
    if args.lr is not None and args.lr_warmup_init > args.lr:
        raise ConfigError(f"--lr-warmup-init {args.lr_warmup_init} must be <= --lr {args.lr}")
    start, end = args.start_weight_decay, args.end_weight_decay
    if start is not None and start < 0:
        raise ConfigError(f"--start-weight-decay {start} must be >= 0")
    if start is not None and end is not None and end < start:
        raise ConfigError(
            f"--end-weight-decay {end} must be >= --start-weight-decay {start} (weight decay "
            f"only increases)"
        )


def check_tensor_parallel(args: argparse.Namespace) -> None:
    """Every size that tensor parallelism splits divides by its size: the trainer checks it
    before any process group starts, naming the flag (megatron-core checks each as it builds
    the module, naming its own field, e.g. ``num_attention_heads`` for an encoder's heads).

    Not part of :func:`parse_arguments`: a model config of ``scripts/configs`` may describe a
    layout that SEMU predicts and that Megatron-based trainers build by padding (omni-84b's
    25-head encoders over TP 8).

    Raises:
        ConfigError: naming the flag and ``--tensor-model-parallel-size``.
    """
    tp = args.tensor_model_parallel_size
    groups = args.num_query_groups if args.group_query_attention else None
    # Key/value groups are split, or each replicated over TP / groups ranks.
    if groups is not None and groups % tp and tp % groups:
        raise ConfigError(
            f"--num-query-groups {groups} must be a multiple or a divisor of "
            f"--tensor-model-parallel-size {tp}"
        )
    split = [("--num-attention-heads", args.num_attention_heads)]
    # The MLP's first linear layer is split by columns (and the LLM's projectors use it too).
    split.append(("--ffn-hidden-size", args.ffn_hidden_size))
    for name in ENCODER_NAMES:
        if getattr(args, f"{name}_num_layers") > 0:
            split.append(
                (f"--{name}-num-attention-heads", getattr(args, f"{name}_num_attention_heads"))
            )
            split.append((f"--{name}-ffn-hidden-size", getattr(args, f"{name}_ffn_hidden_size")))
    for flag, value in split:
        if value is not None and value % tp:
            raise ConfigError(
                f"{flag} {value} is not divisible by --tensor-model-parallel-size {tp}: tensor "
                f"parallelism splits it evenly over the ranks"
            )


def _check_profiling(args: argparse.Namespace) -> None:
    ours = [f for f, v in (("--profile-trace", args.profile_trace),
                           ("--profile-png", args.profile_png),
                           ("--use-pytorch-profiler", args.use_pytorch_profiler)) if v]  # fmt: skip
    if not args.profile:
        if ours:
            raise ConfigError(
                f"{ours[0]} needs --profile (the profiled iterations are --profile-step-start "
                "to --profile-step-end)"
            )
        return
    start, end = args.profile_step_start, args.profile_step_end
    if not 0 <= start < end:
        raise ConfigError(
            f"--profile-step-start {start} must be >= 0 and below --profile-step-end {end}"
        )
    if args.train_iters is not None and end > args.train_iters:
        raise ConfigError(
            f"--profile-step-end {end} is past --train-iters {args.train_iters}: the profiled "
            f"iterations would not all run"
        )
    bad = [r for r in args.profile_ranks if not 0 <= r < args.world_size]
    if bad:
        raise ConfigError(
            f"--profile-ranks {bad[0]} is not a rank of this {args.world_size}-rank run"
        )
    if args.profile_png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--profile-png needs matplotlib, OrchWeave's optional extra 'plots': "
                "pip install 'orchweave[plots]'"
            ) from None


def _default_gpus_per_node() -> int:
    if os.getenv("LOCAL_WORLD_SIZE"):
        return int(os.environ["LOCAL_WORLD_SIZE"])
    import torch

    return torch.cuda.device_count() or 8

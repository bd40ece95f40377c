# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron flags the trainer parses but cannot honour, refused with one error naming the flag.

Without these checks each would be silently ignored (the run trains something else than the
flag asks for) or fail deep inside megatron-core with a traceback. They run when the trainer
starts, before any process group, and not in the argument parser: SEMU parses the same flags
for runs it simulates (the paper configs' virtual pipeline stages, half precision on GPUs).
"""

from __future__ import annotations

import argparse

import torch

from megatron.mllm.arguments import ConfigError


def check_trainer_flags(args: argparse.Namespace) -> None:
    """Raise :class:`ConfigError` for the first Megatron flag that this trainer cannot run."""
    if (args.bf16 or args.fp16) and not torch.cuda.is_available():
        flag = "--bf16" if args.bf16 else "--fp16"
        raise ConfigError(
            f"{flag} needs a CUDA device: megatron-core's mixed-precision optimizer wraps "
            "CUDA tensors only (on a CPU, train in fp32: leave the flag out)"
        )
    if args.virtual_pipeline_model_parallel_size is not None:  # set by either flag
        flag = ("--num-layers-per-virtual-pipeline-stage"
                if args.num_layers_per_virtual_pipeline_stage is not None
                else "--num-virtual-stages-per-pipeline-rank")  # fmt: skip
        raise ConfigError(
            f"{flag} (megatron-core's virtual pipeline stages) is not supported by "
            "OrchWeave's trainer: --pipeline-schedule interleaved --llm-chunks-per-stage K "
            "runs Megatron's interleaved 1F1B with K LLM chunks per stage (SEMU simulates "
            "the flag)"
        )
    _check_optimizer_instances(args)
    if args.rampup_batch_size:
        raise ConfigError(
            "--rampup-batch-size is not supported by OrchWeave: the loader, the balance plans "
            "and the plan made one iteration ahead assume one global batch size for the whole "
            "run (--global-batch-size)"
        )
    if args.num_experts:
        raise ConfigError(
            f"--num-experts {args.num_experts} is not supported by OrchWeave yet: the LLM's "
            "layers are dense (mixture-of-experts layers are not built)"
        )
    if args.decoupled_lr is not None or args.decoupled_min_lr is not None:
        flag = "--decoupled-lr" if args.decoupled_lr is not None else "--decoupled-min-lr"
        raise ConfigError(
            f"{flag} is not supported by OrchWeave: the optimizer gives every parameter "
            "--lr's schedule (the embedding and output layer get no learning rate of their own)"
        )


def _check_optimizer_instances(args: argparse.Namespace) -> None:
    """``--num-distributed-optimizer-instances``: copies of the distributed optimizer's shards,
    each over ``DP / N`` consecutive data-parallel ranks; megatron-core asserts the division
    deep in its process groups, and without the distributed optimizer its DDP would reduce
    the gradients within an instance only."""
    n = args.num_distributed_optimizer_instances
    if n == 1:
        return
    if n < 1:
        raise ConfigError(f"--num-distributed-optimizer-instances must be >= 1, got {n}")
    if not args.use_distributed_optimizer:
        raise ConfigError(
            f"--num-distributed-optimizer-instances {n} copies the distributed optimizer's "
            "shards: add --use-distributed-optimizer"
        )
    dp = args.data_parallel_size  # Megatron's, derived by its argument validation
    if dp % n:
        raise ConfigError(
            f"--num-distributed-optimizer-instances {n} must divide the data-parallel size {dp}"
        )

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The checks of the pipeline runtime's flags (``--pipeline-schedule``, ``--pipeline-layout``,
the chunk and sub-microbatch flags, the schedule search's), each a ValueError whose message
names the flag; ``megatron.mllm.arguments`` turns it into the trainer's one ``error:`` line."""

from __future__ import annotations

import argparse

from megatron.mllm.run_config import AUTO, PipelineConfig
from orchestration.measured_guard import check_interval
from orchestration.workload import PHASES
from pipeweaver.search.search_pool import check_workers


def check_pipeline(args: argparse.Namespace) -> None:
    """Check the pipeline runtime's flags of ``args``.

    Raises:
        ValueError: naming the flag at fault and its value.
    """
    for name in PHASES:
        k = getattr(args, f"{name}_chunks_per_stage")
        if k != AUTO and k < 1:
            raise ValueError(f"--{name}-chunks-per-stage must be >= 1 or auto")
    if args.encoder_sub_microbatch_tokens < 0:
        raise ValueError("--encoder-sub-microbatch-tokens must be >= 0")
    if args.schedule_search_budget_ms is not None and args.schedule_search_budget_ms < 0:
        raise ValueError("--schedule-search-budget-ms must be >= 0 (0: the greedy order)")
    if args.schedule_search_rollouts < 1:
        raise ValueError("--schedule-search-rollouts must be >= 1")
    check_interval(args.schedule_search_guard_interval, "--schedule-search-guard-interval")
    check_workers(args.schedule_search_workers, name="--schedule-search-workers")
    alt = args.schedule_search_alternate
    if alt < 0:
        raise ValueError(f"--schedule-search-alternate must be >= 0 (0: off), got {alt}")
    if alt and (args.pipeline_schedule != "dynamic" or not args.schedule_search_budget_ms):
        raise ValueError(
            f"--schedule-search-alternate {alt} alternates the searched schedule with greedy's: "
            "it needs --pipeline-schedule dynamic and --schedule-search-budget-ms > 0 (got "
            f"--pipeline-schedule {args.pipeline_schedule}, --schedule-search-budget-ms "
            f"{args.schedule_search_budget_ms})"
        )
    if args.pipeline_memory_limit_gb is not None:
        if not args.pipeline_memory_limit_gb > 0:
            raise ValueError(
                f"--pipeline-memory-limit-gb must be > 0, got {args.pipeline_memory_limit_gb}"
            )
        if args.pipeline_schedule != "dynamic" or args.schedule_search_budget_ms == 0:
            raise ValueError(
                "--pipeline-memory-limit-gb applies to the searched dynamic pipeline "
                "(--pipeline-schedule dynamic with --schedule-search-budget-ms > 0)"
            )
    size = args.encoder_sub_microbatch_size
    if size != AUTO and size < 0:
        raise ValueError("--encoder-sub-microbatch-size must be >= 0 or auto")
    if size and args.encoder_sub_microbatch_tokens:
        raise ValueError(
            "--encoder-sub-microbatch-size and --encoder-sub-microbatch-tokens both cut the "
            "encoders' sub-microbatches: give one of them"
        )
    schedule = args.pipeline_schedule
    chunks = PipelineConfig(
        **{f"{m}_chunks_per_stage": getattr(args, f"{m}_chunks_per_stage") for m in PHASES},
        encoder_sub_microbatch_size=size,
        pipeline_schedule=schedule,
        pipeline_layout=args.pipeline_layout,
    )
    auto = chunks.auto_flags
    if auto and schedule != "dynamic":
        raise ValueError(
            f"{auto[0]} auto needs --pipeline-schedule dynamic (the partitioner cuts every "
            f"module over all stages), got --pipeline-schedule {schedule}"
        )
    _check_layout(args, chunks)
    if schedule == "megatron":
        if args.pipeline_recompute != "none":
            raise ValueError(
                "--pipeline-recompute applies to OrchWeave's runtime; with --pipeline-schedule "
                "megatron use Megatron's --recompute-granularity"
            )
        return
    pp = args.pipeline_model_parallel_size
    if chunks.layout in ("balanced", "balanced-cost"):
        # Every layer, encoders first, in P x K consecutive stages (K the LLM's, 1 for 1f1b).
        k = 1 if schedule == "1f1b" else int(args.llm_chunks_per_stage)
        total = args.num_layers + sum(
            getattr(args, f"{m}_num_layers") for m in PHASES if m != "llm"
        )
        if total < pp * k:
            raise ValueError(
                f"--pipeline-layout {chunks.layout} cuts all {total} layers into "
                f"--pipeline-model-parallel-size {pp} x --llm-chunks-per-stage {k} stages: "
                "too few layers"
            )
        return
    per_module = schedule == "dynamic" and chunks.layout == "interleaved"
    for name, k in chunks.chunks_per_stage().items():
        # dynamic's interleaved layout cuts every module; baseline cuts the LLM only (K = 1
        # for 1f1b).
        if not per_module and name != "llm":
            continue
        k = 1 if schedule == "1f1b" or k == AUTO else k
        layers = args.num_layers if name == "llm" else getattr(args, f"{name}_num_layers")
        if layers and layers < pp * k:
            flag = f"--{name}-chunks-per-stage {k}"
            if getattr(args, f"{name}_chunks_per_stage") == AUTO:
                flag = f"--{name}-chunks-per-stage auto (at least 1)"
            raise ValueError(
                f"--pipeline-schedule {schedule} cuts the {name} module into "
                f"--pipeline-model-parallel-size {pp} x {flag} chunks, "
                f"but it has only {layers} layers"
            )


def _check_layout(args: argparse.Namespace, chunks: PipelineConfig) -> None:
    """``--pipeline-layout`` against the schedule and the chunk flags."""
    schedule, layout = args.pipeline_schedule, chunks.layout
    if schedule == "megatron" and layout != "baseline":
        raise ValueError(
            f"--pipeline-layout {layout} needs one of OrchWeave's runtime schedules "
            "(--pipeline-schedule 1f1b, interleaved or dynamic): megatron-core's engine passes "
            "one LLM activation between stages, so the encoders stay on stage 0"
        )
    if layout == "interleaved" and schedule != "dynamic":
        raise ValueError(
            f"--pipeline-layout interleaved cuts every module over all stages, which only "
            f"--pipeline-schedule dynamic runs (got --pipeline-schedule {schedule})"
        )
    if schedule != "dynamic" or layout == "interleaved":
        return
    if chunks.auto_flags:
        raise ValueError(
            f"{chunks.auto_flags[0]} auto (DIP's partitioner) cuts every module into chunks of "
            f"its own: it needs --pipeline-layout interleaved (dynamic's default), got "
            f"--pipeline-layout {layout}"
        )
    cut = [m for m in PHASES if m != "llm" and getattr(args, f"{m}_chunks_per_stage") != 1]
    if cut:
        k = getattr(args, f"{cut[0]}_chunks_per_stage")
        raise ValueError(
            f"--{cut[0]}-chunks-per-stage {k} cuts the {cut[0]} encoder into chunks of its own, "
            f"which only --pipeline-layout interleaved does (got --pipeline-layout {layout})"
        )

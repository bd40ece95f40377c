# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The run's partition: DIP's partitioner (:mod:`pipeweaver.search.partition`) for the flags
``--*-chunks-per-stage auto`` and ``--encoder-sub-microbatch-size auto``.

Every rank computes the same plan from the same inputs (the flags, ``--cost-calibration`` or
the model's FLOPs, and the workload's first iterations in Megatron's sampler order), so the
runtime's placement, the sub-microbatch cuts and SEMU's predicted step agree without any
communication.
"""

from __future__ import annotations

import os

from megatron.mllm.arguments import ConfigError
from megatron.mllm.config import MLLMConfig
from megatron.mllm.model import module_layers
from megatron.mllm.run_config import AUTO, RunConfig
from orchestration.calibration import Calibration
from orchestration.packing import microbatch_indices
from orchestration.workload_spec import SampleStream
from pipeweaver.ir import ScheduleError
from pipeweaver.search.partition import (
    CalibratedCosts,
    FlopCosts,
    PartitionPlan,
    plan_partition,
    workload_shape,
)

SUMMARY_ITERATIONS = 8
"""Iterations of the workload the partitioner summarises (fewer when the run is shorter)."""


def partition_plan(run: RunConfig, mllm: MLLMConfig) -> PartitionPlan | None:
    """The partitioner's plan when a flag asks for it (and the runtime runs), else None.

    Raises:
        ConfigError: the model cannot be cut as the flags ask.
    """
    p = run.pipeline
    if not p.auto_flags or not run.uses_runtime:
        return None
    layers = module_layers(mllm)
    present = [m for m, n in layers.items() if n > 0]
    costs, source = FlopCosts(mllm.shape()), "from the model's FLOPs"
    if run.balance.cost_calibration:
        calibrated = CalibratedCosts(Calibration.load(run.balance.cost_calibration))
        name = os.path.basename(run.balance.cost_calibration)
        if calibrated.covers(present):
            costs, source = calibrated, f"measured ({name})"
        else:
            source += f" ({name} does not cover every module)"
    w = run.workload
    stream = SampleStream(w.workload, w.workload_seed, w.workload_token_scale)
    dp, m = run.parallel.data, run.num_microbatches
    iterations = max(1, min(SUMMARY_ITERATIONS, run.training.train_iters or SUMMARY_ITERATIONS))
    microbatches = [
        [stream.meta(k) for k in mb]
        for it in range(iterations)
        for d in range(dp)
        for mb in microbatch_indices(it, d, dp, run.micro_batch_size, m)
    ]
    shape = workload_shape(microbatches, list(mllm.encoders))
    source += f", workload {w.workload}: {len(microbatches)} microbatches"
    chunks = {name: None if k == AUTO else int(k) for name, k in p.chunks_per_stage().items()}
    size = p.encoder_sub_microbatch_size
    subs = {}
    for enc in mllm.encoders:
        if size == AUTO:
            subs[enc] = None
        elif size:
            subs[enc] = int(size)
        else:
            # No unit count: the encoder runs what the token cap (or a whole microbatch) holds.
            load = shape.encoders.get(enc)
            units = load.typical_units if load is not None else 1
            if p.encoder_sub_microbatch_tokens and load is not None:
                units = max(1, min(units, p.encoder_sub_microbatch_tokens // load.unit_tokens))
            subs[enc] = units
    try:
        return plan_partition(
            layers,
            run.parallel.pipeline,
            costs,
            shape,
            chunks_per_stage=chunks,
            sub_microbatch_units=subs,
            split_by_cost=any(k is None for k in chunks.values()),
            source=source,
        )
    except ScheduleError as e:
        raise ConfigError(f"{p.auto_flags[0]} auto: {e}") from None


def sub_microbatch_units(run: RunConfig, plan: PartitionPlan | None) -> dict[str, int] | None:
    """B_i per encoder for the online cut (``--encoder-sub-microbatch-size``), or None when
    the encoders' subs are cut by tokens (or not at all)."""
    size = run.pipeline.encoder_sub_microbatch_size
    if size == AUTO:
        return dict(plan.sub_microbatch_units) if plan is not None else None
    if size:
        return {enc: int(size) for enc in run.encoders}
    return None

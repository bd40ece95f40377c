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
from typing import TYPE_CHECKING

from megatron.mllm.arguments import ConfigError
from megatron.mllm.run_config import AUTO, RunConfig
from orchestration.calibration import Calibration
from orchestration.workload_spec import SampleStream
from pipeweaver.ir import ScheduleError
from pipeweaver.search.partition import (
    CalibratedCosts,
    FlopCosts,
    PartitionPlan,
    iteration_layer_costs,
    plan_partition,
    workload_shape,
)

if TYPE_CHECKING:  # the model's config imports torch; the plan needs only its sizes
    from megatron.mllm.config import MLLMConfig

SUMMARY_ITERATIONS = 8
"""Iterations of the workload (global batches from the first) the partitioner summarises..."""

SUMMARY_SAMPLES = 4096
"""... but no more samples than this (reading metadata costs ~0.1 ms a sample)."""


def partition_plan(
    run: RunConfig, mllm: "MLLMConfig", calibration: Calibration | str | None = None
) -> PartitionPlan | None:
    """The partitioner's plan when a flag asks for it (and the runtime runs), else None.

    Args:
        run: the run's flags.
        mllm: its model.
        calibration: the measured costs (or their file); default ``--cost-calibration``'s,
            else the model's FLOPs.

    Raises:
        ConfigError: the model cannot be cut as the flags ask.
    """
    p = run.pipeline
    if not p.auto_flags or not run.uses_runtime:
        return None
    layers = {m: mllm.num_layers(m) for m in (*mllm.encoders, "llm")}
    costs, source, microbatches = _costs_and_workload(run, mllm, layers, calibration)
    shape = workload_shape(microbatches, list(mllm.encoders))
    chunks = {name: None if k == AUTO else int(k) for name, k in p.chunks_per_stage().items()}
    size = p.encoder_sub_microbatch_size
    given = "--encoder-sub-microbatch-size" if size else "a typical microbatch's units"
    if not size and p.encoder_sub_microbatch_tokens:
        given = "the units --encoder-sub-microbatch-tokens holds"
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
            given_sub=f"given ({given}; T_i is measured there)",
            source=source,
        )
    except ScheduleError as e:
        raise ConfigError(f"{p.auto_flags[0]} auto: {e}") from None


def layer_costs(
    run: RunConfig, mllm: "MLLMConfig", calibration: Calibration | str | None = None
) -> tuple[dict[str, list[float]], str]:
    """Each layer's cost over the workload's first iterations, for ``--pipeline-layout
    balanced-cost`` (:func:`pipeweaver.search.partition.iteration_layer_costs`), and where
    the costs came from (for the start-up line).

    Args: those of :func:`partition_plan`.
    """
    layers = {m: mllm.num_layers(m) for m in (*mllm.encoders, "llm")}
    costs, source, microbatches = _costs_and_workload(run, mllm, layers, calibration)
    weights = iteration_layer_costs(costs, layers, microbatches)
    return weights, f"{costs.unit} {source}"


def _costs_and_workload(run: RunConfig, mllm: "MLLMConfig", layers: dict[str, int],
                        calibration: Calibration | str | None) -> tuple:  # fmt: skip
    """The per-layer costs (measured when a calibration covers every module, else FLOPs), what
    they are, and the workload's first iterations as microbatches in Megatron's sampler order.
    """
    present = [m for m, n in layers.items() if n > 0]
    costs, source = FlopCosts(mllm.shape()), "from the model's FLOPs"
    calibration = calibration or run.balance.cost_calibration
    if calibration:
        name = "given"
        if not isinstance(calibration, Calibration):
            name = os.path.basename(calibration)
            calibration = Calibration.load(calibration)
        calibrated = CalibratedCosts(calibration)
        if calibrated.covers(present):
            costs, source = calibrated, f"measured ({name})"
        else:
            source += f" ({name} does not cover every module)"
    w = run.workload
    stream = SampleStream(w.workload, w.workload_seed, w.workload_token_scale)
    # Megatron's sampler gives every microbatch an aligned run of micro-batch-size samples
    # (microbatch_indices), whatever the DP size: the plan of a resumed run with another DP
    # size or more iterations is the same.
    mbs = run.micro_batch_size
    microbatches = [
        [stream.meta(k) for k in range(i * mbs, (i + 1) * mbs)]
        for i in range(
            max(1, min(SUMMARY_ITERATIONS * run.global_batch_size, SUMMARY_SAMPLES) // mbs)
        )
    ]
    source += f", workload {w.workload}: {len(microbatches)} microbatches"
    return costs, source, microbatches


def sub_microbatch_units(run: RunConfig, plan: PartitionPlan | None) -> dict[str, int] | None:
    """B_i per encoder for the online cut (``--encoder-sub-microbatch-size``), or None when
    the encoders' subs are cut by tokens (or not at all)."""
    size = run.pipeline.encoder_sub_microbatch_size
    if size == AUTO:
        return dict(plan.sub_microbatch_units) if plan is not None else None
    if size:
        return {enc: int(size) for enc in run.encoders}
    return None

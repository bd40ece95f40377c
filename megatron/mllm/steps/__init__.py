# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The training modes, each a ``forward_backward_func`` with megatron-core 0.19's contract.

Chosen once at start-up from the run config (:func:`build_stage_model`, :func:`build_step`):

========================  ================================================================
mode                      step
========================  ================================================================
upstream Megatron         megatron-core's ``get_forward_backward_func()`` over packed
                          microbatches (padded to a fixed shape with PP > 1)
pipeline runtime          OrchWeave's :class:`~pipeweaver.runtime.executor.PipelineRuntime`
                          (``--pipeline-schedule 1f1b|interleaved|dynamic`` with PP > 1)
per-phase balancing       :class:`~megatron.mllm.steps.phase_balanced.PhaseBalancedStep`
                          (``--post-balance`` with PP = 1)
whole-sample balancing    :class:`~megatron.mllm.steps.sample_balanced.SampleBalancedStep`
                          ahead of either pipeline engine (``--post-balance`` with PP > 1)
========================  ================================================================

The trainer calls whichever was chosen, the same way, and never asks which one it is.
"""

from __future__ import annotations

import torch

from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.mllm.batch import ChatTurns, build_microbatch
from megatron.mllm.config import MLLMConfig
from megatron.mllm.layout_choice import run_layout
from megatron.mllm.model import PipelineStageModel, PlacedModel
from megatron.mllm.partitioning import sub_microbatch_units
from megatron.mllm.pipeline import (
    RuntimeModel,
    build_pipeline_microbatch,
    runtime_placement,
    schedule_function,
)
from megatron.mllm.steps.base import BalanceStats, PackedStep, TrainingStep
from megatron.mllm.steps.phase_balanced import PhaseBalancedStep
from megatron.mllm.steps.sample_balanced import SampleBalancedStep
from megatron.mllm.steps.schedule_ahead import SearchedSchedules, search_budget_ms, trainer_search
from megatron.mllm.timers import NULL_TIMERS, StepTimers
from orchestration.calibration import Calibration
from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.measured_guard import AlternatingArms, MeasuredGuard
from pipeweaver.ir import Memory
from pipeweaver.runtime.executor import PipelineRuntime
from pipeweaver.runtime.p2p import PipelineP2P
from pipeweaver.search.batch_search import SearchInWorker
from pipeweaver.search.partition import PartitionPlan
from pipeweaver.semu.batches import pack_microbatch
from pipeweaver.semu.model import receives_at_step_start

__all__ = ["BalanceStats", "PackedStep", "TrainingStep", "build_stage_model", "build_step"]


def build_stage_model(
    run, mllm: MLLMConfig, pp_rank: int, pg_collection, partition: PartitionPlan | None = None
) -> PlacedModel:
    """This rank's share of the model: the baseline placement, or the runtime's (the
    partitioner's layout when ``partition``, :func:`megatron.mllm.partitioning.partition_plan`,
    is given; the engine then cuts the encoders' subs by its B_i)."""
    if not run.uses_runtime:
        return PipelineStageModel(mllm, pp_rank, run.parallel.pipeline, pg_collection)
    layout = run_layout(run, mllm)
    placement = runtime_placement(
        run.pipeline.pipeline_schedule,
        run.parallel.pipeline,
        mllm,
        run.pipeline.chunks_per_stage(),
        partition,
        layout=layout.layout,
        layer_costs=layout.layer_costs if layout.layout == "balanced-cost" else None,
    )
    model = RuntimeModel(mllm, placement, pp_rank, pg_collection)
    model.partition = partition
    model.run_layout = layout
    return model


def build_step(run, mllm: MLLMConfig, model: PlacedModel, pg_collection, dispatcher: Dispatcher,
               device: torch.device, timers: StepTimers = NULL_TIMERS,
               calibration: Calibration | None = None,
               chat_turns: ChatTurns | None = None) -> TrainingStep:  # fmt: skip
    """The run's training step, for the (unwrapped) stage model built by
    :func:`build_stage_model`; it reports its time to ``timers``. ``calibration`` is
    ``--cost-calibration`` as the trainer fitted it to this host (the balancer's costs and the
    schedule search's SEMU both use it). ``chat_turns`` (``--prompt-format chat``, the
    stream's) masks the loss to the assistant's replies wherever a microbatch is packed."""
    step = _balanced(run, mllm, model, pg_collection, dispatcher, device, calibration, chat_turns)
    step.timers = timers
    if isinstance(step, SampleBalancedStep):
        step.engine.timers = timers
    if isinstance(step, PhaseBalancedStep) and step.fallback is not None:
        step.fallback.timers = timers
    return step


def _balanced(run, mllm, model: PlacedModel, pg_collection, dispatcher, device,
              calibration, chat_turns) -> TrainingStep:  # fmt: skip
    """The engine alone, or the balancing step for the layout."""
    engine = _engine(run, mllm, model, pg_collection, device, calibration, chat_turns)
    if run.balance.post_balance == "none":
        return engine
    cost_model = CostModel.build(mllm.shape(), calibration)
    if run.parallel.pipeline == 1:
        return PhaseBalancedStep(
            run, mllm, dispatcher, cost_model, pg_collection, device, chat_turns, fallback=engine
        )
    return SampleBalancedStep(
        engine,
        run,
        mllm,
        dispatcher,
        cost_model,
        pg_collection.pp,
        model.holds_encoder_inputs,
        device,
        tp_group=pg_collection.tp,
    )


def _engine(run, mllm, model: PlacedModel, pg_collection, device, calibration,
            chat_turns) -> PackedStep:  # fmt: skip
    """The pipeline engine: megatron-core's schedules, or OrchWeave's runtime."""
    with_features = model.holds_encoder_inputs
    encoders = list(mllm.encoders)
    if not run.uses_runtime:
        # megatron-core's pipeline communicates one fixed activation shape.
        pad_to = run.packing_limit if run.parallel.pipeline > 1 else None
        engine = get_forward_backward_func(pp_size=run.parallel.pipeline, vp_size=None)

        def pack(samples):
            return build_microbatch(samples, encoders, pad_to=pad_to, device=device,
                                    with_features=with_features, max_pad_run=run.seq_length,
                                    chat_turns=chat_turns)  # fmt: skip

        return PackedStep(engine, pack, engine.__name__, padded_length=pad_to,
                          pack_limit=_pack_limit(run))  # fmt: skip
    config = mllm.language
    name = run.pipeline.pipeline_schedule
    memory = Memory.RECOMPUTE if run.pipeline.pipeline_recompute == "all" else Memory.NONE
    sub_tokens = run.pipeline.encoder_sub_microbatch_tokens or None
    sub_units = sub_microbatch_units(run, getattr(model, "partition", None))
    schedule_fn = schedule_function(name, mllm.shape(), memory)
    searched, why = None, ""
    if name == "dynamic":
        budget, why = search_budget_ms(run)
        if budget > 0:
            searched = _searched_schedules(
                run, mllm, pg_collection, device, sub_tokens, sub_units, budget, calibration
            )
            schedule_fn = searched
    gloo = torch.distributed.get_backend(pg_collection.pp) == "gloo"
    runtime = PipelineRuntime(
        model.placement,
        model.chunk_module,
        PipelineP2P(pg_collection.pp, run.distributed_timeout),
        schedule_fn,
        device,
        config.pipeline_dtype or config.params_dtype,
        receives_at_step_start=receives_at_step_start(
            run.pipeline.pipeline_receive_posting or "", gloo
        ),
    )
    chunks = ", ".join(
        f"{m} {model.placement.num_chunks(m)} chunks" for m in model.placement.modules
    )

    def pack(samples):
        return build_pipeline_microbatch(
            samples, mllm, device, with_features, sub_tokens, sub_units, chat_turns
        )

    layout = model.run_layout.layout if model.run_layout is not None else run.pipeline.layout
    posted = "the step's start" if runtime.receives_at_step_start else "each send"
    schedule = f"{name} (OrchWeave runtime, layout {layout}: {chunks}; receives posted at {posted})"
    if searched is not None:
        schedule += (
            f", searched: {run.pipeline.schedule_search_rollouts} rollouts within "
            f"{searched.search.budget_ms:g} ms per batch"
            + (f", {searched.search.workers} search workers" if searched.search.workers > 1 else "")
            + (", one batch ahead" if searched.ahead_requested else ", in the step")
            + f" ({why})"
        )
        if isinstance(searched.guard, AlternatingArms):
            schedule += (
                f", alternating with greedy's order in blocks of {searched.guard.block} "
                "(--schedule-search-alternate)"
            )
        elif searched.guard is not None:
            schedule += (
                f", its measured gain probed every {searched.guard.interval} iterations "
                f"from iteration {searched.guard.next_probe + 1}"
            )
    elif name == "dynamic":
        schedule += f", greedy order ({why})"
    return PackedStep(runtime.forward_backward, pack, schedule, runtime=runtime,
                      schedules=searched, pack_limit=_pack_limit(run))  # fmt: skip


def _pack_limit(run) -> int | None:
    """The tokens of one packed sequence with ``--pack-sequences``, else None."""
    return run.packing_limit if run.workload.pack_sequences else None


def _search_guard(pipeline) -> MeasuredGuard | AlternatingArms | None:
    """What holds the search against the clock: the guard's probes, or, for side-by-side
    measurement, the searched and greedy orders in alternate blocks for the whole run
    (``--schedule-search-alternate``); None: the search runs on every batch."""
    if pipeline.schedule_search_alternate:
        first = pipeline.schedule_search_alternate_first == "searched"
        return AlternatingArms(pipeline.schedule_search_alternate, first_on=first)
    interval = pipeline.schedule_search_guard_interval
    return MeasuredGuard(interval) if interval else None


def _searched_schedules(run, mllm, pg_collection, device, sub_tokens, sub_units, budget_ms,
                        calibration):  # fmt: skip
    """The dynamic pipeline's searched schedules: planned by each pipeline's first stage,
    broadcast to the others (``megatron.mllm.steps.schedule_ahead``)."""
    search = trainer_search(run, mllm, torch.distributed.get_world_size(), calibration, budget_ms)
    # The search runs in a process of its own (started by the first search, on the stage that
    # plans): a thread would share the step's interpreter lock.
    in_worker = SearchInWorker(search, f"rank {torch.distributed.get_rank()}",
                               run.distributed_timeout.total_seconds())  # fmt: skip
    encoders = list(mllm.encoders)

    def to_semu(samples):
        return [
            pack_microbatch(list(mb), encoders, None, run.seq_length, sub_tokens,
                            sub_units=sub_units)
            for mb in samples
        ]  # fmt: skip

    schedules = SearchedSchedules(
        in_worker, search.fallback, pg_collection.pp, device, run.balance.plan_ahead,
        run.distributed_timeout.total_seconds(), to_semu,
        guard=_search_guard(run.pipeline), greedy_outcome=search.greedy_outcome,
        # Greedy alone is the same on every stage; under a memory limit the fallback also runs
        # the ILP, whose time limit could make stages disagree: the planner sends it instead.
        local_greedy=search.unlimited,
    )  # fmt: skip
    if run.pipeline.pipeline_memory_limit_gb is not None:
        schedules.limit_note = (
            f" (--pipeline-memory-limit-gb {run.pipeline.pipeline_memory_limit_gb:g})"
        )
    return schedules

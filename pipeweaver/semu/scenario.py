# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU's scenarios: the step a model config would run on a cluster, ready to simulate.

:func:`build_step` draws the samples of one iteration from the workload with the config's seed,
in Megatron's sampler order, packs each DP replica's microbatches as the trainer does (padded to
micro batch x sequence length when PP > 1, as the baseline trainer pads), places the chunks and
generates each replica's schedule. ``tools/semu.py`` is its command line.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from orchestration.model_shape import ModelShape
from orchestration.packing import microbatch_indices
from orchestration.workload import SampleMeta, missing_encoder_error
from orchestration.workload_spec import SampleStream
from pipeweaver.checker import check
from pipeweaver.generators import generate
from pipeweaver.interleave import flops_durations, greedy_dual_queue
from pipeweaver.ir import Memory, ScheduleError
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule
from pipeweaver.search.partition import PartitionPlan
from pipeweaver.semu.batches import MicrobatchMeta, pack_microbatch, step_microbatches, structure_of
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.model import ModelSpec
from pipeweaver.semu.reuse import collector_paused
from pipeweaver.semu.work import ModelCosts

SCHEDULES: tuple[str, ...] = ("megatron", "1f1b", "interleaved", "none", "dataflow", "dynamic")
"""Schedule names :func:`build_step` accepts: ``megatron`` is the upstream baseline (``none``
for PP = 1, ``1f1b``, or ``interleaved`` with virtual stages); ``dynamic`` is the trainer's
``--pipeline-schedule dynamic`` (greedy dual-queue interleaving); the others are
:data:`pipeweaver.generators.GENERATORS`."""

PLACEMENTS: tuple[str, ...] = ("baseline", "balanced", "balanced-cost", "interleaved")
"""Placement policies: :meth:`Placement.baseline` (upstream Megatron's encoders on stage 0),
``balanced`` (:meth:`Placement.balanced_stages`, DIP's Megatron baseline: every module's layers,
encoders first, in P x K stages of balanced parameters, K the config's virtual stages),
``balanced-cost`` (the same stages balanced by each layer's cost, ``layer_costs``) and
:meth:`Placement.interleaved`."""


def shape_layer_params(shape: ModelShape) -> dict[str, list[float]]:
    """Per module present, the parameters of each layer (the input layer counted in layer 0,
    the head in the last), for :meth:`Placement.balanced_stages`: the trainer's
    ``--pipeline-layout balanced`` and SEMU's ``balanced`` placement both cut by these."""
    out = {}
    for module in (*shape.encoders, "llm"):
        s = shape.module(module)
        params = [float(s.layer_params())] * s.num_layers
        if params:
            params[0] += s.input_flops_per_token / 2 + s.embedding_params
            params[-1] += s.output_flops_per_token / 2
            out[module] = params
    return out


SampleSource = Callable[[int], SampleMeta]
"""Stream index -> the sample's metadata (the trainer's error for a sample it cannot read)."""

Packer = Callable[[list[SampleMeta]], MicrobatchMeta]
"""A microbatch's samples -> its shapes, packed as the step's engine packs them."""


def sample_source(
    spec: ModelSpec,
    workload: str | None = None,
    seed: int | None = None,
    token_scale: float | None = None,
) -> SampleSource:
    """The run's sample stream (defaults: the config's workload, seed and token scale); a
    sample with items for an encoder the model lacks raises the trainer's ``WorkloadError``."""
    stream = SampleStream(
        workload or spec.training.workload,
        spec.training.workload_seed if seed is None else seed,
        spec.training.workload_token_scale if token_scale is None else token_scale,
    )
    encoders = list(spec.shape.encoders)

    def sample_of(k: int) -> SampleMeta:
        # The trainer stops on a sample its model cannot read: so does the step it predicts.
        meta = stream.meta(k)
        modality = meta.unencoded(encoders)
        if modality is not None:
            raise missing_encoder_error(f"sample {meta.sample_id!r} (stream index {k})", modality)
        return meta

    return sample_of


def layer_params(spec: ModelSpec) -> dict[str, list[float]]:
    """:func:`shape_layer_params` of a model spec (whole layers: TP divides every layer alike,
    so the cut is the same on every TP rank)."""
    return shape_layer_params(spec.shape)


def placement_kind(schedule: str, placement: str | None = None) -> str:
    """The placement policy of a step: ``placement`` when given, else ``interleaved`` for the
    ``dataflow`` and ``dynamic`` schedules (they run on any placement) and ``baseline`` for
    Megatron's."""
    return placement or ("interleaved" if schedule in ("dataflow", "dynamic") else "baseline")


@collector_paused()
def build_step(
    spec: ModelSpec,
    cluster: ClusterSpec,
    *,
    schedule: str = "megatron",
    placement: str | None = None,
    chunks_per_rank: Mapping[str, int] | None = None,
    memory: Memory | str | None = None,
    pad: bool = True,
    workload: str | None = None,
    seed: int | None = None,
    token_scale: float | None = None,
    iteration: int = 0,
    replicas: int | None = None,
    encoder_sub_microbatch_tokens: int | None = None,
    encoder_sub_microbatch_units: Mapping[str, int] | None = None,
    partition: PartitionPlan | None = None,
    run_checker: bool = True,
    balance: Callable[[SampleSource, Packer], list[list[MicrobatchMeta]]] | None = None,
    check_samples: Callable[[Sequence[Sequence[tuple[int, SampleMeta]]]], None] | None = None,
    layer_costs: Mapping[str, Sequence[float]] | None = None,
) -> tuple[list[Schedule], list[list[MicrobatchMeta]], dict[str, Any]]:
    """The schedules and microbatches of one step, per DP replica.

    Args:
        spec: the model and its parallel layout.
        cluster: the devices (DP follows from their number).
        schedule: one of :data:`SCHEDULES`.
        placement: one of :data:`PLACEMENTS`; default the config's ``--pipeline-layout`` for
            the trainer's runtime schedules, else :func:`placement_kind`'s.
        chunks_per_rank: interleaved placement: chunks per rank of each module (default 1; the
            LLM's defaults to the config's virtual stages). The baseline and balanced
            placements take the config's virtual stages instead.
        memory: memory strategy of every compute; default the config's.
        pad: pad the microbatches when PP > 1, as the baseline trainer does (the runtime's
            schedules do not pad).
        workload: workload spec or JSONL file; default the config's.
        seed: workload seed; default the config's.
        token_scale: workload token scale; default the config's.
        iteration: which step of the sample stream.
        replicas: simulate only this many DP replicas (clamped to 1..DP); default all.
        encoder_sub_microbatch_tokens: encoder tokens per sub-microbatch, as the trainer's flag;
            default the config's, else one sub per encoder and microbatch.
        encoder_sub_microbatch_units: per encoder, B_i units per sub-microbatch (the trainer's
            ``--encoder-sub-microbatch-size``): N units cut into ceil(N / B_i) near-equal subs.
        partition: the partitioner's plan (:func:`pipeweaver.search.partition.plan_partition`,
            the trainer's ``auto`` flags): the interleaved placement takes its layer splits
            (``chunks_per_rank`` is then ignored), and without ``encoder_sub_microbatch_units``
            the encoders' subs take its B_i.
        run_checker: validate every schedule with :func:`pipeweaver.checker.check`.
        balance: post-balancing (:mod:`pipeweaver.semu.post_balance`): ``(sample_of, pack)
            -> [replica][microbatch]`` replaces Megatron's microbatches (``pack`` packs a
            microbatch's samples with the step's flags); every replica is then simulated.
        check_samples: called with every DP rank's ``(stream index, sample)`` pairs of the
            iteration (all replicas, in loading order) before they are packed: the trainer's
            checks of a batch (``tools/semu.py`` passes its ``--seq-length`` check), raising
            what the trainer would.

    Returns:
        ``(schedules, microbatches, info)``: one schedule and one microbatch list per simulated
        replica, and what was built (model, cluster, schedule, placement, tp, pp, dp,
        num_microbatches, workload, iteration, replicas_simulated).

    Raises:
        ModelConfigError: the config does not fit the cluster or its batch sizes.
        WorkloadError: the workload cannot be read, or has items for an encoder the model
            lacks.
        ScheduleError: the placement or the schedule does not fit the model.
    """
    dp = spec.parallel.data(cluster.num_devices)
    pp = spec.parallel.pipeline
    m = spec.training.num_microbatches(dp)
    workload = workload or spec.training.workload
    sample_of = sample_source(spec, workload, seed, token_scale)
    encoders = list(spec.shape.encoders)

    seq = spec.training.seq_length
    if check_samples is not None:
        # The trainer checks the whole global batch, whatever the replicas simulated; the
        # samples drawn here are kept so that packing does not draw them again.
        drawn: dict[int, SampleMeta] = {}
        rank_samples = []
        for d in range(dp):
            ks = microbatch_indices(iteration, d, dp, spec.training.micro_batch_size, m)
            rank_samples.append([(k, drawn.setdefault(k, sample_of(k))) for mb in ks for k in mb])
        check_samples(rank_samples)
        sample_of = drawn.__getitem__
    replicas = dp if replicas is None else max(1, min(replicas, dp))
    sub_tokens = encoder_sub_microbatch_tokens
    if sub_tokens is None:
        sub_tokens = spec.training.encoder_sub_microbatch_tokens
    sub_units = encoder_sub_microbatch_units
    if sub_units is None and partition is not None:
        sub_units = dict(partition.sub_microbatch_units)
    shape = spec.shape
    pad_to = seq * spec.training.micro_batch_size if pad and pp > 1 else None

    def flops_of(s: SampleMeta) -> float:
        return sum(shape.sample_phase_flops(s).values())

    if balance is None:
        mbs_all = step_microbatches(
            sample_of,
            iteration,
            dp,
            spec.training.micro_batch_size,
            m,
            encoders,
            pad_to=pad_to,
            max_pad_run=seq,
            sub_tokens=sub_tokens,
            flops_of=flops_of,
            sub_units=sub_units,
        )[:replicas]
    else:  # post-balanced replicas differ: every one is simulated
        replicas = dp
        mbs_all = balance(
            sample_of,
            lambda samples: pack_microbatch(
                samples, encoders, pad_to, seq, sub_tokens, flops_of, sub_units
            ),
        )
    name = schedule
    if name == "megatron":
        name = (
            "none"
            if pp == 1
            else ("interleaved" if spec.parallel.llm_chunks_per_rank > 1 else "1f1b")
        )
    if placement is None and name in ("1f1b", "interleaved", "dynamic"):
        placement = spec.parallel.pipeline_layout or None  # the trainer's --pipeline-layout
    kind = placement_kind(name, placement)
    if kind not in PLACEMENTS:
        raise ScheduleError(f"placement {kind!r}: expected one of {PLACEMENTS}")
    if kind == "baseline":
        layout = Placement.baseline(pp, spec.layers(), spec.parallel.llm_chunks_per_rank)
    elif kind == "balanced":
        layout = Placement.balanced_stages(
            pp, layer_params(spec), spec.parallel.llm_chunks_per_rank
        )
    elif kind == "balanced-cost":
        if layer_costs is None:
            raise ScheduleError("the balanced-cost placement needs each layer's cost")
        layout = Placement.balanced_stages(pp, layer_costs, spec.parallel.llm_chunks_per_rank)
    elif partition is not None:
        layout = partition.placement()
    else:
        k = dict(chunks_per_rank or {})
        k.setdefault("llm", spec.parallel.llm_chunks_per_rank)
        layout = Placement.interleaved(pp, spec.layers(), k)
    strategy = Memory(memory or spec.training.memory)
    schedules = []
    cache: dict = {}
    for mbs in mbs_all:
        st = structure_of(mbs, encoders)
        if name == "dynamic":  # the trainer's order: depends on the sequences, not the structure
            sched = greedy_dual_queue(
                layout, st, flops_durations(shape, layout, mbs), memory=strategy
            )
            if run_checker:
                check(sched)
            schedules.append(sched)
            continue
        if st not in cache:
            sched = generate(name, layout, st, memory=strategy)
            if run_checker:
                check(sched)
            cache[st] = sched
        schedules.append(cache[st])
    info = {
        "model": spec.name,
        "cluster": cluster.name,
        "schedule": name,
        "placement": kind,
        "tp": spec.parallel.tensor,
        "pp": pp,
        "dp": dp,
        "num_microbatches": m if balance is None else max(len(x) for x in mbs_all),
        "workload": workload,
        "iteration": iteration,
        "replicas_simulated": replicas,
    }
    return schedules, mbs_all, info

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's ``--overlap-grad-reduce``: DP gradient buckets reduced during the backward.

megatron-core's ``DistributedDataParallel`` (0.19) keeps one gradient buffer per model chunk
(a pipeline stage of the layout: :meth:`pipeweaver.placement.Placement.stages`) and cuts it into
buckets of ``bucket_size`` parameters, in the order the backward produces the gradients (the
last layer first). With ``overlap_grad_reduce`` a bucket's reduction (a reduce-scatter with the
distributed optimizer, else an all-reduce) starts as soon as the backward of the last
microbatch has produced every gradient in it, on one communication stream, so the buckets run
one after the other while the backward goes on. Megatron's rules, as in its source:

* the default ``bucket_size`` is ``max(40_000_000, 1_000_000 x DP size)`` parameters;
* only the first model chunk of pipeline rank 0 is bucketed: every other chunk (pipeline
  ranks > 0, and the later virtual stages) is one bucket, "since data-parallel communication
  on these stages is not on the critical path";
* without the flag the whole rank is one reduction after its last backward (SEMU's
  non-overlapped model, kept in :class:`~pipeweaver.semu.simulator.Semu`).

Inside a chunk's last backward the layers finish from the top down at an even pace (the layers
of a module are alike); the head's parameters count with the chunk's last layer, the input
layer's with its first. A chunk that ran no backward in a replica (no image in its batch) has
its gradients at that replica's last compute, where Megatron's ``finish_grad_sync`` starts
what has not started.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from pipeweaver.placement import Placement


def default_bucket_params(data_parallel: int) -> int:
    """megatron-core's default ``bucket_size`` for a DP group of ``data_parallel`` ranks."""
    return max(40_000_000, 1_000_000 * data_parallel)


@dataclass(frozen=True, slots=True)
class GradBucket:
    """One gradient bucket of a pipeline rank."""

    params: float
    """Parameters in it (this TP rank's)."""

    ready_s: float
    """When the backward has produced its last gradient, on the latest DP replica."""


@dataclass(frozen=True, slots=True)
class BucketReduction:
    """One bucket's reduction on the communication stream."""

    bucket: GradBucket
    """The bucket."""

    start_s: float
    """When it starts: when it is ready and the previous bucket is done."""

    end_s: float
    """When it ends."""


def rank_buckets(
    placement: Placement,
    rank: int,
    layer_params: Callable[[str, int, int], float],
    last_backward: Sequence[Mapping[tuple[str, int], tuple[float, float]]],
    replica_end: Sequence[float],
    bucket_params: int,
) -> list[GradBucket]:
    """The gradient buckets of one pipeline rank, in the order they become ready.

    Args:
        placement: the chunk layout.
        rank: the pipeline rank.
        layer_params: ``(module, start, stop) -> parameters`` of a layer range on one TP rank
            (``ModelCosts.chunk_params``: input layer and head included at the module's ends).
        last_backward: per DP replica, ``(module, chunk) -> (start, end)`` of the chunk's last
            backward compute on this rank.
        replica_end: per DP replica, this rank's last compute.
        bucket_params: Megatron's ``bucket_size`` for the rank's first model chunk (the
            others are one bucket each, see the module docstring).
    """
    stages = [s for s in placement.stages() if placement.rank_of(*s[0]) == rank]
    buckets: list[GradBucket] = []
    for v, stage in enumerate(stages):
        limit = bucket_params if rank == 0 and v == 0 else float("inf")
        # Gradients in the order the backward produces them: the stage's last chunk first,
        # each chunk's top layer first.
        pieces: list[tuple[float, float]] = []  # (params, ready) in production order
        for module, chunk in reversed(stage):
            start, stop = placement.layer_range(module, chunk)
            n = stop - start
            for k in range(n):
                layer = stop - 1 - k
                params = layer_params(module, layer, layer + 1)
                ready = 0.0
                for d, table in enumerate(last_backward):
                    window = table.get((module, chunk))
                    if window is None:
                        ready = max(ready, replica_end[d])
                    else:
                        b, e = window
                        ready = max(ready, b + (e - b) * (k + 1) / n)
                pieces.append((params, ready))
        size, ready = 0.0, 0.0
        for params, at in pieces:
            size += params
            ready = max(ready, at)
            if size >= limit:
                buckets.append(GradBucket(size, ready))
                size = 0.0
        if size > 0:
            buckets.append(GradBucket(size, ready))
    buckets.sort(key=lambda b: b.ready_s)
    return buckets


def overlapped_reduction(
    buckets: Sequence[GradBucket], seconds: Callable[[float], float]
) -> list[BucketReduction]:
    """The buckets' reductions on one communication stream, each as soon as it is ready.

    Args:
        buckets: in the order they become ready.
        seconds: parameters of a bucket -> seconds of its reduction.
    """
    out: list[BucketReduction] = []
    free = 0.0
    for b in buckets:
        start = max(free, b.ready_s)
        free = start + seconds(b.params)
        out.append(BucketReduction(b, start, free))
    return out


def last_backward_windows(events, rank: int) -> dict[tuple[str, int], tuple[float, float]]:
    """``(module, chunk) -> (start, end)`` of the latest-ending backward of each chunk on a
    rank, from a pipeline's recorded compute events."""
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for e in events:
        if e.rank != rank or e.category != "B":
            continue
        key = (e.module, e.chunk)
        if key not in out or e.end > out[key][1]:
            out[key] = (e.start, e.end)
    return out

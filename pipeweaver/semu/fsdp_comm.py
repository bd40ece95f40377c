# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The DP communication of Megatron-FSDP and of the distributed optimizer's overlapped
parameter gather, on a communication stream beside each rank's compute.

What megatron-core 0.19 does (``megatron_fsdp.py``; docs/architecture.md [5]):

* **FSDP units:** the modules named in ``fsdp_unit_modules`` (Megatron's transformer layers)
  are the units of every collective; SEMU's unit is one layer of a module, the module's input
  layer counted with its first layer and its head with its last (as
  :mod:`pipeweaver.semu.grad_reduce` counts them).
* **``optim_grads_params``** (weights sharded): a unit's weights are all-gathered before its
  forward and released after it, and gathered again before its backward; the forward
  pre-hook asks for the unit's gather and prefetches the next unit's in the same order, so one
  gather runs ahead of the compute (the backward prefetches in the backward order). A whole
  recomputed layer gathers once for its rerun forward and its backward. The flag forces
  ``overlap_param_gather`` and ``overlap_grad_reduce``.
* **``optim_grads`` and ``optim_grads_params``** (gradients sharded): a unit's gradients are
  reduce-scattered right after its backward, in *every* microbatch
  (``grad_reduce_every_bprop``: there is no full gradient buffer to accumulate into); with
  unsharded weights (``optim_grads``) the updated shards are all-gathered once after the
  optimizer step.
* **``optim``** and ``no_shard`` delay the reduction to the last microbatch
  (``is_delay_grad_reduce``): the distributed optimizer's path of
  :class:`~pipeweaver.semu.simulator.Semu` (buckets with ``--overlap-grad-reduce``, a
  reduce-scatter then an all-gather of the weights).
* **The distributed optimizer's ``--overlap-param-gather``**: the all-gather of the updated
  weights is not waited after the optimizer but before each bucket's first forward of the next
  step, the next bucket's dispatched when one is waited; SEMU gathers per unit before the
  unit's first forward on the rank, one ahead, in the step itself (the steady state: the
  previous step's gather overlapped with this one's forward). OrchWeave's trainer
  (``megatron.mllm.param_gather``) dispatches every bucket's gather as the step's forward
  starts, in the forward's order (``gathers_at_once``): each gather is issued then, one after
  the other on the stream, and each unit still waits for its own.

Every collective is a ring over the DP group on the cluster's links
(:meth:`pipeweaver.semu.timing.CommModel.all_gather` / ``reduce_scatter``: NVLink when the DP
group sits in one node, the NIC otherwise). The stream is FIFO: an op starts when it is issued
and the previous op is done. A compute starts when the rank reaches it and its unit's gather
is done; what it waits is a stall that delays the rank's later work by as much. SEMU applies
the stalls to each rank's simulated timeline after the pipeline's simulation: a stall is not
propagated to the receives of the rank's pipeline peers (nor absorbed by the rank's own later
waits for them), and the DP ranks' collectives are not synchronised with each other (each
rank pays its ring's time on its own timeline).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from pipeweaver.placement import Placement
from pipeweaver.semu.results import Event, PipelineResult

GATHER = "all-gather"
REDUCE = "reduce-scatter"
OUTER = "all-reduce"


@dataclass(frozen=True, slots=True)
class UnitUse:
    """One compute of one FSDP unit (a layer) on one rank."""

    module: str
    """The unit's module."""

    layer: int
    """The unit's layer in its module."""

    params: float
    """Parameters of the unit (one TP rank's)."""

    start: float
    """When the rank reached it in the simulated pipeline."""

    end: float
    """When it ended there."""

    backward: bool
    """A backward (recompute included) rather than a forward."""


@dataclass(frozen=True, slots=True)
class CommOp:
    """One collective on a rank's communication stream."""

    kind: str
    """:data:`GATHER` (weights), :data:`REDUCE` (gradients) or :data:`OUTER` (a gradient
    shard across HSDP's copies)."""

    use: UnitUse
    """The compute it gathers for, or whose gradients it reduces."""

    start: float
    """When it starts: issued, and the previous op done."""

    end: float
    """When it ends."""


@dataclass(frozen=True, slots=True)
class RankStream:
    """A rank's communication stream and its computes as the gathers delay them."""

    ops: list[CommOp]
    """The collectives in stream order."""

    starts: list[float]
    """Per use, when its compute starts (after its gather)."""

    shift: float
    """How much the rank's last compute ends later than in the pipeline's simulation."""

    end: float
    """When the stream's last op ends (0 without ops)."""


def unit_uses(
    events: Sequence[Event],
    rank: int,
    placement: Placement,
    layer_params: Callable[[str, int, int], float],
) -> list[UnitUse]:
    """The layer-by-layer computes of one rank, in execution order.

    A chunk's compute runs its layers at an even pace (the layers of a module are alike): a
    forward from its first layer up, a backward from its last layer down.

    Args:
        events: one pipeline's recorded events (compute events count).
        rank: the pipeline rank.
        placement: the chunk layout.
        layer_params: ``(module, start, stop) -> parameters`` on one TP rank
            (``ModelCosts.chunk_params``).
    """
    computes = sorted(
        (e for e in events if e.rank == rank and e.category in ("F", "B")), key=lambda e: e.start
    )
    out: list[UnitUse] = []
    for e in computes:
        start, stop = placement.layer_range(e.module, e.chunk)
        n = stop - start
        backward = e.category == "B"
        width = (e.end - e.start) / n if n else 0.0
        for k in range(n):
            layer = stop - 1 - k if backward else start + k
            params = layer_params(e.module, layer, layer + 1)
            b = e.start + k * width
            out.append(UnitUse(e.module, layer, params, b, b + width, backward))
    return out


def run_stream(
    uses: Sequence[UnitUse],
    gather_s: Callable[[float], float] | None,
    reduce_s: Callable[[float], float] | None,
    first_forward_only: bool = False,
    outer_s: Callable[[float], float] | None = None,
    gathers_at_once: bool = False,
) -> RankStream:
    """One rank's stream: gathers one unit ahead, reduce-scatters after each backward.

    Args:
        uses: the rank's unit computes in order (:func:`unit_uses`).
        gather_s: parameters -> seconds of a unit's weight all-gather; None: no gathers.
        reduce_s: parameters -> seconds of a unit's gradient reduce-scatter; None: none.
        first_forward_only: gather only before each unit's first forward (the distributed
            optimizer's ``--overlap-param-gather``), else before every use (FSDP).
        outer_s: parameters -> seconds of the all-reduce of a unit's gradient shard across the
            copies (HSDP), after the reduce-scatter of its last backward; None: none.
        gathers_at_once: issue every gather when the rank reaches the first unit that needs
            one, in the units' order (OrchWeave's trainer, ``megatron.mllm.param_gather``),
            instead of one ahead.
    """
    last_backward = {}
    if outer_s is not None:
        last_backward = {(u.module, u.layer): i for i, u in enumerate(uses) if u.backward}
    need: list[int] = []
    if gather_s is not None:
        seen: set[tuple[str, int]] = set()
        for i, u in enumerate(uses):
            if not first_forward_only:
                need.append(i)
            elif not u.backward and (u.module, u.layer) not in seen:
                seen.add((u.module, u.layer))
                need.append(i)
    order = {i: k for k, i in enumerate(need)}
    ops: list[CommOp] = []
    done: dict[int, float] = {}
    free = 0.0

    def issue(kind: str, use: UnitUse, at: float, seconds: float) -> float:
        nonlocal free
        start = max(at, free)
        free = start + seconds
        ops.append(CommOp(kind, use, start, free))
        return free

    shift, starts = 0.0, []
    for i, u in enumerate(uses):
        reach = u.start + shift  # the pre-hook runs when the rank reaches the unit
        start = reach
        k = order.get(i)
        if k is not None:
            if gathers_at_once and k == 0:
                for j in need:
                    done[j] = issue(GATHER, uses[j], reach, gather_s(uses[j].params))
            if i not in done:  # not prefetched: the first one, or after a gap in ``need``
                done[i] = issue(GATHER, u, reach, gather_s(u.params))
            if k + 1 < len(need) and not gathers_at_once:  # prefetch the next unit to gather
                nxt = uses[need[k + 1]]
                done[need[k + 1]] = issue(GATHER, nxt, reach, gather_s(nxt.params))
            start = max(reach, done[i])
        starts.append(start)
        shift = start - u.start
        if reduce_s is not None and u.backward:
            issue(REDUCE, u, start + (u.end - u.start), reduce_s(u.params))
            if last_backward.get((u.module, u.layer)) == i:
                issue(OUTER, u, free, outer_s(u.params))
    return RankStream(ops, starts, shift, free)


def ring_bytes_per_rank(nbytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-gather or reduce-scatter of
    ``nbytes`` over ``n`` ranks: ``nbytes / n`` per step for ``n - 1`` steps."""
    return nbytes / n * (n - 1) if n > 1 else 0.0


@dataclass
class DataParallelStep:
    """The pipelines as the DP communication delays them, and what the step does after."""

    results: list[PipelineResult]
    """Per replica: its pipeline with computes delayed by their stalls and each rank's end
    moved to after its stream's last op."""

    streams: list[list[RankStream]]
    """``[replica][rank]``: the communication streams."""

    grads_reduced: bool
    """The gradients were reduce-scattered in the backward (``optim_grads*``)."""

    overlap_param_gather: bool
    """The distributed optimizer's weights were gathered in the forward, not after the
    optimizer."""

    gather_after_optimizer: list[float]
    """Per pipeline rank, seconds of the weights' all-gather after the optimizer (0 where
    the weights are gathered in the forward)."""

    def events(self, replica: int) -> list[Event]:
        """The communication stream's ops of one replica as timeline events."""
        out = []
        for r, stream in enumerate(self.streams[replica]):
            for op in stream.ops:
                category = {GATHER: "allgather", REDUCE: "reducescatter"}.get(op.kind, "allreduce")
                name = f"dp {op.kind} {op.use.module}{op.use.layer}"
                out.append(Event(r, op.start, op.end, name, category))
        return out


class DataParallelComm:
    """What one step's DP communication adds to the pipelines (built by
    :meth:`pipeweaver.semu.simulator.Semu`; :func:`for_layout` says when there is any).

    Args:
        strategy: Megatron-FSDP's ``data_parallel_sharding`` (``none`` without FSDP).
        overlap_param_gather: the distributed optimizer's ``--overlap-param-gather``.
        data_parallel: DP size.
        gather_s: bytes of a whole (unsharded) tensor -> seconds of its ring all-gather.
        reduce_s: bytes of a whole tensor -> seconds of its ring reduce-scatter.
        layer_params: ``(module, start, stop) -> parameters`` on one TP rank.
        rank_params: ``(pipeline rank, placement) -> parameters`` (one TP rank's).
        weight_bytes: bytes of one weight (the model's dtype).
        grad_bytes: bytes of one reduced gradient (fp32 main gradients).
        outer_s: bytes of a whole tensor -> seconds of the all-reduce of its shard across
            HSDP's copies (None: one copy).
        gathers_at_once: with ``overlap_param_gather``, every gather issued as the rank's
            forward reaches its first unit (OrchWeave's trainer) instead of one unit ahead
            (megatron-core's chain).
    """

    def __init__(
        self,
        strategy: str,
        overlap_param_gather: bool,
        data_parallel: int,
        gather_s: Callable[[float], float],
        reduce_s: Callable[[float], float],
        layer_params: Callable[[str, int, int], float],
        rank_params: Callable[[int, Placement], float],
        weight_bytes: float,
        grad_bytes: float,
        outer_s: Callable[[float], float] | None = None,
        gathers_at_once: bool = False,
    ):
        self.params_sharded = strategy == "optim_grads_params"
        self.grads_sharded = strategy in ("optim_grads", "optim_grads_params")
        self.overlap_param_gather = overlap_param_gather and not self.grads_sharded
        self.dp = data_parallel
        self._gather = gather_s
        self._reduce = reduce_s
        self.layer_params = layer_params
        self.rank_params = rank_params
        self.weight_bytes = weight_bytes
        self.grad_bytes = grad_bytes
        self._outer = outer_s
        self.gathers_at_once = gathers_at_once and self.overlap_param_gather

    def unit_gather_s(self, params: float) -> float:
        """Seconds of one unit's weight all-gather."""
        return self._gather(params * self.weight_bytes)

    def unit_reduce_s(self, params: float) -> float:
        """Seconds of one unit's gradient reduce-scatter."""
        return self._reduce(params * self.grad_bytes)

    def apply(self, placement: Placement, results: Sequence[PipelineResult]) -> DataParallelStep:
        """Run every replica's rank streams on its recorded computes (events needed)."""
        gather = self.unit_gather_s if self.params_sharded or self.overlap_param_gather else None
        reduce = self.unit_reduce_s if self.grads_sharded else None
        outer = None
        if self.grads_sharded and self._outer is not None:
            outer = lambda params: self._outer(params * self.grad_bytes)  # noqa: E731
        out, streams = [], []
        for res in results:
            rank_streams = []
            for r in range(len(res.rank_end)):
                uses = unit_uses(res.events, r, placement, self.layer_params)
                rank_streams.append(
                    run_stream(
                        uses, gather, reduce, not self.params_sharded, outer, self.gathers_at_once
                    )
                )
            streams.append(rank_streams)
            out.append(_delayed(res, placement, rank_streams))
        after = []
        for r in range(placement.num_ranks):
            weights = self.rank_params(r, placement) * self.weight_bytes
            late = self.grads_sharded and not self.params_sharded
            after.append(self._gather(weights) if late else 0.0)
        return DataParallelStep(out, streams, self.grads_sharded, self.overlap_param_gather, after)


def _delayed(
    res: PipelineResult, placement: Placement, streams: Sequence[RankStream]
) -> PipelineResult:
    """A pipeline's result with each compute event moved by its first layer's stall (the
    layers of one compute are consecutive, so it lasts as long plus its inner stalls)."""
    # id(event) -> (its first layer's start, its last layer's start, one layer's seconds)
    moved: dict[int, tuple[float, float, float]] = {}
    for r, stream in enumerate(streams):
        computes = sorted(
            (e for e in res.events if e.rank == r and e.category in ("F", "B")),
            key=lambda e: e.start,
        )
        i = 0
        for e in computes:
            start, stop = placement.layer_range(e.module, e.chunk)
            n = stop - start
            if n:
                per = (e.end - e.start) / n
                moved[id(e)] = (stream.starts[i], stream.starts[i + n - 1], per)
            i += n
    events = []
    for e in res.events:
        got = moved.get(id(e))
        if got is None:
            events.append(e)
            continue
        first, last, per = got
        # The compute ends one layer's time after its last layer started.
        events.append(dataclasses.replace(e, start=first, end=last + per))
    shift = [s.shift for s in streams]
    rank_end = [max(res.rank_end[r] + shift[r], streams[r].end) for r in range(len(streams))]
    return PipelineResult(
        max([res.makespan + max(shift, default=0.0), *rank_end]),
        list(res.start),
        rank_end,
        list(res.busy),
        list(res.peak_activation),
        events,
    )


def for_layout(
    strategy: str, distributed_optimizer: bool, overlap_param_gather: bool, data_parallel: int
) -> bool:
    """Whether the step has DP communication of this module: FSDP sharding gradients or
    weights, or the distributed optimizer's overlapped parameter gather, over DP > 1."""
    if data_parallel <= 1:
        return False
    return strategy in ("optim_grads", "optim_grads_params") or (
        overlap_param_gather and (distributed_optimizer or strategy == "optim")
    )


def data_parallel_comm(
    semu, overlap_param_gather: bool, gathers_at_once: bool = False
) -> DataParallelComm | None:
    """The DP communication of a :class:`~pipeweaver.semu.simulator.Semu`'s layout; None
    where :func:`for_layout` finds none (``gathers_at_once``: see :class:`DataParallelComm`).
    Collectives ring over the DP group, or over its shard groups with HSDP
    (:mod:`pipeweaver.semu.dp_groups`): NVLink when the group sits in one node, the NIC
    otherwise, as the simulator's gradient all-reduce."""
    parallel = semu.spec.parallel
    strategy = parallel.data_parallel_sharding
    dp = semu.dp
    if not for_layout(strategy, parallel.distributed_optimizer, overlap_param_gather, dp):
        return None
    costs, groups = semu.cost.costs, semu.dp_groups

    def rank_params(r: int, placement: Placement) -> float:
        return sum(costs.chunk_params(m, *placement.layer_range(m, c))
                   for m, c in placement.chunks_on(r))  # fmt: skip

    return DataParallelComm(
        strategy,
        overlap_param_gather,
        dp,
        groups.gather_s,
        groups.reduce_scatter_s,
        costs.chunk_params,
        rank_params,
        semu.spec.shape.params_dtype_bytes,
        semu.spec.training.grad_dtype_bytes,
        groups.outer_all_reduce_s if groups.instances > 1 else None,
        gathers_at_once,
    )

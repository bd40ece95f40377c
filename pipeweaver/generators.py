# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Schedule generators: the orders users compare against, in the IR.

* :func:`one_f_one_b`: Megatron's non-interleaved 1F1B (``forward_backward_pipelining_without_
  interleaving``): rank r runs ``P - r - 1`` warm-up forwards, then alternates one forward and
  one backward, then drains the backwards;
* :func:`interleaved_one_f_one_b`: Megatron's interleaved 1F1B with the LLM cut into P*K chunks
  (``forward_backward_pipelining_with_interleaving`` and its ``get_schedule_table``, microbatch
  groups of P);
* :func:`no_pipelining`: one rank; each microbatch's forward then its backward
  (``forward_backward_no_pipelining``);
* :func:`dataflow`: any placement (encoders interleaved over all ranks included), a greedy
  unit-time list schedule, valid by construction; a reference order for tests and the runtime.

The first three run Megatron's pipeline stages (:meth:`Placement.stages`): upstream's
"encoders on stage 0" placement, where every encoder chunk sits on the rank of LLM chunk 0 and
runs as part of that rank's forward of the microbatch (all encoder subs, then LLM chunk 0) and
of its backward (LLM chunk 0, then the encoders in reverse), as megatron-core's schedule runs
OrchWeave's stage model; or DIP's baseline, the parameter-balanced layout, whose stages cut the
encoders' and the LLM's layers consecutively (a stage's forward runs its encoder chunk for every
sub, then its LLM chunk).

Every generator returns a lowered schedule (with its comms, :func:`pipeweaver.lowering.lower`).
"""

from __future__ import annotations

import heapq
from typing import Callable, Mapping

from pipeweaver.dataflow import MicrobatchStructure, all_computes, dependency_graph
from pipeweaver.ir import MODULE_INDEX, Compute, Kind, Memory, ScheduleError
from pipeweaver.lowering import lower
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule


def _stage_forward(
    structure: MicrobatchStructure, stage: list[tuple[str, int]], mb: int, memory: Memory
) -> list[Compute]:
    """The forwards one pipeline stage runs for a microbatch: per module of the stage in flow
    order, an encoder's chunks for each of its subs (none when the microbatch has none), the
    LLM's chunk once."""
    out = []
    by_module: dict[str, list[int]] = {}
    for module, c in stage:
        by_module.setdefault(module, []).append(c)
    for module, chunks in by_module.items():
        subs = 1 if module == "llm" else structure.num_subs(module, mb)
        for s in range(subs):
            for c in chunks:
                out.append(Compute(module, c, Kind.F, mb, s, memory))
    return out


def _backward_of(forward: list[Compute]) -> list[Compute]:
    return [a.partner() for a in reversed(forward)]


def _megatron_stages(placement: Placement) -> tuple[list[list[tuple[str, int]]], int]:
    """The placement's pipeline stages (:meth:`Placement.stages`) and the virtual stages per
    rank K, checked to be Megatron's round robin: stage v on rank v mod P, P x K stages."""
    p = placement.num_ranks
    stages = placement.stages()
    for v, stage in enumerate(stages):
        module, c = stage[0]
        if placement.rank_of(module, c) != v % p:
            raise ScheduleError(
                f"Megatron's schedules put pipeline stage {v} on rank {v % p}, but its first "
                f"chunk ({module} chunk {c}) is on rank {placement.rank_of(module, c)}; use "
                f"Placement.baseline, Placement.balanced_stages or the dataflow generator"
            )
    if len(stages) % p != 0:
        raise ScheduleError(
            f"the placement has {len(stages)} pipeline stages, not a multiple of the {p} ranks"
        )
    return stages, len(stages) // p


def one_f_one_b(
    placement: Placement, structure: MicrobatchStructure, memory: Memory = Memory.NONE
) -> Schedule:
    """Megatron's 1F1B over the placement's P pipeline stages (:meth:`Placement.stages`).

    Stage r runs on rank r: the baseline's stage 0 holds the encoders and LLM chunk 0; a
    parameter-balanced layout's stages hold consecutive layers, encoders first, so an encoder
    may span stages (a microbatch's forward flows through its vision chunks, then the LLM's).

    Raises:
        ScheduleError: the placement is not one Megatron stage per rank.
    """
    stages, k = _megatron_stages(placement)
    if k != 1:
        raise ScheduleError(
            f"1F1B needs one pipeline stage per rank, the placement has {k}; use "
            f"interleaved_one_f_one_b"
        )
    p, m = placement.num_ranks, structure.num_microbatches
    ranks = []
    for r in range(p):
        fwd = [_stage_forward(structure, stages[r], mb, memory) for mb in range(m)]
        warmup = min(p - r - 1, m)
        order: list[Compute] = []
        for mb in range(warmup):
            order += fwd[mb]
        for i in range(m - warmup):
            order += fwd[warmup + i]
            order += _backward_of(fwd[i])
        for i in range(m - warmup, m):
            order += _backward_of(fwd[i])
        ranks.append(tuple(order))
    return lower(Schedule(placement, structure, tuple(ranks), "1f1b"))


def megatron_schedule_table(
    num_microbatches: int, num_chunks: int, group_size: int
) -> list[tuple[int, int]]:
    """``(microbatch, local chunk)`` per virtual microbatch, as megatron-core's
    ``get_schedule_table``: groups of ``group_size`` microbatches go through every chunk."""
    table = []
    for lo in range(0, num_microbatches, group_size):
        hi = num_microbatches if lo + group_size >= num_microbatches else lo + group_size
        table += [(mb, c) for c in range(num_chunks) for mb in range(lo, hi)]
    return table


def interleaved_one_f_one_b(
    placement: Placement,
    structure: MicrobatchStructure,
    memory: Memory = Memory.NONE,
    group_size: int | None = None,
) -> Schedule:
    """Megatron's interleaved 1F1B (virtual pipeline) over the placement's P x K stages.

    Args:
        placement: pipeline stage v on rank v mod P (``Placement.baseline(P, layers, K)``,
            ``Placement.balanced_stages(P, params, K)``).
        structure: microbatches and subs; at least ``group_size`` microbatches.
        memory: memory strategy of every compute.
        group_size: microbatches per group (``microbatch_group_size_per_vp_stage``); default P.

    Raises:
        ScheduleError: the placement or the microbatch count does not fit.
    """
    stages, k = _megatron_stages(placement)
    p, m = placement.num_ranks, structure.num_microbatches
    group = p if group_size is None else group_size
    if group < p or group > m:
        raise ScheduleError(
            f"interleaved 1F1B needs P <= group size <= microbatches, got P={p}, group {group}, "
            f"{m} microbatches (as megatron-core)"
        )
    if 0 < m % group < p:
        # megatron-core raises here too: the last group's forwards would wait on backwards
        # that wait on them (a cyclic dependency, not only bubbles, once K >= 3).
        raise ScheduleError(
            f"interleaved 1F1B: the remainder of {m} microbatches over groups of {group} is "
            f"{m % group}, which must be 0 or at least P={p} (as megatron-core requires)"
        )
    table = megatron_schedule_table(m, k, group)
    total = m * k
    ranks = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (k - 1) * group, total)

        def fwd(v: int) -> list[Compute]:
            mb, c = table[v]
            return _stage_forward(structure, stages[c * p + r], mb, memory)

        def bwd(v: int) -> list[Compute]:
            mb, c = table[v]
            return _backward_of(_stage_forward(structure, stages[(k - 1 - c) * p + r], mb, memory))

        order: list[Compute] = []
        for v in range(warmup):
            order += fwd(v)
        for v in range(total - warmup):
            order += fwd(v + warmup)
            order += bwd(v)
        for v in range(total - warmup, total):
            order += bwd(v)
        ranks.append(tuple(order))
    return lower(Schedule(placement, structure, tuple(ranks), "interleaved"))


def no_pipelining(
    placement: Placement, structure: MicrobatchStructure, memory: Memory = Memory.NONE
) -> Schedule:
    """One rank: each microbatch's forward through every chunk, then its backward.

    Raises:
        ScheduleError: the placement has more than one rank.
    """
    if placement.num_ranks != 1:
        raise ScheduleError(
            f"no_pipelining runs on one rank, the placement has {placement.num_ranks}"
        )
    order: list[Compute] = []
    stages = placement.stages()
    for mb in range(structure.num_microbatches):
        fwd = [a for stage in stages for a in _stage_forward(structure, stage, mb, memory)]
        order += fwd + _backward_of(fwd)
    return lower(Schedule(placement, structure, (tuple(order),), "none"))


def dataflow(
    placement: Placement,
    structure: MicrobatchStructure,
    memory: Memory = Memory.NONE,
    priority: Callable[[Compute], tuple] | None = None,
) -> Schedule:
    """A greedy list schedule for any placement, valid by construction.

    Every compute takes one time unit; at each step, each rank runs its highest-priority ready
    compute. The default priority runs backwards first (they free memory), then the lowest
    microbatch, encoders before the LLM.

    Args:
        placement: any placement.
        structure: microbatches and subs.
        memory: memory strategy of every compute.
        priority: key of a compute; lower runs first.
    """
    order_key = priority or (
        lambda a: (
            0 if a.kind is Kind.B else 1,
            a.microbatch,
            MODULE_INDEX[a.module],
            a.sub,
            a.chunk,
        )
    )
    computes = list(all_computes(placement, structure))
    missing, dependents = dependency_graph(computes, placement, structure)
    ready: list[list] = [[] for _ in range(placement.num_ranks)]
    for a in computes:
        if missing[a] == 0:
            heapq.heappush(ready[placement.rank_of(a.module, a.chunk)], (order_key(a), a))
    order: list[list[Compute]] = [[] for _ in range(placement.num_ranks)]
    done = 0
    while done < len(computes):
        finished = []
        for r in range(placement.num_ranks):
            if ready[r]:
                _, a = heapq.heappop(ready[r])
                order[r].append(a.with_memory(memory))
                finished.append(a)
        if not finished:
            raise ScheduleError("dataflow: no compute is ready; the data flow has a cycle")
        for a in finished:
            done += 1
            for d in dependents[a]:
                missing[d] -= 1
                if missing[d] == 0:
                    heapq.heappush(ready[placement.rank_of(d.module, d.chunk)], (order_key(d), d))
    return lower(Schedule(placement, structure, tuple(tuple(o) for o in order), "dataflow"))


GENERATORS: Mapping[str, Callable[..., Schedule]] = {
    "1f1b": one_f_one_b,
    "interleaved": interleaved_one_f_one_b,
    "none": no_pipelining,
    "dataflow": dataflow,
}
"""Generators by name (``tools/semu.py --schedule NAME``)."""


def generate(
    name: str, placement: Placement, structure: MicrobatchStructure, memory: Memory = Memory.NONE
) -> Schedule:
    """Run the generator called ``name``.

    Raises:
        ScheduleError: unknown name, or the placement does not fit the generator.
    """
    if name not in GENERATORS:
        raise ScheduleError(f"unknown schedule {name!r}; expected one of {sorted(GENERATORS)}")
    return GENERATORS[name](placement, structure, memory=memory)

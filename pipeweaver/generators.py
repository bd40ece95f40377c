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

The first three use the "encoders on stage 0" placement of upstream Megatron: every encoder
chunk sits on the rank of LLM chunk 0, and runs as part of that rank's forward of the
microbatch (all encoder subs, then LLM chunk 0) and of its backward (LLM chunk 0, then the
encoders in reverse), as megatron-core's schedule runs OrchWeave's stage model.

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


def _stage0_forward(
    placement: Placement, structure: MicrobatchStructure, mb: int, llm_chunk: int, memory: Memory
) -> list[Compute]:
    out = []
    if llm_chunk == 0:
        for enc in placement.encoders:
            for s in range(structure.num_subs(enc, mb)):
                for c in range(placement.num_chunks(enc)):
                    out.append(Compute(enc, c, Kind.F, mb, s, memory))
    out.append(Compute("llm", llm_chunk, Kind.F, mb, 0, memory))
    return out


def _backward_of(forward: list[Compute]) -> list[Compute]:
    return [a.partner() for a in reversed(forward)]


def _check_encoders_on_stage0(placement: Placement) -> None:
    home = placement.rank_of("llm", 0)
    for enc in placement.encoders:
        for c in range(placement.num_chunks(enc)):
            if placement.rank_of(enc, c) != home:
                raise ScheduleError(
                    f"Megatron's schedules run the encoders on the rank of LLM chunk 0 (rank "
                    f"{home}), but {enc} chunk {c} is on rank {placement.rank_of(enc, c)}; use "
                    f"Placement.baseline or the dataflow generator"
                )


def _check_llm_round_robin(placement: Placement) -> int:
    p = placement.num_ranks
    n = placement.num_chunks("llm")
    if n % p != 0:
        raise ScheduleError(f"the LLM has {n} chunks, not a multiple of the {p} ranks")
    for j in range(n):
        if placement.rank_of("llm", j) != j % p:
            raise ScheduleError(
                f"Megatron's schedules put LLM chunk {j} on rank {j % p}, the placement on "
                f"rank {placement.rank_of('llm', j)}"
            )
    return n // p


def one_f_one_b(
    placement: Placement, structure: MicrobatchStructure, memory: Memory = Memory.NONE
) -> Schedule:
    """Megatron's 1F1B, encoders on stage 0.

    Raises:
        ScheduleError: the placement is not one LLM chunk per rank with encoders on rank 0.
    """
    if _check_llm_round_robin(placement) != 1:
        raise ScheduleError("1F1B needs one LLM chunk per rank; use interleaved_one_f_one_b")
    _check_encoders_on_stage0(placement)
    p, m = placement.num_ranks, structure.num_microbatches
    ranks = []
    for r in range(p):
        fwd = [_stage0_forward(placement, structure, mb, r, memory) for mb in range(m)]
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
    """Megatron's interleaved 1F1B (virtual pipeline), encoders on stage 0.

    Args:
        placement: LLM chunk j on rank j mod P (``Placement.baseline(P, layers, K)``).
        structure: microbatches and subs; at least ``group_size`` microbatches.
        memory: memory strategy of every compute.
        group_size: microbatches per group (``microbatch_group_size_per_vp_stage``); default P.

    Raises:
        ScheduleError: the placement or the microbatch count does not fit.
    """
    k = _check_llm_round_robin(placement)
    _check_encoders_on_stage0(placement)
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
            return _stage0_forward(placement, structure, mb, c * p + r, memory)

        def bwd(v: int) -> list[Compute]:
            mb, c = table[v]
            return _backward_of(
                _stage0_forward(placement, structure, mb, (k - 1 - c) * p + r, memory)
            )

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
    for mb in range(structure.num_microbatches):
        fwd = _stage0_forward(placement, structure, mb, 0, memory)
        fwd += [
            Compute("llm", c, Kind.F, mb, 0, memory) for c in range(1, placement.num_chunks("llm"))
        ]
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

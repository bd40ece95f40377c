# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Test oracle: pipeweaver.lowering as it was before issue 13 made it incremental (queues
scanned, every input listed); tests/pipeweaver/test_fast_paths.py asserts that
``pipeweaver.lowering.lower`` gives exactly what this one gives. Not part of the product.

Lowering: a compute-only schedule becomes one the runtime can execute, with its comms.

Rules (the runtime's contract, checked by :mod:`pipeweaver.checker`):

* a compute's output that a compute on another rank consumes is sent right after the producing
  compute (``isend``: it never blocks the sender); same-rank consumers need no communication;
* it is received right before its first consumer (the runtime posts the ``irecv`` ahead and
  waits at the receive action);
* transfers between an ordered pair of ranks are matched in order (NCCL has no tags), so the
  k-th send from a to b carries the tensor of b's k-th receive from a. When b consumes tensors
  in another order than a produces them, a receive moves earlier, next to the later one it
  would otherwise overtake. That adds no waiting: the earlier send was issued first.
"""

from __future__ import annotations

from collections import defaultdict

from pipeweaver.dataflow import consumers, data_inputs
from pipeweaver.ir import Comm, CommOp, Compute, ScheduleError
from pipeweaver.schedule import Schedule


def lower(schedule: Schedule) -> Schedule:
    """Add sends and receives to a schedule's compute order (existing comms are replaced).

    Raises:
        ScheduleError: a compute appears twice, or consumes a compute that no rank runs; names the
            offending action.
    """
    placement, structure = schedule.placement, schedule.structure
    order = [schedule.computes(r) for r in range(schedule.num_ranks)]
    where: dict[Compute, tuple[int, int]] = {}
    for r, computes in enumerate(order):
        for i, a in enumerate(computes):
            if a.key in where:
                raise ScheduleError("the compute appears twice", r, i, a)
            where[a.key] = (r, i)
    for r, computes in enumerate(order):
        for i, a in enumerate(computes):
            for producer, _ in data_inputs(a, placement, structure):
                if producer not in where:
                    raise ScheduleError(f"it needs {producer}, which no rank runs", r, i, a)

    # Sends, right after each producer, in the order of ``consumers`` (schedule-independent, so
    # that SEMU times a compute-only order exactly as its lowered form).
    out: list[list] = [[] for _ in order]
    sent: dict[tuple[int, int], list[tuple]] = defaultdict(list)  # (src, dst) -> edges in order
    for r, computes in enumerate(order):
        for a in computes:
            out[r].append(a)
            remote = []
            for consumer, part in consumers(a, placement, structure):
                dst = placement.rank_of(consumer.module, consumer.chunk)
                if dst == r:
                    continue
                if consumer not in where:
                    raise ScheduleError(
                        f"its consumer {consumer} is not scheduled on any rank", r, None, a
                    )
                remote.append((dst, where[consumer][1], part))
            for dst, _, part in remote:
                out[r].append(Comm(CommOp.SEND, dst, a.key, part))
                sent[(r, dst)].append((a.key, part))

    # Receives: latest position = right before the first consumer; then pulled earlier so that
    # each pair's receives follow its sends' order.
    recvs_before: list[dict[int, list[Comm]]] = [defaultdict(list) for _ in order]
    for (src, dst), edges in sorted(sent.items()):
        positions = []
        for tensor, part in edges:
            consumer_pos = None
            for consumer, cpart in consumers(tensor, placement, structure):
                if cpart == part and placement.rank_of(consumer.module, consumer.chunk) == dst:
                    consumer_pos = where[consumer][1]
                    break
            positions.append(consumer_pos)
        for k in range(len(positions) - 2, -1, -1):
            positions[k] = min(positions[k], positions[k + 1])
        for (tensor, part), pos in zip(edges, positions):
            recvs_before[dst][pos].append(Comm(CommOp.RECV, src, tensor, part))

    final = []
    for r, computes in enumerate(order):
        lst = []
        ci = 0
        for a in out[r]:
            if isinstance(a, Compute):
                lst.extend(recvs_before[r].get(ci, ()))
                ci += 1
            lst.append(a)
        final.append(tuple(lst))
    return Schedule(placement, structure, tuple(final), schedule.name)

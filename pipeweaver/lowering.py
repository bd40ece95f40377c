# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Lowering: a compute-only schedule becomes one the runtime can execute, with its comms.

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

from pipeweaver.dataflow import consumers, data_flow, data_inputs
from pipeweaver.ir import Comm, CommOp, Compute, ScheduleError
from pipeweaver.schedule import Schedule
from pipeweaver.transfers import TransferGraph

COMMS_BY_CONSTRUCTION = "_comms_by_construction"
"""The attribute :func:`lower` sets (True) on a schedule it made from an order that runs every
compute of the step once, each on the rank of its chunk. Its comms then pass checks 2 and 4 of
:mod:`pipeweaver.checker` and every remote input is received before its consumer (check 3's
remote half) by construction: each send comes right after its producer and goes to its
consumer's rank, each receive comes from the producer's rank before the consumer's position,
the receives of a pair of ranks in its sends' order, each transfer once.
:func:`pipeweaver.checker.check` confirms only the rest of such a schedule (its computes, and
the deadlock replay of all its actions). A schedule built otherwise (parsed, edited, made anew
from these actions) has no such attribute and is checked in full."""


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
            key = a.key
            if key in where:
                raise ScheduleError("the compute appears twice", r, i, a)
            where[key] = (r, i)
    flow = data_flow(placement, structure)
    # When the schedule runs exactly the step's computes (as many, each one of them), every
    # producer is scheduled: the per-input check below is skipped.
    complete = len(where) == len(flow.computes) and all(a in flow.inputs for a in where)
    if not complete:
        for r, computes in enumerate(order):
            for i, a in enumerate(computes):
                for producer, _ in data_inputs(a, placement, structure):
                    if producer not in where:
                        raise ScheduleError(f"it needs {producer}, which no rank runs", r, i, a)

    # Sends, right after each producer, in the order of ``consumers`` (schedule-independent, so
    # that SEMU times a compute-only order exactly as its lowered form).
    out: list[list] = [[] for _ in order]
    # (src, dst) -> per transfer in send order, (its first-use key, its receive)
    sent: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    # first-use key -> position on dst of the first consumer there of that (tensor, part)
    first_use: dict = {}
    home = {m: tuple(cp.rank for cp in cps) for m, cps in placement.chunks.items()}
    outputs = flow.outputs
    send, recv = CommOp.SEND, CommOp.RECV
    # The comms of a complete step are made from its data flow's own computes and parts: valid
    # by construction, so they skip the constructor's checks. A compute on its chunk's rank
    # (every one, in a valid order) takes its transfers and their comms from the step's
    # TransferGraph, made once per data-flow piece; its transfer id is its first-use key (one
    # consumer per transfer, so one per (dst, tensor, part)).
    trusted = Comm.trusted if complete else None
    graph = TransferGraph(placement, structure) if complete else None
    on_home = 0  # computes that took their transfers from the graph
    for r, computes in enumerate(order):
        out_r = out[r]
        for a in computes:
            out_r.append(a)
            key = a.key
            if graph is not None:
                m = key.microbatch
                piece = graph.pieces[m]
                facts = piece.facts[key]
                if facts[0] == r:
                    on_home += 1
                    base = graph.edge_base[m]
                    for e, dst in facts[4]:
                        first_use[base + e] = where[piece.consumer[e]][1]
                        out_r.append(piece.send[e])
                        sent[(r, dst)].append((base + e, piece.recv[e]))
                    continue
            listed = outputs.get(key)
            if listed is None:  # not a compute of this step: consumers names what it lacks
                listed = consumers(a, placement, structure)
            remote = []
            for consumer, part in listed:
                dst = home[consumer.module][consumer.chunk]
                if dst == r:
                    continue
                at = where.get(consumer)
                if at is None:
                    raise ScheduleError(
                        f"its consumer {consumer} is not scheduled on any rank", r, None, a
                    )
                pos = at[1]
                remote.append((dst, part))
                first_use.setdefault((dst, key, part), pos)
            for dst, part in remote:
                out_r.append(
                    trusted(send, dst, key, part) if trusted else Comm(send, dst, key, part)
                )
                c = trusted(recv, r, key, part) if trusted else Comm(recv, r, key, part)
                sent[(r, dst)].append(((dst, key, part), c))

    # Receives: latest position = right before the first consumer; then pulled earlier so that
    # each pair's receives follow its sends' order.
    recvs_before: list[dict[int, list[Comm]]] = [defaultdict(list) for _ in order]
    for (src, dst), edges in sorted(sent.items()):
        positions = [first_use[k] for k, _ in edges]
        for k in range(len(positions) - 2, -1, -1):
            positions[k] = min(positions[k], positions[k + 1])
        before = recvs_before[dst]
        for (_, c), pos in zip(edges, positions):
            before[pos].append(c)

    final = []
    for r, computes in enumerate(order):
        lst = []
        ci = 0
        before = recvs_before[r]
        for a in out[r]:
            if type(a) is Compute:
                got = before.get(ci)
                if got:
                    lst.extend(got)
                ci += 1
            lst.append(a)
        final.append(tuple(lst))
    lowered = Schedule(placement, structure, tuple(final), schedule.name)
    if graph is not None and on_home == len(where):
        # Every compute of the step once, each on its chunk's rank: the comms above follow the
        # rules, which the checker then need not confirm again (COMMS_BY_CONSTRUCTION).
        object.__setattr__(lowered, COMMS_BY_CONSTRUCTION, True)
    return lowered

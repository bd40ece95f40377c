# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Greedy dual-queue interleaving: the dynamic pipeline's per-batch order of computes.

The second phase of DIP's planner (its per-batch interleaving), as a generator of the schedule
IR: each rank keeps a forward queue and a backward queue of computes whose inputs are scheduled;
the rank that can start something soonest goes next. When both a forward and a backward are
ready as the rank frees up, it alternates with the kind it ran last (1F1B's rhythm); otherwise it
runs whatever can start first, which keeps idle gaps small. Memory bounds a rank in one of two
ways: a soft cap (a rank whose activations exceed it prefers backwards until memory drops) or a
hard limit (a forward that would take the rank's kept activations over the limit never runs:
the rank waits for a backward, and an order that cannot fit even then is an error). Compute durations come from a cost function
(FLOPs or calibrated seconds); within a queue the priority function breaks ties (the default
prefers earlier microbatches).

Pure Python: the result is a compute-only order lowered with :func:`pipeweaver.lowering.lower`,
valid by construction (every compute is placed after its producers).
"""

from __future__ import annotations

import heapq
from typing import Callable, Protocol, Sequence

from orchestration.model_shape import ModelShape
from pipeweaver.dataflow import FlowPiece, MicrobatchStructure, data_flow, flow_pieces
from pipeweaver.ir import MODULE_INDEX, Compute, Kind, Memory, ScheduleError
from pipeweaver.lowering import lower
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule


class SequencedMicrobatch(Protocol):
    """What :func:`flops_durations` needs of a microbatch (the trainer's and SEMU's have it)."""

    def compute_sequences(self, module: str, sub: int) -> tuple[Sequence[int], int]:
        """The independent sequence lengths a compute of ``module`` on sub ``sub`` runs over
        (the sub's encoder units, or the LLM's packed samples), and the LLM rows the sub
        projects (0 for the LLM)."""


def flops_durations(
    shape: ModelShape, placement: Placement, microbatches: Sequence[SequencedMicrobatch]
) -> Callable[[Compute], float]:
    """Compute durations in FLOPs: the chunk's layers over its sequences, plus the input layer on
    chunk 0 and the head on the last chunk; a backward costs twice its forward.

    The trainer and SEMU both order the dynamic pipeline with this, so SEMU simulates exactly
    the order the trainer runs.

    Args:
        shape: the model's sizes.
        placement: the layers of each chunk.
        microbatches: the step's microbatches, indexed by :attr:`Compute.microbatch`.
    """

    # A forward's FLOPs depend on its microbatch's sequences and its chunk's layers, not on the
    # chunk itself: a microbatch's equal chunks and each backward share one evaluation.
    forwards: dict[tuple, float] = {}
    # Per (module, chunk): its layers and whether it holds the module's last one.
    layers = {
        (module, c): (cp.start, cp.stop, cp.stop == placement.num_layers(module))
        for module, cps in placement.chunks.items()
        for c, cp in enumerate(cps)
    }

    def duration(compute: Compute) -> float:
        module, sub = compute.module, compute.sub
        start, stop, last = layers[(module, compute.chunk)]
        key = (compute.microbatch, module, sub, stop - start, start == 0, last)
        flops = forwards.get(key)
        if flops is None:
            mb = microbatches[compute.microbatch]
            lens, rows = mb.compute_sequences(module, sub)
            t = shape.llm if module == "llm" else shape.encoders[module]
            flops = t.forward_flops(lens, layers=stop - start)
            tokens = sum(lens)
            if module != "llm" and start == 0:
                flops += tokens * t.input_flops_per_token
            if last:
                flops += (tokens if module == "llm" else rows) * t.output_flops_per_token
            forwards[key] = flops
        return flops * (2.0 if compute.kind is Kind.B else 1.0)

    return duration


def default_priority(compute: Compute) -> tuple:
    """Earlier microbatches first, encoders before the LLM, then sub and chunk (lower first)."""
    return (compute.microbatch, MODULE_INDEX[compute.module], compute.sub, compute.chunk)


def greedy_dual_queue(
    placement: Placement,
    structure: MicrobatchStructure,
    duration: Callable[[Compute], float],
    *,
    p2p_time: float = 0.0,
    priority: Callable[[Compute], tuple] = default_priority,
    memory: Memory = Memory.NONE,
    memory_cap: float | Sequence[float] | None = None,
    activation_bytes: Callable[[Compute], float] | None = None,
    memory_limit: float | Sequence[float | None] | None = None,
    lowered: bool = True,
) -> Schedule:
    """Interleave every compute of every module on every rank; returns a lowered schedule.

    Args:
        placement: where each chunk lives (typically every module spread over all ranks).
        structure: microbatches and encoder subs of the step.
        duration: predicted time of a compute (F or B).
        p2p_time: latency added when a compute's input comes from another rank.
        priority: lower keys run first among computes ready at the same time.
        memory: memory strategy of every compute.
        memory_cap: activation bytes per rank (one for all or one per rank) above which a rank
            runs only backwards; needs ``activation_bytes``.
        activation_bytes: bytes a forward keeps until its backward.
        memory_limit: hard limit on the activation bytes kept per rank (one for all or one per
            rank, None for no limit on a rank; see
            :func:`pipeweaver.search.memory_limit.memory_limit_bytes`); needs
            ``activation_bytes``. A forward runs only if the rank's kept bytes plus its own stay
            within the limit, so the lowered schedule passes
            :func:`pipeweaver.checker.check` with ``memory_cap=memory_limit``.
        lowered: add the sends and receives (:func:`pipeweaver.lowering.lower`); False returns
            the compute-only order, which SEMU times exactly as the lowered one (the search
            scores its rollouts so and lowers only the schedule it keeps).

    A throttled rank (soft cap) with no backward ready runs a forward anyway: the cap is a
    preference, and the static checker enforces hard caps. Under a hard limit a rank whose next
    forwards do not fit runs only backwards, or waits for one.

    Raises:
        ScheduleError: the data flow cannot be scheduled (a cycle), or under ``memory_limit``
            a forward that cannot fit: alone over its rank's limit, or waiting for memory that
            no backward can free (the rank, the bytes needed and the limit are named).
    """
    P = placement.num_ranks
    caps = None
    if memory_cap is not None:
        if activation_bytes is None:
            raise ScheduleError("memory_cap needs activation_bytes")
        caps = [memory_cap] * P if isinstance(memory_cap, (int, float)) else list(memory_cap)
    limits = None
    if memory_limit is not None:
        if activation_bytes is None:
            raise ScheduleError("memory_limit needs activation_bytes")
        limits = _per_rank(memory_limit, P, "memory_limit")
    flow = data_flow(placement, structure)
    computes = flow.computes
    kept = None
    if activation_bytes is not None:
        # Per compute index, the bytes its F/B pair keeps from its forward under ``memory``,
        # asked once per forward: the data flow lists each pair side by side, forward first
        # (as :func:`_piece_graph` relies on), so a backward's bytes are its neighbour's.
        kept = [0.0] * len(computes)
        for i, a in enumerate(computes):
            if a.kind is Kind.B:
                kept[i] = kept[i - 1]
            else:
                kept[i] = float(activation_bytes(a.with_memory(memory)))

    windows: list[int | None] = [None]
    if limits is not None:
        _check_microbatches_fit(computes, placement, limits, kept)
        # A microbatch's first backward needs all its forwards, so every rank must hold one
        # microbatch's kept bytes at once (checked above), and that suffices when forwards of
        # one microbatch at a time are admitted. The unrestricted greedy can fill memory with
        # forwards of later microbatches that wait on each other; then it is retried with
        # fewer microbatches in flight, down to one.
        w = structure.num_microbatches // 2
        while w > 0:
            windows.append(w)
            w //= 2
        windows.append(0)
    for window in windows:
        try:
            order = _interleave(
                placement, structure, flow, duration, p2p_time, priority, memory, caps,
                limits, kept, window,
            )  # fmt: skip
        except _MemoryDeadlock as e:
            if window == windows[-1]:
                raise ScheduleError(str(e), e.rank, None, e.action) from None
            continue
        schedule = Schedule(placement, structure, tuple(tuple(o) for o in order), "dynamic")
        return lower(schedule) if lowered else schedule
    raise AssertionError("unreachable")


class _MemoryDeadlock(Exception):
    """Every rank waits and a forward waits for memory (retried with fewer microbatches in
    flight; the last try's message becomes the :class:`ScheduleError`)."""

    def __init__(self, message: str, rank: int, action: Compute):
        super().__init__(message)
        self.rank = rank
        self.action = action


def _check_microbatches_fit(computes, placement, limits, kept) -> None:
    """Raise unless every rank can hold the kept bytes of each microbatch's forwards at once
    (``kept``: per compute index, its pair's bytes)."""
    need: dict[tuple[int, int], float] = {}
    first: dict[tuple[int, int], Compute] = {}
    for i, a in enumerate(computes):
        if a.kind is Kind.F:
            k = (placement.rank_of(a.module, a.chunk), a.microbatch)
            need[k] = need.get(k, 0.0) + kept[i]
            first.setdefault(k, a)
    for (r, mb), b in sorted(need.items()):
        if limits[r] is not None and b > limits[r]:
            raise ScheduleError(
                f"microbatch {mb} keeps {b:.0f} activation bytes here until its first backward "
                f"(all its forwards run before it), over the rank's memory limit of "
                f"{limits[r]:.0f} bytes: the schedule cannot fit under the limit",
                r,
                None,
                first[(r, mb)],
            )


class _IndexedQueue:
    """One rank's forward or backward queue, indexed for the greedy pass without limits.

    Entries are ``(earliest start, priority, compute, index)``. A rank's clock only moves forward, so
    an entry that can start at the rank's clock can start at every later one: such entries
    move once from ``waiting`` (a heap by start, then priority) to ``ready`` (a heap by
    priority, then start). The highest-priority startable entry and the earliest one are then
    heap tops, where the scanned queue looked through every entry.
    """

    __slots__ = ("waiting", "ready")

    def __init__(self) -> None:
        self.waiting: list[tuple] = []
        self.ready: list[tuple] = []

    def __bool__(self) -> bool:
        return bool(self.waiting or self.ready)

    def push(self, entry: tuple, now: float) -> None:
        if entry[0] <= now:
            t, key, a, i = entry
            heapq.heappush(self.ready, (key, t, a, i))
        else:
            heapq.heappush(self.waiting, entry)

    def best(self, now: float, fits=None) -> tuple | None:
        """The highest-priority entry that can start at ``now``, else the earliest one."""
        waiting, ready = self.waiting, self.ready
        while waiting and waiting[0][0] <= now:
            t, key, a, i = heapq.heappop(waiting)
            heapq.heappush(ready, (key, t, a, i))
        if ready:
            key, t, a, i = ready[0]
            return t, key, a, i
        return waiting[0] if waiting else None

    def remove(self, entry: tuple) -> None:
        """Remove ``entry``, the last one :meth:`best` returned (a heap top)."""
        if self.ready and self.ready[0][2] is entry[2]:
            heapq.heappop(self.ready)
        else:
            heapq.heappop(self.waiting)

    def computes(self) -> list[Compute]:
        return [e[2] for e in self.waiting] + [e[2] for e in self.ready]


class _ScannedQueue:
    """One rank's forward or backward queue, scanned: under a memory limit (which forwards may
    start depends on the rank's memory, not only on its clock) and for priority keys that are
    not tuples (the exhaustive search's keys decide only the comparisons it is asked)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple] = []  # a heap by start, then priority

    def __bool__(self) -> bool:
        return bool(self.entries)

    def push(self, entry: tuple, now: float) -> None:
        heapq.heappush(self.entries, entry)

    def best(self, now: float, fits=None) -> tuple | None:
        """The highest-priority entry (among those ``fits`` admits, by compute index) that can
        start at ``now``, else the earliest one."""
        # One pass, where filtering and two min() calls made three: ties go to the first
        # entry in heap order, as min() chose.
        first = chosen = None
        for e in self.entries:
            if fits is not None and not fits(e[3]):
                continue
            if first is None or e < first:
                first = e
            if e[0] <= now and (chosen is None or (e[1], e[0]) < (chosen[1], chosen[0])):
                chosen = e
        return first if chosen is None else chosen

    def remove(self, entry: tuple) -> None:
        self.entries.remove(entry)
        heapq.heapify(self.entries)

    def computes(self) -> list[Compute]:
        return [e[2] for e in self.entries]


def _interleave(
    placement, structure, flow, duration, p2p_time, priority, memory, caps, limits,
    kept, window,
) -> list[list[Compute]]:  # fmt: skip
    """One greedy pass; ``window``: forwards only of microbatches at most this far past the
    oldest one with a backward left (None: any).

    Raises:
        _MemoryDeadlock: under the hard limit, every rank waits and some forward waits for
            memory.
    """
    P = placement.num_ranks
    computes = flow.computes
    # The pass runs on indices into ``computes`` (hashing a Compute is a Python call): each
    # compute's rank, the computes it needs (kept: its start is the latest of their ends, plus
    # a hop) and those that need it, per microbatch piece (ids from 0, made once per piece)
    # plus the microbatch's first id, as the data flow lists the pieces one after another.
    rank_of: list[int] = []
    needs: list[tuple[int, ...]] = []
    dependents: list[tuple[int, ...]] = []
    backwards_left = []  # per microbatch, its backwards not placed yet
    for piece in flow_pieces(placement, structure):
        ranks, p_needs, p_dependents = _piece_graph(placement, piece)
        base = len(rank_of)
        rank_of.extend(ranks)
        if base:
            needs.extend([tuple([base + d for d in deps]) for deps in p_needs])
            dependents.extend([tuple([base + d for d in deps]) for deps in p_dependents])
        else:
            needs.extend(p_needs)
            dependents.extend(p_dependents)
        backwards_left.append(len(ranks) // 2)  # F/B pairs
    missing = [len(deps) for deps in needs]
    end = [0.0] * len(computes)
    # Per rank and kind, a queue of (earliest start, priority, compute); the first compute's
    # key picks the queue kind (every key of one priority function has one type).
    first = next((a for i, a in enumerate(computes) if missing[i] == 0), None)
    indexed = limits is None and first is not None and type(priority(first)) is tuple
    queue = _IndexedQueue if indexed else _ScannedQueue
    queues: list[dict[Kind, _IndexedQueue | _ScannedQueue]] = [
        {Kind.F: queue(), Kind.B: queue()} for _ in range(P)
    ]
    t_last = [0.0] * P
    last_kind: list[Kind | None] = [None] * P
    used = [0.0] * P
    order: list[list[Compute]] = [[] for _ in range(P)]
    oldest = 0  # the oldest microbatch with a backward left

    def fits(r: int, i: int) -> bool:
        """Whether the forward ``computes[i]`` may run on rank ``r`` under the hard limit."""
        if window is not None and computes[i].microbatch > oldest + window:
            return False
        return limits[r] is None or used[r] + kept[i] <= limits[r]

    def push(i: int, t: float) -> None:
        # (start, priority, compute, index): the index is never compared (computes differ).
        a = computes[i]
        r = rank_of[i]
        queues[r][a.kind].push((t, priority(a), a, i), t_last[r])

    for i in range(len(computes)):
        if missing[i] == 0:
            push(i, 0.0)

    F, B = Kind.F, Kind.B

    def candidates(r: int) -> tuple | None:
        """``(start, forward, backward)``: when rank ``r`` can start its next compute, and the
        queues' best entries it chooses from (None for a queue it may not or cannot use): each
        queue's highest-priority compute that can start at the rank's clock, else its earliest
        (the forwards only among those that fit, under a hard limit)."""
        now = t_last[r]
        rank_queues = queues[r]
        backwards = rank_queues[B]
        if caps is not None and used[r] > caps[r] and backwards:
            fw = None  # throttled
        elif limits is not None:
            fw = rank_queues[F].best(now, lambda i: fits(r, i))
        else:
            fw = rank_queues[F].best(now)
        bw = backwards.best(now)
        if fw is None:
            if bw is None:
                return None
            first = bw[0]
        elif bw is None or fw[0] <= bw[0]:
            first = fw[0]
        else:
            first = bw[0]
        return (first if first > now else now), fw, bw

    # A rank's candidates change only when its queues, clock or memory do: they are kept
    # between steps, except under a hard limit (the window moves with every backward).
    cached: list[tuple | None] = [None] * P
    stale = set(range(P))
    with_memory = memory is not Memory.NONE
    placed = 0
    total = len(computes)
    while placed < total:
        if limits is not None:
            stale.update(range(P))
        for r in stale:
            cached[r] = candidates(r)
        stale.clear()
        # The rank that can start a compute soonest (the lowest such rank on ties).
        choice = None
        for r in range(P):
            c = cached[r]
            if c is not None and (choice is None or c[0] < choice[0][0]):
                choice = (c, r)
        if choice is None and limits is not None:
            _raise_memory_deadlock(queues, used, limits, kept)
        if choice is None:
            raise ScheduleError(
                "greedy interleaving: no compute is ready; the data flow has a cycle"
            )
        (start, fw, bw), r = choice
        stale.add(r)
        now = t_last[r]
        if fw is None:
            entry = bw
        elif bw is None:
            entry = fw
        elif fw[0] <= now and bw[0] <= now:
            entry = bw if last_kind[r] is F else fw
        else:  # the one that can start first; on a tie, the higher priority (min's choice)
            entry = bw if (bw[0], bw[1]) < (fw[0], fw[1]) else fw
        a, i = entry[2], entry[3]
        kind = a.kind
        queues[r][kind].remove(entry)
        begin = entry[0] if entry[0] > now else now  # max(now, start), without the call
        finish = begin + float(duration(a))
        end[i] = finish
        t_last[r] = finish
        last_kind[r] = kind
        order[r].append(a.with_memory(memory) if with_memory else a)
        if kept is not None:
            used[r] += kept[i] if kind is F else -kept[i]
        if kind is B:
            backwards_left[a.microbatch] -= 1
            while oldest < len(backwards_left) and backwards_left[oldest] == 0:
                oldest += 1
        placed += 1
        for d in dependents[i]:
            missing[d] -= 1
            if missing[d] == 0:
                # Ready when its last input has arrived (max of ends plus hops, without calls).
                t = 0.0
                rd = rank_of[d]
                for pr in needs[d]:
                    arrival = end[pr] + p2p_time if rank_of[pr] != rd else end[pr]
                    if arrival > t:
                        t = arrival
                push(d, t)
                stale.add(rd)
    return order


def _piece_graph(placement: Placement, piece: FlowPiece) -> tuple:
    """``(ranks, needs, dependents)`` of one microbatch's piece, with ids from 0: per compute,
    its rank, its :func:`pipeweaver.dataflow.dependencies` (the F of a B is its neighbour
    before it: pieces list each F/B pair side by side, F first) and the computes that depend on
    it, in id order (made once per piece: every step that shares it reuses them)."""
    got = piece.derived.get("interleave")
    if got is not None:
        return got
    computes = piece.computes
    index = {a: i for i, a in enumerate(computes)}
    ranks = tuple(placement.rank_of(a.module, a.chunk) for a in computes)
    needs = []
    for i, a in enumerate(computes):
        producers = [index[p] for p, _ in piece.inputs[a]]
        if a.kind is Kind.B:
            producers.insert(0, i - 1)
        needs.append(tuple(producers))
    dependents: list[list[int]] = [[] for _ in computes]
    for i, deps in enumerate(needs):
        for d in deps:
            dependents[d].append(i)
    got = piece.derived["interleave"] = (ranks, tuple(needs), tuple(map(tuple, dependents)))
    return got


def _per_rank(value, num_ranks: int, name: str) -> list:
    """One value per rank from one for all (a number or None) or a sequence of them."""
    if value is None or isinstance(value, (int, float)):
        return [value] * num_ranks
    values = list(value)
    if len(values) != num_ranks:
        raise ScheduleError(f"{name} has {len(values)} values for {num_ranks} ranks")
    return values


def _raise_memory_deadlock(queues, used, limits, kept) -> None:
    """No rank can start anything and some forward waits for memory: no backward can come
    (every pending backward waits, directly or through other ranks, on a blocked forward).
    ``kept``: per compute index, its pair's bytes (the queues are scanned ones: a limit)."""
    for r, q in enumerate(queues):
        waiting = q[Kind.F].entries
        if not waiting or limits[r] is None:
            continue
        smallest = min(waiting, key=lambda e: kept[e[3]])
        a, own = smallest[2], kept[smallest[3]]
        need = used[r] + own
        if need <= limits[r]:
            continue  # waits for its microbatch's turn, not for memory
        raise _MemoryDeadlock(
            f"the forward needs {need:.0f} bytes of activations ({used[r]:.0f} kept plus "
            f"{own:.0f} of its own), over the rank's memory limit of "
            f"{limits[r]:.0f} bytes, and no backward can free memory: the schedule cannot "
            f"fit under the limit in this order",
            r,
            a,
        )

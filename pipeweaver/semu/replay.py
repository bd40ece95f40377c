# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The event-driven replay of one pipeline: compiled per-rank programs in, a timeline out.

The simulator (:mod:`pipeweaver.semu.simulator`) compiles each rank's action list into a
program of op tuples with integer ids from a :class:`~pipeweaver.transfers.TransferGraph`:

* compute: ``(COMPUTE, action, seconds, kept bytes, transient bytes, is forward, id of its F,
  transfers it waits for, transfers it sends, its name on the timeline)``; the transfers are
  filled for compute-only schedules, whose sends and receives are implicit (a send leaves when
  its producer ends);
* send: ``(SEND, transfer, link, occupancy, latency, host seconds)``: the rank spends the host
  seconds posting it, then it leaves;
* receive: ``(RECV, transfer, host seconds)``: the rank waits for the arrival, then spends the
  host seconds returning from the wait;
* host: ``(HOST, seconds, name, ready)``: the rank's host is busy (posting receives ahead,
  waiting its sends); ``name`` is its timer's (``recv-post``), or None for a pipeline wait;
  ``ready`` (receive posts only, else empty) lists the posted receives as ``(transfer, sender)``.

A receive posted after its tensor was sent starts the transfer there and then: the gloo threads
the post wakes need a core, and where the sender shares the poster's host and computes at that
moment (both ranks of a 2-core host busy) they take it from the poster (traced on this CPU,
README "The runtime's transfers as a running step pays them"). Each such post costs
``ready_extra`` seconds more than a post ahead of its tensor (``recv_post_ready_s`` of a
calibration; 0 where it has none, as on GPUs, whose ranks do not compute on the host's cores).

With ``record``, the host seconds of posting (``recv-post``, ``send-post``) are events of
category ``host``, as the runtime's timers count them; a wait's are not (its timers count them
with the wait).

A rank runs until it needs a tensor that has not been sent yet, then parks on that tensor;
sending it wakes the rank up. A transfer occupies its directed link for its occupancy in FIFO
order and arrives ``latency`` after it leaves the link.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Callable, Sequence

from pipeweaver.ir import Action, Compute, ScheduleError
from pipeweaver.semu.results import Event, PipelineResult
from pipeweaver.transfers import TransferGraph

COMPUTE, SEND, RECV, HOST = 0, 1, 2, 3
"""Op codes of a compiled program."""


def posted_receives(actions: Sequence, at_step_start: bool = False) -> list[list[int]]:
    """Per action, the indices of the receives the runtime posts right before it: every
    receive not posted yet up to the next send after it (``pipeweaver.runtime.executor``'s
    posting rule), or, ``at_step_start``, every receive before the first action."""
    n = len(actions)
    if at_step_start:
        every = [i for i, a in enumerate(actions) if type(a) is not Compute and not a.is_send]
        return [every] + [[] for _ in range(n - 1)] if n else []
    next_send = [n] * (n + 1)  # next_send[i]: the first send at index >= i
    for i in range(n - 1, -1, -1):
        a = actions[i]
        next_send[i] = i if type(a) is not Compute and a.is_send else next_send[i + 1]
    posts: list[list[int]] = [[] for _ in range(n)]
    posted = 0
    for i in range(n):
        horizon = next_send[i + 1] if i + 1 < n else n
        while posted < horizon:
            a = actions[posted]
            if type(a) is not Compute and not a.is_send:
                posts[i].append(posted)
            posted += 1
    return posts


def receive_posts(actions: Sequence) -> list[int]:
    """Per action, how many receives the runtime posts right before it."""
    return [len(p) for p in posted_receives(actions)]


def receive_post_ops(
    actions: Sequence,
    seconds: float,
    edge_of: Callable[[Action], int],
    same_host: Sequence[bool] | None,
    at_step_start: bool = False,
) -> list[tuple | None]:
    """Per action, the host op that posts the receives the runtime posts right before it
    (``seconds`` each; :func:`posted_receives`), or None. With ``same_host`` (per peer:
    whether it shares the rank's host, hence its cores), the op lists the receives from such
    peers as ``(transfer, sender)``: the candidates for ``replay``'s ready posts."""
    ops: list[tuple | None] = []
    for posted in posted_receives(actions, at_step_start):
        if not posted:
            ops.append(None)
            continue
        ready = ()
        if same_host is not None:
            peers = [(j, actions[j].peer) for j in posted]
            ready = tuple((edge_of(actions[j]), q) for j, q in peers if same_host[q])
        ops.append((HOST, len(posted) * seconds, "recv-post", ready))
    return ops


def replay(
    programs: Sequence[Sequence[tuple]],
    actions: Sequence[Sequence[Action]],
    graph: TransferGraph,
    start: Sequence[float],
    record: bool,
    ready_extra: float = 0.0,
) -> PipelineResult:
    """Run every rank's program together.

    Args:
        programs: per rank, its compiled ops (module docstring).
        actions: per rank, the schedule's actions the ops were compiled from (for errors).
        graph: the ids the ops use.
        start: per rank, when it can start.
        record: keep the compute and posting intervals as events.
        ready_extra: seconds a receive post costs more when its tensor was sent already and
            its sender computes (module docstring).

    Raises:
        ScheduleError: the order deadlocks (no rank can progress).
    """
    n = len(programs)
    t = list(start)
    pos = [0] * n
    busy = [0.0] * n
    alive = [0.0] * n
    peak = [0.0] * n
    last_end = list(start)
    kept = [0.0] * graph.num_computes
    arrivals: list = [None] * graph.num_edges
    parked: dict = {}
    link_free: dict[tuple[int, int], float] = {}
    events: list[Event] = []
    ready = list(range(n - 1, -1, -1))
    # With ready_extra: when each transfer was sent, and each rank's compute intervals so far.
    sent_at: list = [None] * graph.num_edges if ready_extra else []
    spans: list[tuple[list[float], list[float]]] = [([], []) for _ in range(n)]

    queued = [True] * n  # in ``ready``: runnable, its timeline known up to t[q] only

    def computing(q: int, at: float) -> bool:
        """Whether rank ``q`` computes at ``at``. A rank that stopped before ``at`` and is not
        queued (parked on a tensor, or done) is idle then; the caller lets queued ranks
        behind ``at`` catch up first."""
        if t[q] <= at:
            return False
        begins, ends = spans[q]
        k = bisect_right(begins, at) - 1
        return k >= 0 and ends[k] > at

    def send(edge: int, link: tuple[int, int], occupancy: float, latency: float, at: float):
        """Put a transfer on its link at ``at`` (or when the link frees up); wake its reader."""
        if sent_at:
            sent_at[edge] = at
        s0 = link_free.get(link, 0.0)
        if at > s0:
            s0 = at
        link_free[link] = s0 + occupancy
        arrivals[edge] = s0 + occupancy + latency
        w = parked.pop(edge, None)
        if w is not None:
            ready.append(w)
            queued[w] = True

    while ready:
        r = ready.pop()
        queued[r] = False
        ops = programs[r]
        i = pos[r]
        tr = t[r]
        size = len(ops)
        while i < size:
            op = ops[i]
            code = op[0]
            if code == COMPUTE:
                _, a, dur, keep, transient, forward, pair, waits, sends, name = op
                begin = tr
                blocked = None
                for e in waits:
                    at = arrivals[e]
                    if at is None:
                        blocked = e
                        break
                    if at > begin:
                        begin = at
                if blocked is not None:
                    parked[blocked] = r
                    break
                end = begin + dur
                busy[r] += dur
                if forward:
                    kept[pair] = keep
                    alive[r] += keep
                    level = alive[r] + transient
                else:
                    level = alive[r] + transient
                    alive[r] -= kept[pair]
                    kept[pair] = 0.0
                if level > peak[r]:
                    peak[r] = level
                if sent_at:
                    spans[r][0].append(begin)
                    spans[r][1].append(end)
                for edge, link, occupancy, latency in sends:
                    send(edge, link, occupancy, latency, end)
                if record:
                    events.append(
                        Event(r, begin, end, name, "F" if forward else "B", a.module,
                              a.microbatch, a.chunk)  # fmt: skip
                    )
                tr = end
                last_end[r] = end
            elif code == SEND:
                if record and op[5]:
                    events.append(Event(r, tr, tr + op[5], "send-post", "host"))
                tr += op[5]
                send(op[1], op[2], op[3], op[4], tr)
            elif code == RECV:
                at = arrivals[op[1]]
                if at is None:
                    parked[op[1]] = r
                    break
                if at > tr:
                    tr = at
                tr += op[2]
            else:
                dur = op[1]
                if sent_at and op[3]:
                    behind = [q for _, q in op[3] if queued[q] and t[q] < tr]
                    if behind:  # a sender may still send, or compute, before tr: it runs first
                        ready.append(r)
                        queued[r] = True
                        for q in dict.fromkeys(behind):
                            ready.remove(q)
                            ready.append(q)
                        break
                    dur += ready_extra * sum(
                        1
                        for e, src in op[3]
                        if sent_at[e] is not None and sent_at[e] <= tr and computing(src, tr)
                    )
                if record and op[2] is not None:
                    events.append(Event(r, tr, tr + dur, op[2], "host"))
                tr += dur
            i += 1
        pos[r] = i
        t[r] = tr
        if i == size and tr > last_end[r]:
            last_end[r] = tr  # host work after the last compute (posting sends, waiting them)
    if any(pos[r] < len(programs[r]) for r in range(n)):
        r0 = next(r for r in range(n) if pos[r] < len(programs[r]))
        op = programs[r0][pos[r0]]
        raise ScheduleError(
            "the simulation cannot progress: every unfinished rank waits for a tensor "
            "no rank will send (run pipeweaver.checker.check first)",
            r0,
            pos[r0],
            op[1] if op[0] == COMPUTE else actions[r0][pos[r0]],
        )
    return PipelineResult(
        makespan=max(last_end),
        start=list(start),
        rank_end=last_end,
        busy=busy,
        peak_activation=peak,
        events=events,
    )

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Test oracle: pipeweaver.checker as it was before issue 13 made it incremental (queues
scanned, every input listed); tests/pipeweaver/test_fast_paths.py asserts that
``pipeweaver.checker.check`` gives exactly what this one gives. Not part of the product.

The static checker: every schedule is validated before it runs (or is simulated).

Execution model (what :mod:`pipeweaver.runtime` implements, and what is checked here):

* each rank runs its action list strictly in order;
* a **send** is an ``isend``: it is issued when reached and never blocks the rank; its buffer
  stays alive until the transfer completes;
* a **receive** marks where the rank *waits* for the tensor; the runtime posts the matching
  ``irecv`` ahead of time (at the latest when the rank issues its preceding send), so a send
  never waits for its receiver to arrive at the receive;
* between an ordered pair of ranks, transfers match in order: the k-th send from a to b carries
  the tensor of b's k-th receive from a (NCCL has no tags; gloo matches in order per tag).

With ``semantics="rendezvous"`` a send also blocks until its peer reaches the matching
receive, which is what a runtime without posted-ahead receives would do; schedules from
:func:`pipeweaver.lowering.lower` are only guaranteed to pass the default ``"async"`` model.

Checks, in order; the first failure raises :class:`ScheduleError` naming the rank, the index
and the string of the offending action:

1. every compute exists in this placement and structure, runs on the rank that holds its chunk,
   exactly once; every compute is present; both halves of an F/B pair carry the same memory
   strategy;
2. every send follows the compute that produces its tensor, goes to the rank of a consumer of
   that tensor, and every receive comes from the producer's rank to a consumer's rank;
3. every compute's inputs are available: same-rank producers earlier in the list, remote ones
   through an earlier matching receive;
4. every send has exactly one matching receive on its peer and vice versa, in the same order;
5. the order cannot deadlock: all ranks are replayed together under the model above;
6. optionally, the activation memory of each rank stays under a cap.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

from pipeweaver.dataflow import all_computes, consumers, data_inputs
from pipeweaver.ir import Comm, Compute, Kind, ScheduleError
from pipeweaver.schedule import Schedule

__all__ = ["CheckReport", "ScheduleError", "check"]


@dataclass
class CheckReport:
    """What the checker learnt about a valid schedule."""

    num_actions: int
    """Actions over all ranks."""

    rounds: int
    """Rounds of the deadlock replay (a rough measure of how serial the schedule is)."""

    peak_activation_bytes: list[int] = field(default_factory=list)
    """Per rank, the peak of activation bytes kept for backward (when a cost was given)."""


def check(
    schedule: Schedule,
    *,
    memory_cap: int | Sequence[int] | None = None,
    activation_bytes: Callable[[Compute], int] | None = None,
    static_bytes: Sequence[int] | None = None,
    semantics: Literal["async", "rendezvous"] = "async",
) -> CheckReport:
    """Validate a lowered schedule.

    Args:
        schedule: the schedule, with its communication actions.
        memory_cap: bytes per rank (one value for all, or one per rank); None skips check 6.
        activation_bytes: bytes an F/B pair keeps from its F to its B, given the F (with its memory
            strategy); required with ``memory_cap``.
        static_bytes: bytes always resident per rank (weights, gradients, optimizer states),
            counted against the cap; default 0.
        semantics: ``"async"`` (the runtime's) or ``"rendezvous"`` (sends block too).

    Returns:
        A report with the replay's figures.

    Raises:
        ScheduleError: the first offending action, with its rank, index and string.
    """
    placement, structure = schedule.placement, schedule.structure
    ranks = schedule.actions

    # 1. computes: valid, placed, unique, complete; memory strategies paired.
    seen: dict[Compute, tuple[int, int, Compute]] = {}
    for r, actions in enumerate(ranks):
        for i, a in enumerate(actions):
            if not isinstance(a, Compute):
                continue
            try:
                data_inputs(a, placement, structure)
            except ScheduleError as e:
                raise ScheduleError(str(e).split(": ", 1)[-1], r, i, a) from None
            home = placement.rank_of(a.module, a.chunk)
            if home != r:
                raise ScheduleError(
                    f"{a.module} chunk {a.chunk} is placed on rank {home}, not here", r, i, a
                )
            if a.key in seen:
                pr, pi, _ = seen[a.key]
                raise ScheduleError(f"the compute already ran at rank {pr} action {pi}", r, i, a)
            seen[a.key] = (r, i, a)
    for compute in all_computes(placement, structure):
        if compute not in seen:
            raise ScheduleError(
                "missing: the step needs this compute but no rank runs it",
                placement.rank_of(compute.module, compute.chunk),
                None,
                compute,
            )
    for key, (r, i, a) in seen.items():
        if a.kind is Kind.B:
            f = seen[key.partner()][2]
            if f.memory is not a.memory or f.recompute_layers != a.recompute_layers:
                raise ScheduleError(
                    f"its forward {f} uses memory strategy {f.strategy}, this backward "
                    f"{a.strategy}; an F/B pair uses one strategy",
                    r,
                    i,
                    a,
                )

    # 2. comms: valid endpoints, sends after their producer.
    for r, actions in enumerate(ranks):
        produced: set[Compute] = set()
        for i, a in enumerate(actions):
            if isinstance(a, Compute):
                produced.add(a.key)
                continue
            if a.peer == r or a.peer >= schedule.num_ranks:
                raise ScheduleError(f"peer {a.peer} is not another rank of the pipeline", r, i, a)
            try:
                cons = consumers(a.tensor, placement, structure)
            except ScheduleError as e:
                raise ScheduleError(str(e).split(": ", 1)[-1], r, i, a) from None
            producer_rank = placement.rank_of(a.tensor.module, a.tensor.chunk)
            consumer_ranks = {placement.rank_of(c.module, c.chunk) for c, p in cons if p == a.part}
            if not consumer_ranks:
                raise ScheduleError(f"no compute consumes {a.tensor} part {a.part}", r, i, a)
            if a.is_send:
                if producer_rank != r:
                    raise ScheduleError(
                        f"{a.tensor} is produced on rank {producer_rank}, not here", r, i, a
                    )
                if a.tensor not in produced:
                    raise ScheduleError(
                        f"sends {a.tensor} before the compute that produces it", r, i, a
                    )
                if a.peer not in consumer_ranks:
                    raise ScheduleError(
                        f"rank {a.peer} does not consume it (consumers on ranks "
                        f"{sorted(consumer_ranks)})",
                        r,
                        i,
                        a,
                    )
            else:
                if producer_rank != a.peer:
                    raise ScheduleError(
                        f"{a.tensor} is produced on rank {producer_rank}, not on rank {a.peer}",
                        r,
                        i,
                        a,
                    )
                if r not in consumer_ranks:
                    raise ScheduleError("no compute on this rank consumes it", r, i, a)

    # 3. inputs available before each compute.
    for r, actions in enumerate(ranks):
        have: set = set()  # computes run here, and (tensor, part) received here
        for i, a in enumerate(actions):
            if isinstance(a, Comm):
                if not a.is_send:
                    have.add(a.edge)
                continue
            if a.kind is Kind.B and a.key.partner() not in have:
                raise ScheduleError(f"runs before its forward {a.key.partner()}", r, i, a)
            for producer, part in data_inputs(a, placement, structure):
                home = placement.rank_of(producer.module, producer.chunk)
                if home == r:
                    if producer not in have:
                        raise ScheduleError(
                            f"runs before {producer}, which it needs (same rank)", r, i, a
                        )
                elif (producer, part) not in have:
                    what = f"{producer}" + ("" if part is None else f" part {part[0]}.{part[1]}")
                    raise ScheduleError(
                        f"needs {what} from rank {home} but no receive of it precedes it", r, i, a
                    )
            have.add(a.key)

    # 4. matching sends and receives, in order per ordered pair.
    sends: dict[tuple[int, int], list[tuple[int, Comm]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[int, Comm]]] = defaultdict(list)
    for r, actions in enumerate(ranks):
        for i, a in enumerate(actions):
            if isinstance(a, Comm):
                if a.is_send:
                    sends[(r, a.peer)].append((i, a))
                else:
                    recvs[(a.peer, r)].append((i, a))
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        s_list, r_list = sends.get(pair, []), recvs.get(pair, [])
        s_edges = Counter(a.edge for _, a in s_list)
        r_edges = Counter(a.edge for _, a in r_list)
        for i, a in s_list:
            if s_edges[a.edge] > 1:
                raise ScheduleError(f"the tensor is sent to rank {dst} twice", src, i, a)
            if a.edge not in r_edges:
                raise ScheduleError(f"no matching receive on rank {dst}", src, i, a)
        for i, a in r_list:
            if r_edges[a.edge] > 1:
                raise ScheduleError(f"the tensor is received from rank {src} twice", dst, i, a)
            if a.edge not in s_edges:
                raise ScheduleError(f"no matching send on rank {src}", dst, i, a)
        for k, ((si, s), (ri, rc)) in enumerate(zip(s_list, r_list)):
            if s.edge != rc.edge:
                raise ScheduleError(
                    f"send number {k} from rank {src} to rank {dst} but rank {dst}'s receive "
                    f"number {k} from rank {src} is '{rc}' (action {ri}); transfers between "
                    f"two ranks match in order",
                    src,
                    si,
                    s,
                )

    # 5. deadlock replay.
    rounds = _replay(ranks, semantics)

    # 6. memory.
    report = CheckReport(num_actions=sum(len(a) for a in ranks), rounds=rounds)
    if activation_bytes is not None or memory_cap is not None:
        if activation_bytes is None:
            raise ValueError("memory_cap needs activation_bytes")
        caps = (
            [memory_cap] * schedule.num_ranks
            if isinstance(memory_cap, (int, float)) or memory_cap is None
            else list(memory_cap)
        )
        static = list(static_bytes) if static_bytes is not None else [0] * schedule.num_ranks
        for r, actions in enumerate(ranks):
            alive = 0
            peak = 0
            kept: dict[Compute, int] = {}
            for i, a in enumerate(actions):
                if not isinstance(a, Compute):
                    continue
                if a.kind is Kind.F:
                    kept[a.key] = int(activation_bytes(a))
                    alive += kept[a.key]
                    peak = max(peak, alive)
                    if caps[r] is not None and static[r] + alive > caps[r]:
                        raise ScheduleError(
                            f"activation memory reaches {static[r] + alive} bytes (static "
                            f"{static[r]}), over the cap of {caps[r]}",
                            r,
                            i,
                            a,
                        )
                else:
                    alive -= kept.pop(a.key.partner(), 0)
            report.peak_activation_bytes.append(peak)
    return report


def _replay(ranks: Sequence[Sequence], semantics: str) -> int:
    """Run every rank's list together; raise on a deadlock. Returns the number of rounds."""
    n = len(ranks)
    pos = [0] * n
    issued: set[tuple[int, int, object]] = set()  # (src, dst, edge) sends issued
    rounds = 0
    while True:
        rounds += 1
        progress = False
        for r in range(n):
            actions = ranks[r]
            while pos[r] < len(actions):
                a = actions[pos[r]]
                if isinstance(a, Comm):
                    if a.is_send:
                        if semantics == "rendezvous":
                            peer_pos = pos[a.peer]
                            peer = ranks[a.peer]
                            at = peer[peer_pos] if peer_pos < len(peer) else None
                            if not (
                                isinstance(at, Comm)
                                and not at.is_send
                                and at.peer == r
                                and at.edge == a.edge
                            ):
                                break
                            # Both sides complete together.
                            pos[a.peer] += 1
                        issued.add((r, a.peer, a.edge))
                    else:
                        if (a.peer, r, a.edge) not in issued:
                            break
                pos[r] += 1
                progress = True
        if all(pos[r] >= len(ranks[r]) for r in range(n)):
            return rounds
        if not progress:
            break
    # Deadlock: report the blocked action of the lowest rank, with the wait chain.
    blocked = [r for r in range(n) if pos[r] < len(ranks[r])]
    chain = []
    r = blocked[0]
    visited = []
    while r not in visited and pos[r] < len(ranks[r]):
        visited.append(r)
        a = ranks[r][pos[r]]
        chain.append(f"rank {r} at action {pos[r]} '{a}'")
        r = a.peer if isinstance(a, Comm) else r
    r0 = blocked[0]
    raise ScheduleError(
        "deadlock: every unfinished rank waits on another: " + " -> ".join(chain),
        r0,
        pos[r0],
        ranks[r0][pos[r0]],
    )

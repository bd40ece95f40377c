# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Random schedules for testing: valid ones any runtime must run, invalid ones any checker must
reject.

A valid schedule is a random topological order of the step's computes (a random ready compute
of a random rank at every step, with a random memory strategy per F/B pair), lowered. Executing
that global order one action at a time is always possible, so it is free of deadlock.

An invalid one is a valid schedule with one mutation that certainly breaks it: a missing
receive or send, a compute run twice, a backward before its forward, two transfers to the same
peer swapped, or a send moved after a receive that (transitively) needs it: a cyclic wait.
"""

from __future__ import annotations

import random
from typing import Sequence

from pipeweaver.dataflow import MicrobatchStructure, all_computes, dependencies, dependency_graph
from pipeweaver.ir import Action, Comm, Compute, Kind, Memory
from pipeweaver.lowering import lower
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule

MUTATIONS: tuple[str, ...] = (
    "drop-recv",
    "drop-send",
    "duplicate-compute",
    "backward-first",
    "swap-sends",
    "cyclic-wait",
)
"""Kinds of :func:`random_invalid_schedule` mutations."""


def random_valid_schedule(
    placement: Placement,
    structure: MicrobatchStructure,
    rng: random.Random,
    memories: Sequence[Memory] = (Memory.NONE, Memory.RECOMPUTE),
) -> Schedule:
    """A random valid, lowered schedule; each F/B pair gets one of ``memories`` (with
    :attr:`Memory.LAYERS`, a random count of its chunk's first layers: 1 to all but one)."""
    computes = list(all_computes(placement, structure))
    memory = {}
    for a in computes:
        if a.kind is Kind.F:
            m = rng.choice(memories)
            n = 0
            if m is Memory.LAYERS:
                start, stop = placement.layer_range(a.module, a.chunk)
                n = rng.randint(1, max(1, stop - start - 1))
            memory[a] = (m, n)
    missing, dependents = dependency_graph(computes, placement, structure)
    ready = [[] for _ in range(placement.num_ranks)]
    for a in computes:
        if missing[a] == 0:
            ready[placement.rank_of(a.module, a.chunk)].append(a)
    order: list[list[Compute]] = [[] for _ in range(placement.num_ranks)]
    for _ in range(len(computes)):
        r = rng.choice([r for r in range(placement.num_ranks) if ready[r]])
        a = ready[r].pop(rng.randrange(len(ready[r])))
        f = a if a.kind is Kind.F else a.partner()
        order[r].append(a.with_memory(*memory[f]))
        for d in dependents[a]:
            missing[d] -= 1
            if missing[d] == 0:
                ready[placement.rank_of(d.module, d.chunk)].append(d)
    return lower(Schedule(placement, structure, tuple(tuple(o) for o in order), "fuzz"))


def _depends_on(compute: Compute, target: Compute, placement, structure, memo: dict) -> bool:
    """Whether ``compute`` needs ``target`` finished, directly or transitively."""
    key = compute.key
    if key in memo:
        return memo[key]
    memo[key] = False
    found = any(
        d == target or _depends_on(d, target, placement, structure, memo)
        for d in dependencies(key, placement, structure)
    )
    memo[key] = found
    return found


def random_invalid_schedule(
    placement: Placement,
    structure: MicrobatchStructure,
    rng: random.Random,
    mutation: str | None = None,
) -> tuple[Schedule, str]:
    """A valid random schedule with one breaking mutation; returns it and the mutation's name.

    Falls back to another mutation when the drawn one does not apply to the schedule (e.g. no
    two sends to the same peer to swap).
    """
    base = random_valid_schedule(placement, structure, rng)
    kinds = [mutation] if mutation else list(MUTATIONS)
    rng.shuffle(kinds)
    for kind in [*kinds, *MUTATIONS]:
        ranks = [list(a) for a in base.actions]
        if _mutate(kind, ranks, placement, structure, rng):
            return Schedule(placement, structure, tuple(tuple(a) for a in ranks), kind), kind
    raise ValueError("no mutation applies to this schedule")


def _mutate(kind: str, ranks: list[list[Action]], placement, structure, rng) -> bool:
    where = [(r, i, a) for r, acts in enumerate(ranks) for i, a in enumerate(acts)]
    comms = [(r, i, a) for r, i, a in where if isinstance(a, Comm)]
    if kind in ("drop-recv", "drop-send"):
        pool = [(r, i) for r, i, a in comms if a.is_send == (kind == "drop-send")]
        if not pool:
            return False
        r, i = rng.choice(pool)
        del ranks[r][i]
        return True
    if kind == "duplicate-compute":
        r, i, a = rng.choice([(r, i, a) for r, i, a in where if isinstance(a, Compute)])
        ranks[r].insert(rng.randrange(len(ranks[r]) + 1), a)
        return True
    if kind == "backward-first":
        r, i, a = rng.choice(
            [(r, i, a) for r, i, a in where if isinstance(a, Compute) and a.kind is Kind.B]
        )
        ranks[r].insert(0, ranks[r].pop(i))
        return True
    if kind == "swap-sends":
        pairs = []
        for r, acts in enumerate(ranks):
            sends = [(i, a) for i, a in enumerate(acts) if isinstance(a, Comm) and a.is_send]
            for x in range(len(sends)):
                for y in range(x + 1, len(sends)):
                    if (
                        sends[x][1].peer == sends[y][1].peer
                        and sends[x][1].edge != sends[y][1].edge
                    ):
                        pairs.append((r, sends[x][0], sends[y][0]))
        if not pairs:
            return False
        r, i, j = rng.choice(pairs)
        ranks[r][i], ranks[r][j] = ranks[r][j], ranks[r][i]
        return True
    if kind == "cyclic-wait":
        candidates = []
        for r, acts in enumerate(ranks):
            for i, send in enumerate(acts):
                if not (isinstance(send, Comm) and send.is_send):
                    continue
                memo: dict = {}
                for j in range(i + 1, len(acts)):
                    recv = acts[j]
                    if (
                        isinstance(recv, Comm)
                        and not recv.is_send
                        and _depends_on(recv.tensor, send.tensor, placement, structure, memo)
                    ):
                        candidates.append((r, i, j))
                        break
        if not candidates:
            return False
        r, i, j = rng.choice(candidates)
        ranks[r].insert(j, ranks[r].pop(i))  # the send now waits behind what it feeds
        return True
    raise ValueError(f"unknown mutation {kind!r}")

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The exact optimum over priority orders, for small instances: the oracle of the MCTS tests.

Enumerating all orders is hopeless beyond a handful of groups (8 forward and 8 backward groups
make 1.6e9 orders), but most orders give the same schedule: the greedy interleaver only
compares the priorities of computes that wait in the same queue, and a schedule is fixed by
the outcomes of the comparisons it makes. So the enumeration runs phase 2 with priorities
that *ask*: the first time two groups are compared whose relative order is not yet decided,
the run stops and the enumeration branches on both outcomes (kept as a transitively closed
partial order). Every run that completes is one class of orders with one schedule; a linear
extension of its partial order (in canonical form) is a representative, and is scored by
the same :class:`~pipeweaver.search.mcts.OrderEvaluator` as the search. Every total order
falls into exactly one class, so the best representative is the optimum over all orders.

:func:`brute_force_best` enumerates the orders themselves, to check this on tiny instances.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

from pipeweaver.ir import Compute, Kind
from pipeweaver.search.mcts import Indices, OrderEvaluator
from pipeweaver.search.segments import SegmentGroup, SegmentSpace, group_of


@dataclass(frozen=True, slots=True)
class ExhaustiveResult:
    """The optimum over every priority order of a step's segment groups."""

    order: tuple[SegmentGroup, ...]
    """A best order (canonical: forward and backward groups alternate)."""

    step_time_s: float
    """Its predicted time."""

    classes: int
    """Distinct comparison outcomes enumerated (one schedule each, often fewer distinct)."""

    runs: int
    """Phase-2 runs, stopped ones included."""


class _Undecided(Exception):
    """Phase 2 compared two groups whose order the current branch has not fixed."""

    def __init__(self, a: int, b: int):
        super().__init__(a, b)
        self.a, self.b = a, b


class _AskingKey:
    """A priority key whose comparisons across groups consult the branch's partial order."""

    __slots__ = ("group", "forward", "rest", "less")

    def __init__(self, group: int, forward: bool, rest: tuple[int, int], less: frozenset):
        self.group, self.forward, self.rest, self.less = group, forward, rest, less

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _AskingKey) and self.group == other.group and self.rest == other.rest
        )

    def __hash__(self) -> int:
        return hash((self.group, self.rest))

    def __lt__(self, other: "_AskingKey") -> bool:
        if self.group == other.group:
            return self.rest < other.rest
        if self.forward != other.forward:
            return self.forward  # canonical orders put every forward group first
        if (self.group, other.group) in self.less:
            return True
        if (other.group, self.group) in self.less:
            return False
        raise _Undecided(self.group, other.group)

    def __gt__(self, other: "_AskingKey") -> bool:
        return other < self


def _with(less: frozenset, a: int, b: int, n: int) -> frozenset:
    """``less`` plus ``a < b``, transitively closed."""
    below = [x for x in range(n) if (x, a) in less] + [a]
    above = [y for y in range(n) if (b, y) in less] + [b]
    return less | {(x, y) for x in below for y in above}


def _extension(less: frozenset, space: SegmentSpace) -> Indices:
    """The canonical order of a linear extension of a partial order (lowest index on ties)."""
    n, nf = len(space), space.num_forward
    kinds = []
    for lo, hi in ((0, nf), (nf, n)):
        seq: list[int] = []
        left = set(range(lo, hi))
        while left:
            i = min(x for x in left if not any((y, x) in less for y in left))
            seq.append(i)
            left.remove(i)
        kinds.append(seq)
    return space.merge(*kinds)


def exhaustive_best(evaluator: OrderEvaluator, max_runs: int = 200_000) -> ExhaustiveResult:
    """The optimum over all priority orders of the evaluator's step (see the module docstring).

    Args:
        evaluator: phase 2, phase 3 and the score (the one the search uses).
        max_runs: give up beyond this many phase-2 runs.

    Raises:
        RuntimeError: the enumeration needs more than ``max_runs`` runs (instance too big).
    """
    space = evaluator.space
    n, nf = len(space), space.num_forward
    index = space.index
    best: tuple[float, Indices] | None = None
    classes = runs = 0
    stack: list[frozenset] = [frozenset()]
    while stack:
        less = stack.pop()
        runs += 1
        if runs > max_runs:
            raise RuntimeError(f"exhaustive enumeration: more than {max_runs} phase-2 runs")
        priority: Callable[[Compute], _AskingKey] = lambda a, less=less: _AskingKey(
            index[group_of(a)], a.kind is Kind.F, (a.sub, a.chunk), less
        )
        try:
            evaluator.interleave(priority)
        except _Undecided as u:
            stack.append(_with(less, u.b, u.a, n))
            stack.append(_with(less, u.a, u.b, n))
            continue
        classes += 1
        order = _extension(less, space)
        t = evaluator(order)
        if best is None or (t, order) < best:
            best = (t, order)
    # The default order stands for phase 2's default priority, which may differ on ties.
    default = space.default()
    best = min(best, (evaluator(default), default))
    return ExhaustiveResult(space.to_groups(best[1]), best[0], classes, runs)


def brute_force_best(evaluator: OrderEvaluator) -> tuple[float, Indices, int]:
    """The optimum by evaluating every canonical order (tiny instances only).

    Returns:
        ``(time, order, orders evaluated)``.
    """
    space = evaluator.space
    n, nf = len(space), space.num_forward
    if math.factorial(nf) * math.factorial(n - nf) > 100_000:
        raise RuntimeError(f"brute force over {nf}! x {n - nf}! orders is too many")
    best = None
    count = 0
    for fwd in itertools.permutations(range(nf)):
        for bwd in itertools.permutations(range(nf, n)):
            order = space.merge(fwd, bwd)
            count += 1
            t = evaluator(order)
            if best is None or (t, order) < best:
                best = (t, order)
    return best[0], best[1], count

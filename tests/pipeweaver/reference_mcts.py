# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Test oracle: :func:`pipeweaver.search.mcts.tree_search` as it was before the search got
worker processes (issue 12, item 5): one selection, expansion, rollout batch and
backpropagation per iteration. tests/pipeweaver/test_mcts_workers.py asserts that the wave loop
with one worker gives exactly what this one gives. Not part of the product.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pipeweaver.search.mcts import ALPHA, BETA, ROLLOUTS_PER_EXPANSION, Indices
from pipeweaver.search.segments import SegmentSpace


class _Node:
    """One node of the search tree: a prefix of the order."""

    __slots__ = ("parent", "prefix", "children", "untried", "visits", "best", "exhausted")

    def __init__(self, parent: "_Node | None", prefix: Indices, moves: list[int]):
        self.parent = parent
        self.prefix = prefix
        self.children: list[_Node] = []
        self.untried = moves
        self.visits = 0
        self.best = math.inf  # the best (lowest) objective below this node
        self.exhausted = False


@dataclass(frozen=True, slots=True)
class TreeOutcome:
    """The result of :func:`tree_search` (orders as indices)."""

    order: Indices
    """Best order found."""

    time_s: float
    """Its time."""

    first_time_s: float
    """The time of the first order evaluated (the greedy default)."""

    rollouts: int
    """Orders evaluated, the first included."""

    exhausted: bool
    """Whether the whole tree was enumerated."""


def tree_search(
    space: SegmentSpace,
    evaluate: Callable[[Indices], float],
    *,
    rollouts: int,
    seed: int,
    budget_ms: float | None = None,
    alpha: float = ALPHA,
    beta: float = BETA,
    rollouts_per_expansion: int = ROLLOUTS_PER_EXPANSION,
    maximize: bool = False,
    first: Indices | None = None,
) -> TreeOutcome:
    """MCTS over the canonical orders of ``space`` (see the module docstring).

    Args:
        space: the segment groups and the legal moves.
        evaluate: order (indices) -> seconds; should be cached by the caller.
        rollouts: orders to evaluate after ``first`` (0: only ``first``).
        seed: seed of the numpy generator behind expansions and rollouts.
        budget_ms: also stop after the rollout that crosses this many milliseconds.
        alpha: exponent of the normalised score.
        beta: weight of the exploration term.
        rollouts_per_expansion: random completions per expanded node.
        maximize: look for the slowest order instead (for benchmarks' worst case).
        first: the order evaluated first; default the greedy default order.
    """
    if rollouts < 0 or rollouts_per_expansion < 1:
        raise ValueError(
            f"rollouts must be >= 0 and rollouts_per_expansion >= 1, got {rollouts} and "
            f"{rollouts_per_expansion}"
        )
    t0 = time.perf_counter()
    deadline = None if budget_ms is None else t0 + budget_ms / 1e3
    rng = np.random.default_rng(seed)
    n, nf = len(space), space.num_forward
    sign = -1.0 if maximize else 1.0
    first = space.default() if first is None else tuple(first)
    first_time = float(evaluate(first))
    best_obj, best_order = sign * first_time, first
    lo = hi = best_obj  # the extremes of the objective seen, for the normalised score
    done = 1

    def complete(prefix: Indices) -> Indices:
        placed = set(prefix)
        fwd = [i for i in prefix if i < nf] + [
            int(i) for i in rng.permutation([i for i in range(nf) if i not in placed])
        ]
        bwd = [i for i in prefix if i >= nf] + [
            int(i) for i in rng.permutation([i for i in range(nf, n) if i not in placed])
        ]
        return space.merge(fwd, bwd)

    def out_of_budget() -> bool:
        return done >= rollouts + 1 or (deadline is not None and time.perf_counter() >= deadline)

    root = _Node(None, (), space.moves(()))
    if n == 0:
        root.exhausted = True
    while not root.exhausted and not out_of_budget():
        node = root
        # Selection: down through fully expanded nodes.
        while not node.untried:
            log_n = math.log(max(node.visits, 1))
            span = hi - lo
            choice, choice_value = None, -math.inf
            for child in node.children:
                if child.exhausted:
                    continue
                s = (hi - child.best) / span if span > 0 else 1.0
                value = s**alpha + beta * math.sqrt(log_n / child.visits)
                if value > choice_value:
                    choice, choice_value = child, value
            node = choice  # not None: a node whose children are all exhausted is exhausted
        # Expansion.
        move = node.untried.pop(int(rng.integers(len(node.untried))))
        prefix = node.prefix + (move,)
        child = _Node(node, prefix, space.moves(prefix) if len(prefix) < n else [])
        node.children.append(child)
        # Rollouts.
        batch_best, batch = math.inf, 0
        for _ in range(1 if len(prefix) == n else rollouts_per_expansion):
            order = prefix if len(prefix) == n else complete(prefix)
            obj = sign * float(evaluate(order))
            done += 1
            batch += 1
            lo, hi = min(lo, obj), max(hi, obj)
            if obj < best_obj:
                best_obj, best_order = obj, order
            batch_best = min(batch_best, obj)
            if out_of_budget():
                break
        child.exhausted = len(prefix) == n
        # Backpropagation.
        up = child
        while up is not None:
            up.visits += batch
            up.best = min(up.best, batch_best)
            if up.parent is not None and up.exhausted:
                parent = up.parent
                parent.exhausted = not parent.untried and all(c.exhausted for c in parent.children)
            up = up.parent
    return TreeOutcome(best_order, sign * best_obj, first_time, done, root.exhausted)

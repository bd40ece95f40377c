# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Phase 1 of the schedule search: Monte-Carlo tree search over segment-group priorities.

The search looks for the priority order of the step's segment groups
(:mod:`pipeweaver.search.segments`) whose schedule SEMU predicts fastest. An order is scored
by :class:`OrderEvaluator`: phase 2 (:func:`pipeweaver.interleave.greedy_dual_queue` with the
order as its priority), then the optional phase-3 hook ``refine(schedule) -> schedule`` (the
memory plan plugs in there), then SEMU's pipeline makespan. Scores are cached by order.

The tree: the root is the empty order; a node at depth d fixes the first d groups, and its
children append one more (forward and backward groups alternate, see :class:`SegmentSpace`).
Each iteration

1. **selects** from the root the child maximising ``s^alpha + beta * sqrt(ln N_parent /
   N_child)`` while the node has no untried move, skipping fully explored subtrees;
2. **expands** one untried move (chosen by the seeded generator);
3. runs ``rollouts_per_expansion`` **rollouts**: random completions of the new node's prefix,
   each evaluated;
4. **backpropagates** the visits and the best time up to the root.

The score of a node is its best time normalised over every time seen so far:
``s = (worst - best_node) / (worst - best)`` in [0, 1] (1 for the best node, 0 for the
worst). A relative normalisation keeps alpha and beta meaningful whether a step takes
milliseconds or seconds, and whether the orders differ by 1% or 50%; alpha > 1 would sharpen
the preference for the best subtrees. The defaults (alpha 1, beta 0.4, one rollout per
expansion) come from a small sweep on the test instances: greedier settings (alpha up to 8,
beta down to 0.05, or 4 rollouts per expansion) got stuck in a near-optimal subtree more often.

A subtree whose every complete order has been evaluated is *exhausted* and never selected
again; when the root is, the search has enumerated everything and stops: on small instances
it is then exact.

Workers: the search runs in *waves*. A wave makes up to ``workers`` selections and
expansions one after another, each under a virtual loss of the ones before it (a pending
rollout counts as a visit, and a node with only pending rollouts scores as the worst time
seen), so that they pick different nodes; then all their rollouts are evaluated together,
by worker processes (:class:`~pipeweaver.search.search_pool.SearchPool`, at most half the
host's cores) or in turn in this process, and backpropagated in selection order. With one
worker a wave is one iteration above.

Determinism: the tree, the generator and the backpropagation stay in this process and run in
a fixed order; only the evaluations are spread. With a rollout budget the result therefore
depends only on the inputs, the seed, the budget and ``workers`` (not on the processes'
timing, nor on the cache, nor on whether the waves are evaluated by a pool or in turn), so
every rank of a pipeline that runs the search finds the same schedule. With ``budget_ms``
the search also stops after the wave that crosses the time budget, and how many rollouts
that is depends on the machine and its load: the trainer uses rollout budgets where ranks
must agree. The greedy default order is always evaluated first and the best order is
returned, so the search is never worse than greedy (or, when maximising, never better).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure, all_computes
from pipeweaver.interleave import default_priority, greedy_dual_queue
from pipeweaver.ir import Compute, Kind, Memory, ScheduleError
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule
from pipeweaver.search.search_pool import SearchPool, cached_many, check_workers
from pipeweaver.search.segments import SegmentGroup, SegmentSpace, order_priority
from pipeweaver.semu.batches import MicrobatchMeta
from pipeweaver.semu.simulator import Semu

ALPHA: float = 1.0
"""Default exponent of the normalised score in the selection rule."""

BETA: float = 0.4
"""Default weight of the exploration term in the selection rule."""

ROLLOUTS_PER_EXPANSION: int = 1
"""Default random completions per expanded node (DIP uses about 10; fewer gives the tree more
expansions for the same budget)."""

Indices = tuple[int, ...]
"""An order as indices into :attr:`SegmentSpace.groups`."""


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What one schedule search found."""

    schedule: Schedule
    """The best order's schedule, lowered (it has passed :func:`pipeweaver.checker.check`)."""

    order: tuple[SegmentGroup, ...]
    """The best priority order of segment groups (canonical: forward and backward groups
    alternate)."""

    step_time_s: float
    """Its predicted time (SEMU's pipeline makespan, or the custom evaluation's)."""

    greedy_step_time_s: float
    """The predicted time of the greedy default order (:func:`default_priority`'s)."""

    rollouts: int
    """Orders evaluated by the search, greedy's included (repeats served from the cache
    count too)."""

    evaluations: int
    """Distinct orders evaluated (phase 2, phase 3 and SEMU run once for each)."""

    search_s: float
    """Wall seconds the search took."""

    exhausted: bool
    """Whether every order was evaluated (the result is then the exact optimum)."""

    workers: int = 1
    """Processes that scored the orders (nodes expanded per wave of the search)."""

    @property
    def speedup(self) -> float:
        """Greedy's predicted time over the search's (>= 1 when minimising)."""
        return self.greedy_step_time_s / self.step_time_s if self.step_time_s > 0 else 1.0


class _Durations:
    """Phase 2's compute durations, looked up by compute (picklable, unlike a closure)."""

    __slots__ = ("times",)

    def __init__(self, times: dict):
        self.times = times

    def __call__(self, a: Compute) -> float:
        return self.times[a.key]


class _KeptBytes:
    """Phase 2's kept bytes of each forward under its memory strategy, looked up by compute
    (picklable, unlike a closure)."""

    __slots__ = ("kept",)

    def __init__(self, kept: dict):
        self.kept = kept

    def __call__(self, a: Compute) -> float:
        return self.kept[a]


class OrderEvaluator:
    """Scores priority orders: phase 2, the phase-3 hook, then SEMU; cached by order.

    Args:
        placement: where each chunk lives.
        structure: microbatches and subs of the step.
        microbatches: one :class:`MicrobatchMeta` per microbatch (SEMU's view of them).
        semu: the simulator that scores a schedule and, by default, gives phase 2's durations.
            May be None when both ``duration`` and ``score`` are given.
        duration: phase 2's predicted time of a compute; default SEMU's compute time.
        p2p_time: phase 2's latency for an input from another rank.
        memory: memory strategy of every compute in phase 2.
        memory_cap: phase 2's activation bytes per rank above which a rank runs backwards
            only (with ``activation_bytes``; default SEMU's kept bytes).
        activation_bytes: bytes a forward keeps until its backward.
        memory_limit: phase 2's hard limit on kept activation bytes per rank (with
            ``activation_bytes``; see :func:`pipeweaver.interleave.greedy_dual_queue`).
        refine: phase 3, ``schedule -> schedule`` (None: none).
        score: ``schedule -> seconds`` replacing SEMU's pipeline makespan.
    """

    def __init__(
        self,
        placement: Placement,
        structure: MicrobatchStructure,
        microbatches: Sequence[MicrobatchMeta],
        semu: Semu | None,
        *,
        duration: Callable[[Compute], float] | None = None,
        p2p_time: float = 0.0,
        memory: Memory = Memory.NONE,
        memory_cap: float | Sequence[float] | None = None,
        activation_bytes: Callable[[Compute], float] | None = None,
        memory_limit: float | Sequence[float | None] | None = None,
        refine: Callable[[Schedule], Schedule] | None = None,
        score: Callable[[Schedule], float] | None = None,
    ):
        if semu is None and (duration is None or score is None):
            raise ValueError("OrderEvaluator needs a Semu unless both duration and score are given")
        if len(microbatches) != structure.num_microbatches:
            raise ScheduleError(
                f"the step has {structure.num_microbatches} microbatches, "
                f"{len(microbatches)} were given"
            )
        self.placement = placement
        self.structure = structure
        self.microbatches = tuple(microbatches)
        self.semu = semu
        self.space = SegmentSpace(placement, structure)
        self.refine = refine
        self.score = score
        if duration is None:
            # Phase 2 asks for each duration many times per rollout: look them up once.
            duration = _Durations(
                {
                    a: semu.compute_cost(
                        placement, a.with_memory(memory), microbatches[a.microbatch]
                    ).time_s
                    for a in all_computes(placement, structure)
                }
            )

        limited = memory_cap is not None or memory_limit is not None
        if limited and activation_bytes is None and semu is not None:
            activation_bytes = semu.activation_bytes(placement, self.microbatches)
        if limited and activation_bytes is not None:
            # Phase 2 asks for each forward's bytes once per rollout: look them up once.
            forwards = (a.with_memory(memory) for a in all_computes(placement, structure))
            activation_bytes = _KeptBytes(
                {f: activation_bytes(f) for f in forwards if f.kind is Kind.F}
            )
        self._phase2 = dict(duration=duration, p2p_time=p2p_time, memory=memory)
        if memory_cap is not None:
            self._phase2.update(memory_cap=memory_cap, activation_bytes=activation_bytes)
        if memory_limit is not None:
            self._phase2.update(memory_limit=memory_limit, activation_bytes=activation_bytes)
        self._cache: dict[Indices, float] = {}

    def __getstate__(self) -> dict:
        # What a search worker gets (search_pool): everything but the cache of scores.
        return {**self.__dict__, "_cache": {}}

    def interleave(self, priority: Callable[[Compute], tuple], lowered: bool = True) -> Schedule:
        """Phase 2 alone with a priority function: the greedy schedule (lowered, or the
        compute-only order, which SEMU times alike)."""
        return greedy_dual_queue(
            self.placement, self.structure, priority=priority, lowered=lowered, **self._phase2
        )

    def schedule(self, order: Indices, lowered: bool = True) -> Schedule:
        """The schedule of an order (phase 2, then the phase-3 hook), lowered unless told not
        to and there is no hook.

        The default order stands for phase 2's own :func:`default_priority`: the two agree
        except where a forward and a backward become ready at the same future instant on one
        rank (``default_priority`` then compares microbatches, an order's keys run the
        forward), so the greedy schedule the search starts from is exactly the trainer's.
        """
        if order == self.space.default():
            priority = default_priority
        else:
            priority = order_priority(self.space.to_groups(order))
        # A phase-3 hook gets (and may return) lowered schedules.
        sched = self.interleave(priority, lowered or self.refine is not None)
        return self.refine(sched) if self.refine is not None else sched

    def time_of(self, sched: Schedule) -> float:
        """Predicted seconds of a schedule."""
        if self.score is not None:
            return float(self.score(sched))
        res = self.semu.simulate_pipeline(sched, self.microbatches, record_events=False)
        return float(res.makespan)

    def __call__(self, order: Indices) -> float:
        """Predicted seconds of an order (cached)."""
        t = self._cache.get(order)
        if t is None:
            # SEMU times a compute-only order as its lowering: the lowering (40% of a rollout)
            # is left to the schedule kept. A caller's own score sees lowered schedules.
            t = self._cache[order] = self.time_of(self.schedule(order, self.score is not None))
        return t

    @property
    def evaluations(self) -> int:
        """Distinct orders scored so far."""
        return len(self._cache)


class _Node:
    """One node of the search tree: a prefix of the order."""

    __slots__ = (
        "parent", "prefix", "children", "untried", "visits", "pending", "best", "exhausted"
    )  # fmt: skip

    def __init__(self, parent: "_Node | None", prefix: Indices, moves: list[int]):
        self.parent = parent
        self.prefix = prefix
        self.children: list[_Node] = []
        self.untried = moves
        self.visits = 0
        self.pending = 0  # rollouts of the current wave below this node (the virtual loss)
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

    waves: int = 0
    """Waves of the search (each evaluates up to ``workers`` nodes' rollouts together)."""


def _exhaust(node: _Node) -> None:
    """Mark a complete order's node exhausted, and every ancestor left with nothing else."""
    node.exhausted = True
    up = node.parent
    while up is not None and not up.untried and all(c.exhausted for c in up.children):
        up.exhausted = True
        up = up.parent


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
    workers: int = 1,
    evaluate_many: Callable[[list[Indices]], Sequence[float]] | None = None,
) -> TreeOutcome:
    """MCTS over the canonical orders of ``space``, in waves (see the module docstring).

    Args:
        space: the segment groups and the legal moves.
        evaluate: order (indices) -> seconds; should be cached by the caller.
        rollouts: orders to evaluate after ``first`` (0: only ``first``).
        seed: seed of the numpy generator behind expansions and rollouts.
        budget_ms: also stop after the wave that crosses this many milliseconds.
        alpha: exponent of the normalised score.
        beta: weight of the exploration term.
        rollouts_per_expansion: random completions per expanded node.
        maximize: look for the slowest order instead (for benchmarks' worst case).
        first: the order evaluated first; default the greedy default order.
        workers: nodes expanded per wave (1: the plain sequential search).
        evaluate_many: a wave's orders -> their seconds, in order (e.g. a
            :class:`~pipeweaver.search.search_pool.SearchPool` behind a cache); default
            ``evaluate`` on each in turn. The result does not depend on which is used.
    """
    if rollouts < 0 or rollouts_per_expansion < 1 or workers < 1:
        raise ValueError(
            f"rollouts must be >= 0, rollouts_per_expansion and workers >= 1, got {rollouts}, "
            f"{rollouts_per_expansion} and {workers}"
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
    done, waves = 1, 0

    def complete(prefix: Indices) -> Indices:
        placed = set(prefix)
        fwd = [i for i in prefix if i < nf] + [
            int(i) for i in rng.permutation([i for i in range(nf) if i not in placed])
        ]
        bwd = [i for i in prefix if i >= nf] + [
            int(i) for i in rng.permutation([i for i in range(nf, n) if i not in placed])
        ]
        return space.merge(fwd, bwd)

    def select(node: _Node) -> _Node:
        # Pending rollouts count as visits, and a child with only pending ones scores as the
        # worst time seen: the wave's next selection prefers other subtrees.
        log_n = math.log(max(node.visits + node.pending, 1))
        span = hi - lo
        choice, choice_value = None, -math.inf
        for child in node.children:
            if child.exhausted:
                continue
            if child.best == math.inf:
                s = 0.0
            else:
                s = (hi - child.best) / span if span > 0 else 1.0
            value = s**alpha + beta * math.sqrt(log_n / (child.visits + child.pending))
            if value > choice_value:
                choice, choice_value = child, value
        return choice  # not None: a node whose children are all exhausted is exhausted

    root = _Node(None, (), space.moves(()))
    if n == 0:
        root.exhausted = True
    while not root.exhausted and done < rollouts + 1:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        # One wave: up to ``workers`` selections and expansions, each under the virtual loss
        # of the ones before it, all drawn from the one generator in a fixed order.
        wave: list[tuple[_Node, list[Indices]]] = []
        room = rollouts + 1 - done
        while len(wave) < workers and room > 0 and not root.exhausted:
            node = root
            while not node.untried:
                node = select(node)
            move = node.untried.pop(int(rng.integers(len(node.untried))))
            prefix = node.prefix + (move,)
            child = _Node(node, prefix, space.moves(prefix) if len(prefix) < n else [])
            node.children.append(child)
            if len(prefix) == n:
                orders = [prefix]
                _exhaust(child)  # known now: the wave's later selections skip it
            else:
                orders = [complete(prefix) for _ in range(min(rollouts_per_expansion, room))]
            room -= len(orders)
            up = child
            while up is not None:
                up.pending += len(orders)
                up = up.parent
            wave.append((child, orders))
        flat = [order for _, orders in wave for order in orders]
        if evaluate_many is None:
            times = [evaluate(order) for order in flat]
        else:
            times = list(evaluate_many(flat))
        waves += 1
        # Backpropagation, in selection order: the virtual losses go, the results come.
        at = 0
        for child, orders in wave:
            batch_best = math.inf
            for order in orders:
                obj = sign * float(times[at])
                at += 1
                lo, hi = min(lo, obj), max(hi, obj)
                if obj < best_obj:
                    best_obj, best_order = obj, order
                batch_best = min(batch_best, obj)
            done += len(orders)
            up = child
            while up is not None:
                up.pending -= len(orders)
                up.visits += len(orders)
                up.best = min(up.best, batch_best)
                up = up.parent
    return TreeOutcome(best_order, sign * best_obj, first_time, done, root.exhausted, waves)


def search_schedule(
    placement: Placement,
    structure: MicrobatchStructure,
    microbatches: Sequence[MicrobatchMeta],
    semu: Semu | None,
    *,
    rollouts: int,
    seed: int = 0,
    budget_ms: float | None = None,
    alpha: float = ALPHA,
    beta: float = BETA,
    workers: int = 1,
    max_workers: int | None = None,
    pool: SearchPool | None = None,
    rollouts_per_expansion: int = ROLLOUTS_PER_EXPANSION,
    maximize: bool = False,
    evaluate: Callable[[tuple[SegmentGroup, ...]], float] | None = None,
    evaluator: OrderEvaluator | None = None,
    **phase2,
) -> SearchResult:
    """Search the step's segment priorities; return the best schedule found.

    Args:
        placement: where each chunk lives.
        structure: microbatches and subs of the step.
        microbatches: SEMU's metadata of each microbatch.
        semu: the simulator that scores schedules (see :class:`OrderEvaluator`).
        rollouts: orders to evaluate beyond the greedy default (0: greedy only).
        seed: seed of the search.
        budget_ms: also stop once the search has run this long (results then depend on
            timing; see the module docstring).
        alpha: exponent of the normalised score in the selection rule.
        beta: weight of the exploration term.
        workers: search processes, at most ``max_workers``: each wave of the search expands
            this many nodes and scores their rollouts in parallel (1: in this process). The
            result for a seed and rollout budget does not depend on the processes, only on
            ``workers`` (see the module docstring).
        max_workers: the cap of ``workers`` (None: half the host's cores,
            :func:`~pipeweaver.search.search_pool.max_search_workers`).
        pool: running workers to score with (reused across searches; ``workers`` must be its
            size). None: with ``workers`` > 1 a pool is started for this search and closed,
            with 1 the orders are scored in this process.
        rollouts_per_expansion: random completions per expanded node.
        maximize: find the slowest order instead (benchmarks' worst case).
        evaluate: ``order -> seconds`` replacing the default score (phase 2, phase 3, SEMU);
            results are cached by order. The returned schedule is still phase 2's (and
            phase 3's) for the best order.
        evaluator: a prepared :class:`OrderEvaluator` (reuses its cache across calls);
            ``phase2`` must then be empty.
        **phase2: keyword arguments of :class:`OrderEvaluator` (``duration``, ``p2p_time``,
            ``memory``, ``memory_cap``, ``activation_bytes``, ``memory_limit``, ``refine``,
            ``score``).

    Raises:
        ValueError: ``workers`` is below 1 or above the cap, or is not ``pool``'s size; the
            scorer cannot be pickled for the workers; bad budgets.
        ScheduleError: the microbatches do not match the structure, or the refined schedule
            fails the checker.
        SearchPoolError: a worker died, failed or gave no answer in time.
    """
    if pool is None:
        check_workers(workers, max_workers)
    elif pool.workers != workers:
        raise ValueError(f"workers is {workers} but the pool has {pool.workers} workers")
    t0 = time.perf_counter()
    if evaluator is None:
        evaluator = OrderEvaluator(placement, structure, microbatches, semu, **phase2)
    elif phase2:
        raise ValueError(f"give phase-2 options or an evaluator, not both: {sorted(phase2)}")
    space = evaluator.space
    if evaluate is None:
        score = evaluator
    else:
        cache: dict[Indices, float] = {}

        def score(order: Indices) -> float:
            t = cache.get(order)
            if t is None:
                t = cache[order] = float(evaluate(space.to_groups(order)))
            return t

    before = evaluator.evaluations if evaluate is None else 0
    search = functools.partial(
        tree_search,
        space,
        score,
        rollouts=rollouts,
        seed=seed,
        budget_ms=budget_ms,
        alpha=alpha,
        beta=beta,
        rollouts_per_expansion=rollouts_per_expansion,
        maximize=maximize,
        workers=workers,
    )
    if workers == 1 and pool is None:
        outcome = search()
    else:
        scorer = evaluator if evaluate is None else _GroupsScore(space, evaluate)
        store = evaluator._cache if evaluate is None else cache
        with contextlib.ExitStack() as stack:
            if pool is None:
                pool = stack.enter_context(SearchPool(workers, max_workers=max_workers))
            pool.load(scorer)
            outcome = search(evaluate_many=functools.partial(cached_many, store, pool.evaluate))
    schedule = evaluator.schedule(outcome.order)
    check(schedule)
    evaluations = evaluator.evaluations - before if evaluate is None else len(cache)
    return SearchResult(
        schedule=schedule,
        order=space.to_groups(outcome.order),
        step_time_s=outcome.time_s,
        greedy_step_time_s=outcome.first_time_s,
        rollouts=outcome.rollouts,
        evaluations=evaluations,
        search_s=time.perf_counter() - t0,
        exhausted=outcome.exhausted,
        workers=workers,
    )


class _GroupsScore:
    """A caller's ``evaluate`` (groups -> seconds) as a scorer of indices, for the workers."""

    def __init__(self, space: SegmentSpace, evaluate: Callable[[tuple[SegmentGroup, ...]], float]):
        self.space, self.evaluate = space, evaluate

    def __call__(self, order: Indices) -> float:
        return float(self.evaluate(self.space.to_groups(order)))

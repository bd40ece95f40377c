# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Phase 3 of the planner: the memory strategy of every F/B pair, by one ILP per rank.

Given a schedule's order (phase 2's, :func:`pipeweaver.interleave.greedy_dual_queue`) and a
per-rank activation limit (:mod:`pipeweaver.search.memory_limit`), each F/B pair gets one of its
candidate strategies (:class:`~pipeweaver.ir.Memory`): keep everything; recompute each layer's
core attention in the backward (selective); recompute the chunk's first n layers, keeping only
their inputs and everything of the others, for each n from 1 to all but one of the chunk's
layers; recompute the whole chunk; or offload the activations to the host (only where a GPU has
a host to offload to). Of a pair's candidates at most S (10 by default) are kept: the dominated
ones dropped, then the fastest, the most frugal, and the fastest of each band of kept bytes
between them (:func:`select_candidates`). Each candidate carries SEMU's times of the pair's forward and backward and its memory: the
bytes kept from the F to the B and the transient bytes alive during each half. Per rank:

    minimise   sum_{p,s} (t_F[p,s] + t_B[p,s]) x[p,s]
    subject to sum_s x[p,s] = 1                                    for every pair p
               sum_{q alive at e} kept[q,s] x[q,s] + transient_e[p,s] x[p,s] <= limit
                                                                  for every compute e of pair p

where the pairs alive at a compute are those whose F ran before it (or is it) and whose B has
not run yet: exactly SEMU's peak of activation memory (:mod:`pipeweaver.semu.replay`), hence
also within the static checker's cap (which counts kept bytes only). HiGHS solves it, warm
started from a greedy choice (the most memory-saving switch at the worst violation first), and
stops at a relative gap (5% by default).

The order is fixed: choosing strategies changes compute times, and so the times at which the
order of phase 2 would have put computes, but the ILP keeps phase 2's order (as DIP does); the
rank's compute time it minimises is the sum of its computes, independent of the order.

Every candidate is one the runtime executes (:mod:`pipeweaver.runtime.executor`; selective and
first-n run megatron-core's own recompute for that pair, :mod:`pipeweaver.runtime.layer_recompute`)
and SEMU models as it runs (:meth:`pipeweaver.semu.work.ModelCosts.recompute_of`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

# HiGHS prints its banner on the C-level stdout; the balancer's ILP bound silences it alike.
from orchestration.bounds import _quiet_stdout
from pipeweaver.ir import Compute, Kind, Memory, ScheduleError
from pipeweaver.lowering import lower
from pipeweaver.schedule import Schedule

DEFAULT_STRATEGIES: tuple[Memory, ...] = (
    Memory.NONE,
    Memory.SELECTIVE,
    Memory.LAYERS,
    Memory.RECOMPUTE,
)
"""What the runtime executes on any device (:attr:`Memory.LAYERS` stands for every count of a
chunk's first layers, 1 to all but one); add :attr:`Memory.OFFLOAD` where a GPU is."""

Strategy = tuple[Memory, int]
"""A pair's strategy: the memory and, with :attr:`Memory.LAYERS`, the count of first layers."""

_MARGIN = 1e-6
"""Relative slack below each limit for a second solve, when HiGHS's feasibility tolerance let
the first one's choice exceed the limit by a hair (every choice is verified exactly)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One memory strategy of one F/B pair, with its time and memory."""

    memory: Memory
    """The strategy (both halves of the pair carry it)."""

    forward_s: float
    """Time of the forward."""

    backward_s: float
    """Time of the backward (a recomputing backward includes its forward's rerun)."""

    kept_bytes: float
    """Bytes kept from the forward until the backward."""

    forward_transient_bytes: float
    """Extra bytes alive during the forward only."""

    backward_transient_bytes: float
    """Extra bytes alive during the backward only (recomputed or reloaded activations)."""

    recompute_layers: int = 0
    """With :attr:`Memory.LAYERS`, the chunk's first layers recomputed."""

    @property
    def strategy(self) -> Strategy:
        """``(memory, recompute_layers)``."""
        return self.memory, self.recompute_layers

    @property
    def time_s(self) -> float:
        """Time of the pair: forward plus backward."""
        return self.forward_s + self.backward_s


class StrategyCosts:
    """Time and memory of every compute under every strategy.

    Args:
        cost: ``compute -> (time_s, kept_bytes, transient_bytes)`` for a compute carrying its
            strategy (a :class:`~pipeweaver.semu.timing.ComputeCost` or any object with those
            attributes); ``kept_bytes`` is read from the forward.
        chunk_layers: the layers of a compute's chunk, to expand :attr:`Memory.LAYERS` into
            one candidate per count (None: no first-n candidates).
    """

    def __init__(
        self,
        cost: Callable[[Compute], object],
        chunk_layers: Callable[[Compute], int] | None = None,
    ):
        self._cost = cost
        self._chunk_layers = chunk_layers
        self._cache: dict[Compute, Candidate] = {}

    @classmethod
    def from_semu(cls, semu, placement, microbatches: Sequence) -> "StrategyCosts":
        """SEMU's costs (:meth:`~pipeweaver.semu.simulator.Semu.compute_cost`) of one step's
        microbatches (indexed by :attr:`Compute.microbatch`) on a placement."""

        def layers(a: Compute) -> int:
            start, stop = placement.layer_range(a.module, a.chunk)
            return stop - start

        return cls(lambda a: semu.compute_cost(placement, a, microbatches[a.microbatch]), layers)

    def strategies(self, forward: Compute, memories: Sequence[Memory]) -> list[Strategy]:
        """The strategies of ``forward``'s pair among ``memories``: :attr:`Memory.LAYERS` as one
        per count of first layers, 1 to all but one of its chunk's (all of them is
        :attr:`Memory.RECOMPUTE`'s memory with more reruns; none where the chunk has one)."""
        out: list[Strategy] = []
        for m in memories:
            m = Memory(m)
            if m is not Memory.LAYERS:
                out.append((m, 0))
            elif self._chunk_layers is not None:
                out.extend((m, n) for n in range(1, self._chunk_layers(forward)))
        return out

    def candidate(self, forward: Compute, memory: Memory, recompute_layers: int = 0) -> Candidate:
        """The pair of ``forward`` (an F) under ``memory`` (and its layer count)."""
        f = forward.with_memory(memory, recompute_layers)
        c = self._cache.get(f)
        if c is None:
            cf, cb = self._cost(f), self._cost(f.partner())
            c = self._cache[f] = Candidate(
                Memory(memory),
                float(cf.time_s),
                float(cb.time_s),
                float(cf.kept_bytes),
                float(cf.transient_bytes),
                float(cb.transient_bytes),
                recompute_layers,
            )
        return c


def select_candidates(options: Sequence[Candidate], max_candidates: int = 10) -> list[Candidate]:
    """At most ``max_candidates`` of a pair's candidates, the dominated ones dropped: the
    fastest, the most frugal, and the fastest of each equal-width bucket of kept bytes between
    them. Ordered by kept bytes, most first."""
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")

    def worse(a: Candidate, b: Candidate) -> bool:  # a dominated by b
        ka = (a.time_s, a.kept_bytes, a.forward_transient_bytes, a.backward_transient_bytes)
        kb = (b.time_s, b.kept_bytes, b.forward_transient_bytes, b.backward_transient_bytes)
        return all(x >= y for x, y in zip(ka, kb)) and ka != kb

    kept = [a for a in options if not any(worse(a, b) for b in options)]
    # Equal costs under two strategies: keep the first (the caller's order of preference).
    unique: list[Candidate] = []
    for a in kept:
        if not any(
            (a.time_s, a.kept_bytes, a.forward_transient_bytes, a.backward_transient_bytes)
            == (b.time_s, b.kept_bytes, b.forward_transient_bytes, b.backward_transient_bytes)
            for b in unique
        ):
            unique.append(a)
    if len(unique) > max_candidates:
        fastest = min(unique, key=lambda c: (c.time_s, c.kept_bytes))
        frugal = min(unique, key=lambda c: (c.kept_bytes, c.time_s))
        chosen = [fastest] + ([frugal] if frugal is not fastest else [])
        buckets = max_candidates - len(chosen)
        lo, hi = frugal.kept_bytes, fastest.kept_bytes
        best: dict[int, Candidate] = {}
        for c in unique:
            if c is fastest or c is frugal or buckets <= 0:
                continue
            width = (hi - lo) / buckets if hi > lo else 1.0
            b = min(buckets - 1, max(0, int((c.kept_bytes - lo) / width)))
            if b not in best or c.time_s < best[b].time_s:
                best[b] = c
        unique = chosen + [best[b] for b in sorted(best)]
    return sorted(unique, key=lambda c: (-c.kept_bytes, c.time_s))


@dataclass(frozen=True)
class MemoryPlan:
    """The chosen strategies and the schedule that carries them."""

    schedule: Schedule
    """The input order with every compute's memory set (both halves of a pair alike), lowered
    (:func:`pipeweaver.lowering.lower`): ready for the checker and the runtime."""

    choices: Mapping[Compute, Memory]
    """Per F/B pair (keyed by its forward, without strategy), the chosen strategy."""

    recompute_layers: Mapping[Compute, int]
    """Per F/B pair whose choice is :attr:`Memory.LAYERS`, the count of first layers."""

    predicted_time_s: tuple[float, ...]
    """Per rank, the sum of its computes' times under the choice (SEMU's costs)."""

    peak_bytes: tuple[float, ...]
    """Per rank, the peak of kept plus transient activation bytes (SEMU's peak)."""

    limit_bytes: tuple[float | None, ...]
    """Per rank, the limit planned for (None: none)."""

    optimal: tuple[bool, ...]
    """Per rank, whether the choice is proven within the gap of the optimum (False when the
    time limit stopped HiGHS first; then the best choice found is kept)."""


@dataclass(frozen=True)
class _RankProblem:
    """One rank's pairs, candidates and memory constraints."""

    pairs: list[Compute]
    """Forwards (without strategy) of the rank's pairs, in order."""

    options: list[list[Candidate]]
    """Per pair, its candidates."""

    events: list[list[tuple[int, int]]]
    """Per compute of the rank, ``(pair, role)``: role 0 = kept only (alive), 1 = the F's own
    pair (kept + forward transient), 2 = the B's own pair (kept + backward transient)."""


def _coef(c: Candidate, role: int) -> float:
    if role == 0:
        return c.kept_bytes
    if role == 1:
        return c.kept_bytes + c.forward_transient_bytes
    return c.kept_bytes + c.backward_transient_bytes


def _rank_problem(
    computes: Sequence[Compute], costs: StrategyCosts, strategies, max_candidates: int
) -> _RankProblem:
    index: dict[Compute, int] = {}
    pairs: list[Compute] = []
    span: list[list[int]] = []
    for i, a in enumerate(computes):
        f = a.key if a.kind is Kind.F else a.key.partner()
        if f not in index:
            index[f] = len(pairs)
            pairs.append(f)
            span.append([i, len(computes)])
        if a.kind is Kind.F:
            span[index[f]][0] = i
        else:
            span[index[f]][1] = i
    options = [
        select_candidates(
            [costs.candidate(f, m, n) for m, n in costs.strategies(f, strategies)], max_candidates
        )
        for f in pairs
    ]
    # Pairs sorted by forward position, to find the ones alive at each compute.
    starts = sorted((s[0], p) for p, s in enumerate(span))
    positions = [s for s, _ in starts]
    events = []
    for i, a in enumerate(computes):
        own = index[a.key if a.kind is Kind.F else a.key.partner()]
        role = 1 if a.kind is Kind.F else 2
        alive = [(own, role)]
        for _, p in starts[: bisect.bisect_right(positions, i)]:
            if p != own and span[p][0] < i < span[p][1]:
                alive.append((p, 0))
        events.append(alive)
    return _RankProblem(pairs, options, events)


def _levels(problem: _RankProblem, choice: Sequence[int]) -> list[float]:
    return [
        sum(_coef(problem.options[p][choice[p]], role) for p, role in e) for e in problem.events
    ]


def _greedy(problem: _RankProblem, limit: float) -> list[int] | None:
    """Fastest everywhere, then at the worst violation the switch that saves the most bytes
    there (to a more frugal candidate: later in the pair's list), until everything fits."""
    choice = [min(range(len(o)), key=lambda s: (o[s].time_s, s)) for o in problem.options]
    for _ in range(sum(len(o) for o in problem.options) + 1):
        levels = _levels(problem, choice)
        worst = max(range(len(levels)), key=lambda e: levels[e], default=None)
        if worst is None or levels[worst] <= limit:
            return choice
        best = None
        for p, role in problem.events[worst]:
            now = problem.options[p][choice[p]]
            for s in range(choice[p] + 1, len(problem.options[p])):
                c = problem.options[p][s]
                saved = _coef(now, role) - _coef(c, role)
                if saved > 0:
                    key = (saved, -(c.time_s - now.time_s))
                    if best is None or key > best[0]:
                        best = (key, p, s)
        if best is None:
            return None
        choice[best[1]] = best[2]
    return None


def _new_model(problem: _RankProblem, time_limit_s: float, gap: float):
    """A HiGHS model with one binary column per (pair, candidate), each pair choosing one.
    Returns ``(highspy, model, columns, column of (pair, candidate))``."""
    import highspy

    cols = [(p, s) for p, o in enumerate(problem.options) for s in range(len(o))]
    col_of = {ps: k for k, ps in enumerate(cols)}
    n = len(cols)
    with _quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    # One thread and no time limit reached: the same choice on every rank and every run.
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("time_limit", float(time_limit_s))
    h.addVars(n, np.zeros(n), np.ones(n))
    h.changeColsIntegrality(
        n, np.arange(n, dtype=np.int32), np.full(n, highspy.HighsVarType.kInteger)
    )
    for p, o in enumerate(problem.options):
        idx = np.array([col_of[(p, s)] for s in range(len(o))], dtype=np.int32)
        h.addRow(1.0, 1.0, idx.size, idx, np.ones(idx.size))
    return highspy, h, cols, col_of


def _memory_rows(problem: _RankProblem, col_of, scale: float):
    """Per compute, the columns and bytes (divided by ``scale``) of its memory level."""
    for e in problem.events:
        idx, val = [], []
        for p, role in e:
            for s, c in enumerate(problem.options[p]):
                v = _coef(c, role) / scale
                if v:
                    idx.append(col_of[(p, s)])
                    val.append(v)
        if idx:
            yield idx, val


def _choice_of(highspy, h, cols, num_pairs: int) -> list[int] | None:
    sol = h.getSolution()
    if not sol.value_valid or h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return None
    x = np.asarray(sol.col_value)
    choice = [0] * num_pairs
    for k, (p, s) in enumerate(cols):
        if x[k] > 0.5:
            choice[p] = s
    return choice


def _solve(
    problem: _RankProblem,
    limit: float,
    start: Sequence[int] | None,
    gap: float,
    time_limit_s: float,
    margin: float = 0.0,
) -> tuple[list[int] | None, bool]:
    """The ILP with HiGHS: ``(choice, proven within the gap)``; choice None when infeasible or
    nothing was found in time."""
    highspy, h, cols, col_of = _new_model(problem, time_limit_s, gap)
    n = len(cols)
    times = np.array([problem.options[p][s].time_s for p, s in cols])
    # HiGHS's tolerances are absolute: times scaled to at most 1, bytes to the limit.
    scale = float(times.max()) if n and times.max() > 0 else 1.0
    h.changeColsCost(n, np.arange(n, dtype=np.int32), times / scale)
    for idx, val in _memory_rows(problem, col_of, limit):
        h.addRow(-highspy.kHighsInf, 1.0 - margin, len(idx), np.array(idx, np.int32), np.array(val))
    if start is not None:
        sol = highspy.HighsSolution()
        x = np.zeros(n)
        for p, s in enumerate(start):
            x[col_of[(p, s)]] = 1.0
        sol.col_value = list(x)
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    choice = _choice_of(highspy, h, cols, len(problem.options))
    return choice, choice is not None and h.getModelStatus() == highspy.HighsModelStatus.kOptimal


def _least_peak(problem: _RankProblem, time_limit_s: float) -> float:
    """The least peak of activation bytes any choice reaches in this order (for the error)."""
    frugal = [min(range(len(o)), key=lambda s: (o[s].kept_bytes, s)) for o in problem.options]
    upper = max(_levels(problem, frugal))
    highspy, h, cols, col_of = _new_model(problem, time_limit_s, 0.0)
    z = len(cols)
    h.addVar(0.0, highspy.kHighsInf)
    h.changeColCost(z, 1.0)
    for idx, val in _memory_rows(problem, col_of, upper):
        h.addRow(-highspy.kHighsInf, 0.0, len(idx) + 1, np.array(idx + [z], np.int32),
                 np.array(val + [-1.0]))  # fmt: skip
    h.run()
    choice = _choice_of(highspy, h, cols, len(problem.options))
    return min(upper, max(_levels(problem, choice))) if choice is not None else upper


def _cost_of(problem: _RankProblem, choice: Sequence[int]) -> float:
    return sum(problem.options[p][s].time_s for p, s in enumerate(choice))


def plan_rank(
    computes: Sequence[Compute],
    costs: StrategyCosts,
    limit: float | None,
    *,
    rank: int = 0,
    strategies: Sequence[Memory] = DEFAULT_STRATEGIES,
    max_candidates: int = 10,
    gap: float = 0.05,
    time_limit_s: float = 10.0,
) -> tuple[dict[Compute, Strategy], float, float, bool]:
    """One rank's choice: ``(strategy per pair, compute time, peak bytes, proven)``.

    Raises:
        ScheduleError: no choice fits the limit in this order (names the rank, the least peak
            any choice reaches, and the limit).
    """
    problem = _rank_problem(computes, costs, tuple(strategies), max_candidates)
    fastest = [min(range(len(o)), key=lambda s: (o[s].time_s, s)) for o in problem.options]
    choice, proven = fastest, True
    if limit is not None and problem.pairs and max(_levels(problem, fastest)) > limit:
        start = _greedy(problem, limit)
        found, proven = _solve(problem, limit, start, gap, time_limit_s)
        if found is not None and max(_levels(problem, found)) > limit:
            found, proven = _solve(problem, limit, start, gap, time_limit_s, _MARGIN)
        feasible = [
            c for c in (found, start) if c is not None and max(_levels(problem, c)) <= limit
        ]
        if not feasible:
            need = _least_peak(problem, time_limit_s)
            raise ScheduleError(
                f"needs {need:.0f} bytes of activations at its peak with the most frugal choice "
                f"of memory strategies ({', '.join(m.value for m in strategies)}) in this order, "
                f"over the rank's memory limit of {limit:.0f} bytes",
                rank,
            )
        choice = min(feasible, key=lambda c: _cost_of(problem, c))
        proven = proven and choice is found
    chosen = {f: problem.options[p][choice[p]].strategy for p, f in enumerate(problem.pairs)}
    peak = max(_levels(problem, choice), default=0.0)
    return chosen, _cost_of(problem, choice), peak, proven


def plan_memory(
    schedule: Schedule,
    costs: StrategyCosts,
    limit_bytes: Sequence[float | None] | float | None,
    *,
    strategies: Sequence[Memory] = DEFAULT_STRATEGIES,
    max_candidates: int = 10,
    gap: float = 0.05,
    time_limit_s: float = 10.0,
) -> MemoryPlan:
    """Choose every F/B pair's memory strategy in ``schedule``'s order, per rank.

    Args:
        schedule: the order (compute-only or lowered; the computes' strategies are ignored).
        costs: times and memory of each compute under each strategy.
        limit_bytes: per rank (or one for all) the activation bytes allowed (None: no limit);
            :func:`pipeweaver.search.memory_limit.memory_limit_bytes`.
        strategies: the candidates (add :attr:`Memory.OFFLOAD` only on a GPU);
            :attr:`Memory.LAYERS` stands for every count of first layers the costs expand it
            to (:meth:`StrategyCosts.strategies`).
        max_candidates: at most this many candidates per pair (S).
        gap: HiGHS's relative MIP gap at which it stops.
        time_limit_s: HiGHS's wall-clock limit per rank; only a rank that hits it can make the
            plan differ between runs (then :attr:`MemoryPlan.optimal` is False for it).

    Returns:
        The plan, whose schedule passes :func:`pipeweaver.checker.check` with
        ``memory_cap=limit_bytes`` and the forwards' kept bytes.

    Raises:
        ScheduleError: a rank cannot fit its limit with any choice (names the rank and bytes).
    """
    n = schedule.num_ranks
    if limit_bytes is None or isinstance(limit_bytes, (int, float)):
        limits = [limit_bytes] * n
    else:
        limits = list(limit_bytes)
    if len(limits) != n:
        raise ScheduleError(f"{len(limits)} memory limits for {n} ranks")
    if not strategies:
        raise ScheduleError("plan_memory needs at least one memory strategy")
    choices: dict[Compute, Strategy] = {}
    times, peaks, proven = [], [], []
    for r in range(n):
        c, t, peak, ok = plan_rank(
            schedule.computes(r),
            costs,
            limits[r],
            rank=r,
            strategies=strategies,
            max_candidates=max_candidates,
            gap=gap,
            time_limit_s=time_limit_s,
        )
        choices.update(c)
        times.append(t)
        peaks.append(peak)
        proven.append(ok)
    order = tuple(
        tuple(
            a.with_memory(*choices[a.key if a.kind is Kind.F else a.key.partner()])
            for a in schedule.computes(r)
        )
        for r in range(n)
    )
    planned = lower(Schedule(schedule.placement, schedule.structure, order, schedule.name))
    return MemoryPlan(
        planned,
        {f: m for f, (m, _) in choices.items()},
        {f: k for f, (m, k) in choices.items() if m is Memory.LAYERS},
        tuple(times),
        tuple(peaks),
        tuple(limits),
        tuple(proven),
    )

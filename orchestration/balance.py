# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Balancing algorithms: assign indivisible items to ``d`` bins, minimising the largest load.

Pure numpy, no collectives: every rank runs the same code on the same all-gathered metadata and
gets the same answer. The planner (``orchestration.plan``) calls :func:`balance` once per phase;
tools compare the individual algorithms through its ``algorithm`` argument. Public API:
:func:`balance` (packed cost) -> :class:`BalanceResult`, :func:`balance_padded` (padded cost)
-> :class:`PaddedResult`, :class:`InfeasibleCapError`, :class:`WorkBudget`, :func:`quantize`.

Problems
--------
* **Packed (additive) cost**: the load of a bin is the sum of its items' costs (varlen
  execution, each item its own attention). Algorithms:

  - ``lpt``: Longest Processing Time first. Items by decreasing cost, each to the currently
    lightest bin. Exact LPT, vectorised: a round assigns the next ``k`` items to the ``k``
    lightest bins in one numpy step, where ``k`` is as long as the sequential rule provably
    makes the same choices (each next fresh bin is lighter than every bin already updated in
    the round); ties go to the lowest bin index, as a heap of ``(load, bin)`` would.
  - ``kk``: Karmarkar–Karp multiway largest differencing. Every partial solution is a
    ``d``-tuple of subset sums; the two tuples with the largest spread (max - min) are merged,
    largest subset of one with smallest of the other, until one remains. Item-wise (``n``
    singleton tuples) up to ``kk_itemwise_max`` items. Beyond, every merge costs O(d log d)
    and ``n - 1`` of them would not fit the time budget at thousands of bins, so it starts
    from runs of ``ceil(d/2)`` consecutive items of the decreasing order (each run one tuple,
    one item per subset, the other subsets empty): O((n/d) d log d). Half-empty runs leave the
    item count per bin free; full runs would force one item of every run into every bin.
  - ``refine``: local search on top of any assignment. With up to 64 bins, repeatedly take
    the heaviest bin and apply the single move (one item to another bin) or pairwise swap (one
    item each way) that lowers the larger of the two loads the most, against every other bin.
    With more bins the max is held by many bins at once, so each step pairs the 256 heaviest
    bins with the 256 lightest (heaviest with lightest) and applies the best move or swap of
    every pair together, vectorised. Stops when the heaviest bin cannot improve, when it
    reaches the combinatorial lower bound, when four rounds gained less than 0.1%, or when the
    step budget is spent.
  - ``repair`` (needs owners): start from the ordinary assignment (items stay with their
    owners), lift items off bins above a target load (the smallest single item that brings the
    bin under the target, else the largest items), place them largest first on the lightest
    bins, and repeat for bins that this pushed over (an ejection chain; placed items stay).
    Fails (returns nothing) when a bin cannot get under the target. It moves few items;
    :func:`balance` runs it with the target set to the best max load the other algorithms
    reached, so it wins only on ties.
  - ``exact``: depth-first branch and bound for small instances (``n <= exact_max_items``),
    within a node budget.
  - ``auto``: LPT and KK (KK skipped when LPT provably reached the lower bound), refine on
    both (on the better one beyond 256 items), the branch and bound on small instances, then,
    with owners, ``repair`` aimed at the best max load found. It keeps the lowest max load;
    loads within ``TIE_SLACK`` (a millionth; more with ``slack``) tie, and ties go to the
    fewest moved items, then to the order above. The brief's "time budget of a few ms" is a
    work budget here (see Determinism).

* **Padded cost** (:func:`balance_padded`): a bin runs its items padded to its longest, so its
  load is ``count * f(max length)`` with ``f`` non-decreasing. Solved exactly; see there.

Determinism
-----------
Costs are quantised to int64 (the largest item becomes ``2**bits``, ``bits <= QUANT_BITS``
chosen so that any sum stays below 2**53) before any decision, so every sum the algorithms
compare is exact and independent of summation order, SIMD width or platform: all ranks make
the same decisions. Sorts are stable with ties by item
index. Budgets are counts of work (iterations, search nodes), never wall-clock time: a time
limit would let a loaded rank stop earlier than the others and diverge. The budgets in
:class:`WorkBudget` keep all phases of DP=2560 x 8 samples per rank within tens of
milliseconds.

Caps
----
``sizes`` (e.g. tokens) with ``cap`` bounds the summed size of every bin (memory). LPT honours
it while placing (the lightest bin where the item fits); KK ignores it and is then repaired
(items lifted off over-cap bins and re-placed by capped LPT); refine and repair check every
move. An item larger than the cap, or a cap that a greedy cannot satisfy, raises
:class:`InfeasibleCapError` naming the item (``labels``, e.g. sample ids).

Ordinary assignment
-------------------
With ``owners`` (the rank holding each item now) bin ``k`` *is* rank ``k``: the bins of each
algorithm are mapped to ranks by :func:`orchestration.locality.map_bins_to_ranks` (node-aware,
most payload in place), and the ordinary assignment ``bins = owners`` is scored as well. The
result reports both, and the ordinary one is kept when nothing beats it (zero movement).
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from orchestration.locality import map_bins_to_ranks, moved_lower_bound

QUANT_BITS = 38
"""At most this many bits for the largest item's quantised cost (fewer for many items)."""

ALGORITHMS: tuple[str, ...] = (
    "ordinary",
    "lpt",
    "kk",
    "lpt+refine",
    "kk+refine",
    "repair",
    "exact",
    "auto",
)
"""Names accepted by :func:`balance`."""

Labels = Sequence[str] | Callable[[int], str] | None
"""How errors name item ``i``: a sequence, a function, or None (``item i``)."""


class InfeasibleCapError(ValueError):
    """The per-bin cap on summed size cannot be met: one item is too large, or a greedy failed.

    Attributes:
        item: index of the item at fault, or None.
        label: its label (e.g. a sample id), or None.
        size: its size.
        cap: the cap.
    """

    def __init__(
        self,
        message: str,
        item: int | None = None,
        label: str | None = None,
        size: int | None = None,
        cap: int | None = None,
    ) -> None:
        super().__init__(message)
        self.item = item
        self.label = label
        self.size = size
        self.cap = cap


@dataclass(frozen=True, slots=True)
class WorkBudget:
    """Deterministic work limits of the algorithms (never wall-clock: see the module doc)."""

    refine_iters: int = 128
    """Improving moves/swaps of refine when ``d <= 64``."""

    refine_rounds: int = 8
    """Rounds of paired moves/swaps of refine when ``d > 64``."""

    refine_pairs: int = 256
    """Heaviest/lightest bin pairs refine improves per step when ``d > 64``."""

    kk_itemwise_max: int = 1024
    """Item-wise KK up to this many items; KK over runs of ``ceil(d/2)`` items beyond."""

    lpt_exact_rounds: int = 4096
    """Vectorised exact-LPT rounds before LPT finishes in plain rounds of the lightest bins."""

    refine_both_max: int = 256
    """``auto`` refines both LPT and KK up to this many items, only the better beyond."""

    repair_rounds: int = 8
    """Lift-and-place rounds of ``repair`` (ejection chain length)."""

    exact_max_items: int = 16
    """Largest instance ``auto`` tries the branch and bound on."""

    exact_nodes: int = 50_000
    """Search nodes of the branch and bound."""


DEFAULT_BUDGET = WorkBudget()
"""The budget :func:`balance` uses unless told."""

TIE_SLACK = 1e-6
"""Max loads within this relative distance of the best count as ties (broken by movement)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One scored assignment that :func:`balance` considered."""

    name: str
    """Algorithm that produced it."""

    max_load: float
    """Its largest bin load (quantised, then scaled back)."""

    moved_items: int | None
    """Items not on their owner after mapping bins to ranks; None without owners or when not
    needed to break a tie."""


@dataclass(frozen=True, slots=True)
class BalanceResult:
    """The chosen assignment of items to bins, and how it compares with the ordinary one."""

    bins: np.ndarray
    """(n,) bin of each item; with owners, the rank."""

    loads: np.ndarray
    """(d,) summed cost of each bin."""

    algorithm: str
    """The algorithm whose assignment was kept ("ordinary" if items stay with owners)."""

    sizes: np.ndarray | None = None
    """(d,) summed size of each bin, when sizes were given."""

    ordinary_loads: np.ndarray | None = None
    """(d,) loads if every item stayed with its owner; None without owners."""

    moved_items: int | None = None
    """Items whose bin differs from their owner; None without owners."""

    moved_weight: float | None = None
    """Payload (``item_bytes``) of the moved items; None without owners."""

    candidates: tuple[Candidate, ...] = ()
    """Every assignment scored (``auto``), in the order tried."""

    lower_bound: float = 0.0
    """The combinatorial lower bound on the optimal max load (average, largest item, pigeonhole
    sums; see ``orchestration.bounds``), up to the quantisation of costs."""

    @property
    def max_load(self) -> float:
        """The largest bin load."""
        return float(self.loads.max()) if self.loads.size else 0.0

    @property
    def mean_load(self) -> float:
        """The mean bin load."""
        return float(self.loads.mean()) if self.loads.size else 0.0

    @property
    def imbalance(self) -> float:
        """Max over mean load (1.0 is perfect, and for an empty problem)."""
        mean = self.mean_load
        return self.max_load / mean if mean > 0 else 1.0

    @property
    def ordinary_imbalance(self) -> float | None:
        """Max over mean of the ordinary loads."""
        if self.ordinary_loads is None:
            return None
        return max_over_mean(self.ordinary_loads)


def max_over_mean(loads: np.ndarray) -> float:
    """Imbalance of per-rank loads: max over mean (1.0 is perfect; all-zero loads give 1.0)."""
    mean = float(loads.mean()) if loads.size else 0.0
    return float(loads.max()) / mean if mean > 0 else 1.0


# --------------------------------------------------------------------------------------------
# Public entry point


def balance(
    costs: np.ndarray,
    num_bins: int,
    *,
    algorithm: str = "auto",
    sizes: np.ndarray | None = None,
    cap: int | None = None,
    owners: np.ndarray | None = None,
    item_bytes: np.ndarray | None = None,
    gpus_per_node: int = 8,
    labels: Labels = None,
    budget: WorkBudget = DEFAULT_BUDGET,
    keep_ordinary: bool = True,
    slack: float = TIE_SLACK,
) -> BalanceResult:
    """Assign items to ``num_bins`` bins minimising the largest summed cost (packed cost).

    Args:
        costs: (n,) cost of each item, >= 0.
        num_bins: ``d``, the number of bins (ranks).
        algorithm: one of :data:`ALGORITHMS`.
        sizes: (n,) integer size of each item (tokens), for ``cap``.
        cap: largest summed size of a bin; None for no cap.
        owners: (n,) rank holding each item now, in ``[0, d)``. Makes bin ``k`` rank ``k``
            (bins are mapped to ranks for locality) and scores the ordinary assignment.
        item_bytes: (n,) payload of each item for the locality mapping (default: count items).
        gpus_per_node: ranks per node, for the node-aware mapping.
        labels: names items in errors.
        budget: deterministic work limits.
        keep_ordinary: with owners, return the ordinary assignment when no algorithm beats its
            max load (``algorithm="ordinary"`` always returns it).
        slack: with owners, trade balance for locality: any candidate within ``1 + slack`` of
            the best max load competes on moved items, and ``repair`` aims at that load. The
            default only treats differences below a millionth (noise of the cost model) as ties.

    Returns:
        The chosen assignment.

    Raises:
        InfeasibleCapError: an item exceeds ``cap``, or no algorithm could meet it.
        ValueError: bad arguments.
    """
    prob = _Problem.make(costs, num_bins, sizes, cap, labels, budget)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown balancing algorithm {algorithm!r}; choose from {ALGORITHMS}")
    own = None if owners is None else _check_owners(owners, prob.n, prob.d)
    if own is None and algorithm in ("ordinary", "repair"):
        raise ValueError(f"algorithm {algorithm!r} needs owners")
    wts = None if item_bytes is None else np.asarray(item_bytes, dtype=np.float64)

    cands: list[tuple[str, np.ndarray, bool]] = []  # (name, bins, bins_are_ranks)
    if own is not None and prob.fits(own):
        cands.append(("ordinary", own, True))
    if algorithm == "auto":
        cands += _auto_candidates(prob, own, slack)
    elif algorithm == "ordinary":
        if not prob.fits(own):
            raise prob.cap_error_for(own, "the ordinary assignment")
    else:
        cands.append((algorithm, _run_one(prob, algorithm, own), algorithm == "repair"))
        if not keep_ordinary:
            cands = [c for c in cands if c[0] != "ordinary"]
    if not cands:
        raise InfeasibleCapError(
            f"no assignment of {prob.n} items to {prob.d} bins meets the cap {prob.cap}",
            cap=prob.cap,
        )
    return _choose(prob, cands, own, wts, gpus_per_node, slack)


def quantize(costs: np.ndarray) -> tuple[np.ndarray, float]:
    """Integer costs and the scale back: ``costs ~= q * scale``.

    The largest item becomes ``2**bits`` with ``bits = min(QUANT_BITS, 52 - bit_length(n))``,
    so that any sum of items is below 2**53: exact in int64 and in float64 alike.
    """
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"costs must be one-dimensional, got shape {c.shape}")
    if c.size and (not np.all(np.isfinite(c)) or c.min() < 0):
        raise ValueError("costs must be finite and >= 0")
    top = float(c.max()) if c.size else 0.0
    if top <= 0:
        return np.zeros(c.size, dtype=np.int64), 1.0
    bits = min(QUANT_BITS, 52 - int(c.size).bit_length())
    scale = top / float(2**bits)
    return np.rint(c / scale).astype(np.int64), scale


# --------------------------------------------------------------------------------------------
# The problem and the choice among candidates


@dataclass(slots=True)
class _Problem:
    q: np.ndarray
    scale: float
    d: int
    costs: np.ndarray
    sizes: np.ndarray | None
    cap: int | None
    labels: Labels
    budget: WorkBudget
    n: int = 0
    lb_q: int = 0
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def make(cls, costs, num_bins, sizes, cap, labels, budget) -> "_Problem":
        d = int(num_bins)
        if d <= 0:
            raise ValueError(f"num_bins must be positive, got {num_bins}")
        q, scale = quantize(costs)
        s = None
        if cap is not None:
            if sizes is None:
                raise ValueError("a cap needs item sizes")
            s = np.asarray(sizes, dtype=np.int64)
            if s.shape != q.shape:
                raise ValueError(f"sizes has shape {s.shape}, costs {q.shape}")
            cap = int(cap)
        c = np.asarray(costs, dtype=np.float64)
        prob = cls(q, scale, d, c, s, cap, labels, budget, n=q.size)
        # Items by decreasing cost, ties by index: the order every greedy walks.
        prob.order = np.argsort(-q, kind="stable")
        prob.lb_q = _trivial_bound_q(q[prob.order], d)
        if s is not None:
            prob.check_cap()
        return prob

    def label(self, i: int) -> str:
        return _label(self.labels, i)

    def check_cap(self) -> None:
        big = np.flatnonzero(self.sizes > self.cap)
        if big.size:
            i = int(big[np.argmax(self.sizes[big])])
            raise InfeasibleCapError(
                f"{self.label(i)} has size {int(self.sizes[i])}, more than the per-bin cap "
                f"{self.cap}: it can never fit (a unit is never split)",
                item=i,
                label=self.label(i),
                size=int(self.sizes[i]),
                cap=self.cap,
            )
        total = int(self.sizes.sum())
        if total > self.d * self.cap:
            raise InfeasibleCapError(
                f"the items' total size {total} exceeds {self.d} bins x cap {self.cap}",
                cap=self.cap,
            )

    def fits(self, bins: np.ndarray) -> bool:
        if self.cap is None:
            return True
        return bool(np.bincount(bins, weights=self.sizes, minlength=self.d).max() <= self.cap)

    def cap_error_for(self, bins: np.ndarray, what: str) -> InfeasibleCapError:
        used = np.bincount(bins, weights=self.sizes, minlength=self.d)
        b = int(np.argmax(used))
        return InfeasibleCapError(
            f"{what} puts {int(used[b])} in bin {b}, more than the cap {self.cap}", cap=self.cap
        )


def _trivial_bound_q(sorted_q: np.ndarray, d: int) -> int:
    """Lower bound on the optimal max load in quantised units (see ``orchestration.bounds``):
    the average (rounded up), the largest item, and the pigeonhole sums."""
    n = sorted_q.size
    if n == 0:
        return 0
    best = max(int(sorted_q[0]), -(-int(sorted_q.sum()) // d))
    if n > d:
        prefix = np.r_[0, np.cumsum(sorted_q)]
        k = np.arange(1, (n - 1) // d + 1)
        best = max(best, int((prefix[k * d + 1] - prefix[k * d - k]).max()))
    return best


def _loads(q: np.ndarray, bins: np.ndarray, d: int) -> np.ndarray:
    """Exact int64 loads per bin.

    bincount sums in float64, which is exact here: :func:`quantize` keeps every partial sum
    below 2**53.
    """
    return np.bincount(bins, weights=q, minlength=d).astype(np.int64)


def _label(labels: Labels, i: int) -> str:
    if labels is None:
        return f"item {i}"
    if callable(labels):
        return str(labels(i))
    return str(labels[i])


def _check_owners(owners, n: int, d: int) -> np.ndarray:
    own = np.asarray(owners, dtype=np.int64)
    if own.shape != (n,):
        raise ValueError(f"owners has shape {own.shape}, expected ({n},)")
    if n and (own.min() < 0 or own.max() >= d):
        raise ValueError(f"owners must lie in [0, {d})")
    return own


def _run_one(prob: _Problem, name: str, owners: np.ndarray | None) -> np.ndarray:
    if name == "lpt":
        return lpt(prob)
    if name == "kk":
        return _kk_capped(prob)
    if name == "lpt+refine":
        return refine(prob, lpt(prob))
    if name == "kk+refine":
        return refine(prob, _kk_capped(prob))
    if name == "exact":
        try:
            start, error = refine(prob, lpt(prob)), None
        except InfeasibleCapError as e:
            start, error = None, e
        bins = branch_and_bound(prob, start)
        if bins is None:
            raise error  # type: ignore[misc]
        return bins
    if name == "repair":
        target = _max_q(prob, refine(prob, _kk_capped(prob)))
        bins = repair(prob, owners, target)
        if bins is None:
            raise ValueError(
                f"repair could not bring every bin under the load {target * prob.scale:.6g} "
                f"that KK+refine reaches; use 'auto', which then keeps another algorithm"
            )
        return bins
    raise ValueError(name)


def _max_q(prob: _Problem, bins: np.ndarray) -> int:
    return int(_loads(prob.q, bins, prob.d).max()) if prob.n else 0


def _auto_candidates(
    prob: _Problem, owners: np.ndarray | None, slack: float = 0.0
) -> list[tuple[str, np.ndarray, bool]]:
    out: list[tuple[str, np.ndarray, bool]] = []
    errors: list[InfeasibleCapError] = []
    for name, fn in (("lpt", lambda: lpt(prob)), ("kk", lambda: _kk_capped(prob))):
        try:
            out.append((name, fn(), False))
        except InfeasibleCapError as e:
            errors.append(e)
            continue
        if _max_q(prob, out[-1][1]) <= prob.lb_q:
            break  # provably optimal: nothing can beat it, only repair can move less
    if not out:
        # Every greedy failed the cap; a small problem may still have a packing.
        found = branch_and_bound(prob, None) if prob.n <= prob.budget.exact_max_items else None
        if found is None:
            raise errors[0]
        out.append(("exact", found, False))
    # Refine both on small problems; on large ones only the better start (refine costs more
    # than LPT and KK together there, and rarely reverses their order).
    starts = list(out)
    if prob.n > prob.budget.refine_both_max:
        starts = [min(out, key=lambda c: _max_q(prob, c[1]))]
    for name, bins, _ in starts:
        if _max_q(prob, bins) > prob.lb_q:
            out.append((name + "+refine", refine(prob, bins), False))
    best = min(out, key=lambda c: _max_q(prob, c[1]))
    if prob.n <= prob.budget.exact_max_items:
        exact = branch_and_bound(prob, best[1])
        out.append(("exact", exact, False))
        best = min(out, key=lambda c: _max_q(prob, c[1]))
    if owners is not None:
        target = _max_q(prob, best[1])
        target += int(target * slack)
        fixed = repair(prob, owners, target)
        if fixed is not None:
            out.append(("repair", fixed, True))
    return out


def _choose(
    prob: _Problem,
    cands: list[tuple[str, np.ndarray, bool]],
    owners: np.ndarray | None,
    wts: np.ndarray | None,
    gpus_per_node: int,
    slack: float = 0.0,
) -> BalanceResult:
    maxes = [_max_q(prob, b) for _, b, _ in cands]
    best_max = min(maxes)
    if owners is not None:
        best_max += int(best_max * slack)
    scored: list[Candidate | None] = [None] * len(cands)
    chosen: tuple[int, np.ndarray, int | None] | None = None  # (index, ranks, moved)
    # Among ties the fewest moved items wins. Candidates whose bins already are ranks go
    # first; the others are mapped to ranks only when even their best mapping could beat the
    # incumbent, and duplicates of an earlier candidate are skipped.
    order = sorted(range(len(cands)), key=lambda k: (not cands[k][2], k))
    seen: list[np.ndarray] = []
    for i in order:
        name, bins, are_ranks = cands[i]
        m = maxes[i]
        moved = None
        if m == best_max and owners is None:
            if chosen is None:
                chosen = (i, bins, None)
        elif m <= best_max and not any(np.array_equal(bins, b) for b in seen):
            seen.append(bins)
            ranks = None
            if are_ranks:
                ranks = bins
            elif chosen is None or moved_lower_bound(bins, owners, prob.d) < chosen[2]:
                mapping = map_bins_to_ranks(bins, owners, wts, prob.d, gpus_per_node)
                ranks = mapping.bin_to_rank[bins]
            if ranks is not None:
                moved = int(np.count_nonzero(ranks != owners))
                better = chosen is None or moved < chosen[2]
                if not better and moved == chosen[2]:
                    # Equal movement: the lower max load, then the earlier candidate.
                    better = (m, i) < (maxes[chosen[0]], chosen[0])
                if better:
                    chosen = (i, ranks, moved)
        scored[i] = Candidate(name, m * prob.scale, moved)
    assert chosen is not None
    idx, bins, moved = chosen
    loads = np.bincount(bins, weights=_costs_back(prob), minlength=prob.d).astype(np.float64)
    out_sizes = None
    if prob.sizes is not None:
        out_sizes = np.bincount(bins, weights=prob.sizes, minlength=prob.d).astype(np.int64)
    ordinary = moved_w = None
    if owners is not None:
        ordinary = np.bincount(owners, weights=_costs_back(prob), minlength=prob.d)
        w = np.ones(prob.n) if wts is None else wts
        moved_w = float(w[bins != owners].sum())
    return BalanceResult(
        bins=bins.astype(np.int64),
        loads=loads,
        algorithm=cands[idx][0],
        sizes=out_sizes,
        ordinary_loads=ordinary,
        moved_items=moved,
        moved_weight=moved_w,
        candidates=tuple(c for c in scored if c is not None),
        lower_bound=prob.lb_q * prob.scale,
    )


def _costs_back(prob: _Problem) -> np.ndarray:
    return prob.costs


# --------------------------------------------------------------------------------------------
# LPT


def lpt(
    prob: _Problem,
    items: np.ndarray | None = None,
    init: np.ndarray | None = None,
    init_sizes: np.ndarray | None = None,
    bins_out: np.ndarray | None = None,
) -> np.ndarray:
    """Exact LPT (see the module doc), vectorised in rounds, honouring the cap.

    Args:
        prob: the problem.
        items: indices of the items to place, in placement order (default: all, by decreasing
            cost); used by the cap repair to re-place a few items onto existing loads.
        init: (d,) int64 loads to start from (default zeros).
        init_sizes: (d,) summed sizes to start from, with a cap.
        bins_out: (n,) array to write the bins into (default: a new one, -1 where unplaced).

    Raises:
        InfeasibleCapError: an item fits in no bin.
    """
    d = prob.d
    order = prob.order if items is None else np.asarray(items, dtype=np.int64)
    loads = np.zeros(d, dtype=np.int64) if init is None else init.astype(np.int64).copy()
    capped = prob.cap is not None
    used = None
    if capped:
        used = np.zeros(d, dtype=np.int64) if init_sizes is None else init_sizes.copy()
    out = np.full(prob.n, -1, dtype=np.int64) if bins_out is None else bins_out
    q = prob.q
    m = order.size
    j = 0
    rounds = 0
    while j < m:
        rounds += 1
        take = min(d, m - j)
        # A stable sort keeps equal loads in bin order: ties go to the lowest index.
        sorted_bins = np.argsort(loads, kind="stable")[:take]
        items_j = order[j : j + take]
        p = q[items_j]
        lb = loads[sorted_bins]
        if rounds <= prob.budget.lpt_exact_rounds and take > 1:
            # Fresh bin t+1 is the sequential choice for item t+1 only if it is lighter than
            # every bin already updated in this round (ties stop the round: the next round's
            # sort then breaks them by index, exactly as a heap would).
            upd = np.minimum.accumulate(lb + p)
            ok = lb[1:] < upd[:-1]
            k = 1 + (int(np.argmin(ok)) if not ok.all() else take - 1)
        else:
            k = take
        if capped:
            fits = used[sorted_bins[:k]] + prob.sizes[items_j[:k]] <= prob.cap
            if not fits.all():
                k = int(np.argmin(fits))
                if k == 0:
                    # The lightest bin is full for this item: place it alone on the lightest
                    # bin where it fits, as the sequential capped rule would.
                    i = int(items_j[0])
                    free = used + prob.sizes[i] <= prob.cap
                    if not free.any():
                        raise InfeasibleCapError(
                            f"LPT could not fit {prob.label(i)} (size {int(prob.sizes[i])}) in "
                            f"any of {d} bins under the cap {prob.cap}: every bin is too full "
                            f"(greedy failure; total size {int(prob.sizes.sum())}, "
                            f"d x cap = {d * prob.cap}); raise the cap or add bins",
                            item=i,
                            label=prob.label(i),
                            size=int(prob.sizes[i]),
                            cap=prob.cap,
                        )
                    cand = np.flatnonzero(free)
                    b = int(cand[np.lexsort((cand, loads[cand]))[0]])
                    out[i] = b
                    loads[b] += q[i]
                    used[b] += prob.sizes[i]
                    j += 1
                    continue
        chosen = sorted_bins[:k]
        out[items_j[:k]] = chosen
        loads[chosen] += p[:k]
        if capped:
            used[chosen] += prob.sizes[items_j[:k]]
        j += k
    return out


# --------------------------------------------------------------------------------------------
# Karmarkar-Karp


def karmarkar_karp(prob: _Problem) -> np.ndarray:
    """Multiway largest differencing (see the module doc); ignores the cap."""
    d, n = prob.d, prob.n
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if d == 1:
        return np.zeros(n, dtype=np.int64)
    if n <= prob.budget.kk_itemwise_max:
        return _kk_itemwise(prob)
    return _kk_runs(prob)


def _kk_itemwise(prob: _Problem) -> np.ndarray:
    """Item-wise KK in plain Python (fast at small ``d``).

    A partial solution is a list of ``(sum, subset id)`` in increasing order. Merging A (the
    larger spread) with B pairs A's largest subset with B's smallest, and so on; B's subset
    ids then point to A's (union-find), so no member list is ever copied. A singleton item
    joining a partial solution is the same merge done as one sorted insertion.
    """
    d, n = prob.d, prob.n
    q = prob.q.tolist()
    order = prob.order.tolist()
    item_subset = [0] * n
    parent: list[int] = []  # subset id -> the id it was merged into (itself for a root)

    def new_ids(count: int) -> range:
        start = len(parent)
        parent.extend(range(start, start + count))
        return range(start, start + count)

    parts: list = list(order)  # an int is a singleton item, not yet materialised
    heap = [(-q[i], k) for k, i in enumerate(order)]
    heapq.heapify(heap)

    def materialize(p) -> list:
        if not isinstance(p, int):
            return p
        ids = new_ids(d)
        item_subset[p] = ids[d - 1]
        return [(0, ids[j]) for j in range(d - 1)] + [(q[p], ids[d - 1])]

    while len(heap) > 1:
        # Ties in spread pop the older partial solution first (the heap's second key).
        _, ka = heapq.heappop(heap)
        _, kb = heapq.heappop(heap)
        pa, pb = parts[ka], parts[kb]
        parts[ka] = parts[kb] = None
        if isinstance(pa, int) or isinstance(pb, int):
            single, other = (pb, pa) if isinstance(pb, int) else (pa, pb)
            other = materialize(other)
            s0, sid = other.pop(0)
            item_subset[single] = sid
            bisect.insort(other, (s0 + q[single], sid))
            merged = other
        else:
            # pa has the larger spread: its largest subsets meet pb's smallest.
            merged = []
            for (sa, ia), (sb, ib) in zip(reversed(pa), pb):
                parent[ib] = ia
                merged.append((sa + sb, ia))
            merged.sort()
        parts.append(merged)
        heapq.heappush(heap, (merged[0][0] - merged[-1][0], len(parts) - 1))
    final = materialize(parts[heap[0][1]])

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # Bin 0 is the largest subset, as in the other algorithms' output (labels are arbitrary).
    bin_of_root = {sid: d - 1 - k for k, (_, sid) in enumerate(final)}
    return np.fromiter(
        (bin_of_root[root(item_subset[i])] for i in range(n)), dtype=np.int64, count=n
    )


def _kk_runs(prob: _Problem) -> np.ndarray:
    """KK over runs of ``ceil(d/2)`` items, vectorised with numpy (large ``n``).

    Subset ``j`` of run ``k`` has id ``k*d + j``. A merge records, for each subset of B, the
    subset of A it joins, so members are never copied; item bins are resolved once at the
    end, replaying the merges backwards.
    """
    d, n, q = prob.d, prob.n, prob.q
    order = prob.order
    # Runs of r = ceil(d/2) items in decreasing order, one item per subset, the other subsets
    # empty: runs of d would force every bin to take one item of every run, i.e. equal
    # counts, which is far from optimal when a few items dominate.
    r = -(-d // 2)
    num_runs = -(-n // r)
    joins: list[tuple[np.ndarray, np.ndarray]] = []  # (ids of B, the ids of A they join)
    parts: list = []
    for k in range(num_runs):
        run = order[k * r : (k + 1) * r]
        sums = np.zeros(d, dtype=np.int64)
        sums[: run.size] = q[run]
        parts.append((sums, np.arange(k * d, (k + 1) * d, dtype=np.int64)))
    heap = [(-int(p[0][0] - p[0][-1]), k) for k, p in enumerate(parts)]
    heapq.heapify(heap)
    rev = np.arange(d - 1, -1, -1)
    while len(heap) > 1:
        _, ka = heapq.heappop(heap)
        _, kb = heapq.heappop(heap)
        (sa, ia), (sb, ib) = parts[ka], parts[kb]
        parts[ka] = parts[kb] = None
        # Largest subset of A with the smallest of B: slot j of A meets slot d-1-j of B.
        joins.append((ib[rev], ia))
        c = sa + sb[rev]
        new_order = np.argsort(-c, kind="stable")
        sums = c[new_order]
        sums -= sums[-1]  # only differences matter; keeps the numbers small
        parts.append((sums, ia[new_order]))
        heapq.heappush(heap, (-int(sums[0]), len(parts) - 1))
    _, final_ids = parts[heap[0][1]]
    slot = np.empty(num_runs * d, dtype=np.int64)
    slot[final_ids] = np.arange(d)
    # A joined subset ends where the subset it joined ends; later merges resolve first.
    for ib, ia in reversed(joins):
        slot[ib] = slot[ia]
    item_ids = np.empty(n, dtype=np.int64)
    pos = np.arange(n)
    item_ids[order] = (pos // r) * d + pos % r
    return slot[item_ids]


def _kk_capped(prob: _Problem) -> np.ndarray:
    bins = karmarkar_karp(prob)
    if prob.cap is None or prob.fits(bins):
        return bins
    return _repair_cap(prob, bins)


def _repair_cap(prob: _Problem, bins: np.ndarray) -> np.ndarray:
    """Lift items (largest size first) off over-cap bins and re-place them by capped LPT."""
    bins = bins.copy()
    used = np.bincount(bins, weights=prob.sizes, minlength=prob.d).astype(np.int64)
    over = np.flatnonzero(used > prob.cap)
    lifted = []
    for b in over:
        members = np.flatnonzero(bins == b)
        members = members[np.lexsort((members, -prob.sizes[members]))]
        excess = used[b] - prob.cap
        k = int(np.searchsorted(np.cumsum(prob.sizes[members]), excess)) + 1
        lifted.append(members[:k])
        used[b] -= int(prob.sizes[members[:k]].sum())
        bins[members[:k]] = -1
    lifted = np.concatenate(lifted)
    lifted = lifted[np.lexsort((lifted, -prob.q[lifted]))]
    keep = bins >= 0
    loads = _loads(prob.q[keep], bins[keep], prob.d)
    return lpt(prob, items=lifted, init=loads, init_sizes=used, bins_out=bins)


# --------------------------------------------------------------------------------------------
# Refinement


def refine(prob: _Problem, bins: np.ndarray, iters: int | None = None) -> np.ndarray:
    """Moves and pairwise swaps that lower the heaviest loads (see the module doc).

    Up to ``SMALL_D`` bins, each step pairs the heaviest bin with every other bin and applies
    the single best move or swap. Beyond, each step pairs the ``refine_pairs`` heaviest bins
    with the as many lightest (heaviest with lightest) and applies the best move or swap of
    every pair at once, vectorised: with thousands of bins the max is held by many bins at
    once, and fixing one per step would not lower it.
    """
    bins = bins.copy()
    if prob.n == 0 or prob.d == 1:
        return bins
    if prob.d <= SMALL_D:
        return _refine_single(prob, bins, prob.budget.refine_iters if iters is None else iters)
    return _refine_pairs(prob, bins, prob.budget.refine_rounds if iters is None else iters)


SMALL_D = 64
"""Up to this many bins refine pairs the heaviest bin with all others."""


def _refine_single(prob: _Problem, bins: np.ndarray, iters: int) -> np.ndarray:
    d, q = prob.d, prob.q
    loads = _loads(q, bins, d)
    capped = prob.cap is not None
    sizes = prob.sizes if capped else None
    used = np.bincount(bins, weights=sizes, minlength=d).astype(np.int64) if capped else None
    slot_bins = np.arange(d)
    big = np.iinfo(np.int64).max
    for _ in range(iters):
        top = int(np.argmax(loads))
        top_load = int(loads[top])
        if top_load <= prob.lb_q:
            break  # provably optimal
        x_items = np.flatnonzero(bins == top)
        # Partners: every item elsewhere, plus an empty slot in every other bin (a move).
        y_items = np.concatenate((np.flatnonzero(bins != top), np.full(d, -1)))
        y_bin = np.concatenate((bins[y_items[:-d]], slot_bins))
        keep = y_bin != top
        y_items, y_bin = y_items[keep], y_bin[keep]
        y = np.where(y_items >= 0, q[y_items], 0)
        delta = q[x_items][:, None] - y[None, :]
        new_max = np.maximum(top_load - delta, loads[y_bin][None, :] + delta)
        valid = (delta > 0) & (new_max < top_load)
        if capped:
            sx = sizes[x_items][:, None]
            sy = np.where(y_items >= 0, sizes[y_items], 0)[None, :]
            valid &= (used[top] - sx + sy <= prob.cap) & (
                used[y_bin][None, :] + sx - sy <= prob.cap
            )
        if not valid.any():
            break
        flat = int(np.argmin(np.where(valid, new_max, big)))
        a, b = divmod(flat, y.size)
        _apply(prob, bins, loads, used, int(x_items[a]), int(y_items[b]), top, int(y_bin[b]))
    return bins


def _apply(prob, bins, loads, used, i: int, j: int, src: int, dst: int) -> None:
    """Move item ``i`` from ``src`` to ``dst`` and, if ``j >= 0``, item ``j`` back."""
    q = prob.q
    bins[i] = dst
    loads[src] -= q[i]
    loads[dst] += q[i]
    if used is not None:
        used[src] -= prob.sizes[i]
        used[dst] += prob.sizes[i]
    if j >= 0:
        bins[j] = src
        loads[dst] -= q[j]
        loads[src] += q[j]
        if used is not None:
            used[dst] -= prob.sizes[j]
            used[src] += prob.sizes[j]


def _refine_pairs(prob: _Problem, bins: np.ndarray, iters: int) -> np.ndarray:
    d, q, n = prob.d, prob.q, prob.n
    loads = _loads(q, bins, d)
    capped = prob.cap is not None
    sizes = prob.sizes
    used = np.bincount(bins, weights=sizes, minlength=d).astype(np.int64) if capped else None
    # Members of every bin as a padded matrix (-1 = empty), with room for items moved in.
    counts = np.bincount(bins, minlength=d)
    width = int(counts.max()) + min(iters, 8) + 1
    by_bin = np.argsort(bins, kind="stable")
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    col = np.arange(n) - np.repeat(starts, counts)
    mat = np.full((d, width), -1, dtype=np.int64)
    mat[bins[by_bin], col] = by_bin
    fill = counts.copy()  # next free column of each row
    big = np.iinfo(np.int64).max
    pairs = min(d // 2, prob.budget.refine_pairs)
    qx = np.r_[q, 0]  # q[-1] reads 0: an empty slot costs nothing
    # For the light bins' slots, an empty one reads as too heavy to swap for anything, so
    # that each light bin offers one move, in its extra last column (no mask needed).
    qy = np.r_[q, np.int64(1) << np.int64(60)]
    sx_all = np.r_[sizes, 0] if capped else None
    history: list[int] = []
    for _ in range(iters):
        top = int(loads.max())
        # Stop at the lower bound, or when 4 rounds gained less than 0.1% (a max held by many
        # bins may take a few rounds to fall; tiny swaps of near-equal items are not worth it).
        if top <= prob.lb_q or (len(history) >= 4 and history[-4] - top < top // 1000):
            break
        history.append(top)
        order = np.argsort(-loads, kind="stable")
        heavy, light = order[:pairs], order[::-1][:pairs]
        hl, ll = loads[heavy][:, None, None], loads[light][:, None, None]
        xi = mat[heavy]  # (P, W)
        yi = np.concatenate((mat[light], np.full((pairs, 1), -1)), axis=1)  # + a move slot
        yv = qy[yi]
        yv[:, -1] = 0
        delta = qx[xi][:, :, None] - yv[:, None, :]
        new_max = np.maximum(hl - delta, ll + delta)
        # new_max < hl implies delta > 0, which also rules out empty x slots (qx = 0) and
        # empty y slots but the move column (qy huge).
        valid = new_max < hl
        if capped:
            sx = sx_all[xi][:, :, None]
            sy = sx_all[yi][:, None, :]
            valid &= used[heavy][:, None, None] - sx + sy <= prob.cap
            valid &= used[light][:, None, None] + sx - sy <= prob.cap
        score = np.where(valid, new_max, big).reshape(pairs, -1)
        best = np.argmin(score, axis=1)
        ok = score[np.arange(pairs), best] < big
        if not ok[0]:
            break  # the heaviest bin cannot improve against the lightest
        p = np.flatnonzero(ok)
        a, b = np.divmod(best[p], yi.shape[1])
        h, l = heavy[p], light[p]
        i = xi[p, a]
        j = yi[p, b]
        swap = j >= 0
        bins[i] = l
        bins[j[swap]] = h[swap]
        dq = q[i] - np.where(swap, q[np.maximum(j, 0)], 0)
        loads[h] -= dq
        loads[l] += dq
        if capped:
            ds = sizes[i] - np.where(swap, sizes[np.maximum(j, 0)], 0)
            used[h] -= ds
            used[l] += ds
        # Update the member matrix: a swap trades places; a move leaves a hole and appends.
        mat[h, a] = np.where(swap, j, -1)
        sw_l, sw_b = l[swap], b[swap]
        mat[sw_l, sw_b] = i[swap]
        mv = ~swap
        if mv.any():
            need = int(fill[l[mv]].max()) + 1
            if need > mat.shape[1]:
                mat = np.concatenate((mat, np.full((d, need - mat.shape[1]), -1)), axis=1)
            mat[l[mv], fill[l[mv]]] = i[mv]
            fill[l[mv]] += 1
    return bins


# --------------------------------------------------------------------------------------------
# Locality-preserving repair


def repair(prob: _Problem, owners: np.ndarray, target: int) -> np.ndarray | None:
    """Items stay with their owners unless their bin exceeds ``target`` (or the cap).

    Rounds of: lift items off every bin above the target (per bin the smallest single item
    that brings it under, else its largest items), then place the lifted items largest first
    on the lightest bins. A placed item is pinned (never lifted again); a bin that a placed item
    pushes over the target sheds its own unpinned items in the next round (an ejection chain),
    which is how a large item finds room on a bin that had none. At most ``repair_rounds``
    rounds.

    Returns:
        The assignment, or None when some bin cannot get under the target.
    """
    d, q, n = prob.d, prob.q, prob.n
    bins = owners.astype(np.int64).copy()
    loads = _loads(q, bins, d)
    capped = prob.cap is not None
    used = np.bincount(bins, weights=prob.sizes, minlength=d).astype(np.int64) if capped else None
    pinned = np.zeros(n, dtype=bool)
    last_over = n + 1
    for _ in range(prob.budget.repair_rounds):
        over = loads > target
        if capped:
            over |= used > prob.cap
        num_over = int(np.count_nonzero(over))
        if num_over == 0:
            return bins
        if num_over > last_over:
            return None  # the chain is spreading, not converging
        last_over = num_over
        lifted = _select_lift(prob, bins, loads, used, over, pinned, target)
        if lifted is None:
            return None
        loads -= _loads(q[lifted], bins[lifted], d)
        if capped:
            used -= _loads(prob.sizes[lifted], bins[lifted], d)
        bins[lifted] = -1
        lifted = lifted[np.lexsort((lifted, -q[lifted]))]
        try:
            lpt(prob, items=lifted, init=loads, init_sizes=used, bins_out=bins)
        except InfeasibleCapError:
            return None
        pinned[lifted] = True
        # Only the lifted items changed bins: update the loads, don't recount every item.
        loads += _loads(q[lifted], bins[lifted], d)
        if capped:
            used += _loads(prob.sizes[lifted], bins[lifted], d)
    return None


def _select_lift(prob, bins, loads, used, over, pinned, target) -> np.ndarray | None:
    """Items to lift off the over bins (see :func:`repair`); None if a bin cannot shed enough."""
    q = prob.q
    capped = prob.cap is not None
    cand = np.flatnonzero(over[bins] & ~pinned)
    cb = bins[cand]
    # Candidates by (bin, cost ascending, index): each over bin is a segment.
    # One int64 key (bin, cost): quantised costs < 2**39 and bins < 2**20 fit; the stable
    # sort keeps index order among equals.
    shift = np.int64(1) << np.int64(40)
    cand = cand[np.argsort(cb * shift + q[cand], kind="stable")]
    cb, sq = bins[cand], q[cand]
    over_bins = np.flatnonzero(over)
    seg = np.searchsorted(cb, np.r_[over_bins, over_bins[-1] + 1])
    start, end = seg[:-1], seg[1:]
    excess = loads[over_bins] - target
    lift = np.zeros(cand.size, dtype=bool)
    if not capped:
        # The smallest single item that suffices: searchsorted on the (bin, cost) keys.
        keys = cb * shift + sq
        pos = np.searchsorted(keys, over_bins * shift + np.minimum(excess, int(shift) - 1))
        single = (pos < end) & (excess < shift)
        lift[pos[single]] = True
        multi = np.flatnonzero(~single)
        if multi.size:
            # Largest items first, as few as reach the excess: the segment's suffix from the
            # last position t with csum[t] <= csum[end] - excess (csum is non-decreasing).
            csum = np.r_[0, np.cumsum(sq)]
            st, en = start[multi], end[multi]
            t = np.searchsorted(csum, csum[en] - excess[multi], side="right") - 1
            if np.any(t < st):
                return None
            mark = np.zeros(cand.size + 1, dtype=np.int64)
            np.add.at(mark, t, 1)
            np.add.at(mark, en, -1)
            lift |= np.cumsum(mark[:-1]) > 0
    else:
        for k, b in enumerate(over_bins.tolist()):
            where = np.arange(start[k], end[k])
            members = cand[where]
            ex = max(int(loads[b]) - target, 0)
            size_ex = max(int(used[b]) - prob.cap, 0)
            suff = (q[members] >= ex) & (prob.sizes[members] >= size_ex)
            if suff.any():
                lift[where[np.flatnonzero(suff)[0]]] = True
                continue
            desc = where[::-1]
            k1 = int(np.searchsorted(np.cumsum(q[cand[desc]]), ex)) + 1 if ex > 0 else 0
            k2 = (
                int(np.searchsorted(np.cumsum(prob.sizes[cand[desc]]), size_ex)) + 1
                if size_ex > 0
                else 0
            )
            if max(k1, k2) > desc.size:
                return None
            lift[desc[: max(k1, k2)]] = True
    return cand[lift]


# --------------------------------------------------------------------------------------------
# Branch and bound (small instances)


def branch_and_bound(prob: _Problem, incumbent: np.ndarray | None) -> np.ndarray | None:
    """Exact search for small ``n``, improving on ``incumbent``, within the node budget.

    Returns:
        The best assignment found (``incumbent`` if none beats it), or None when there is no
        incumbent and no assignment meeting the cap was found.
    """
    d, n = prob.d, prob.n
    order = prob.order.tolist()
    q = [int(prob.q[i]) for i in order]
    sz = [int(prob.sizes[i]) for i in order] if prob.cap is not None else None
    cap = prob.cap
    if incumbent is not None:
        best = [_max_q(prob, incumbent), None]
        if best[0] <= prob.lb_q:
            return incumbent
    else:
        best = [sum(q) + 1, None]
    suffix = [0] * (n + 1)
    for k in range(n - 1, -1, -1):
        suffix[k] = suffix[k + 1] + q[k]
    loads = [0] * d
    used = [0] * d
    assign = [0] * n
    nodes = [0]
    limit = prob.budget.exact_nodes

    def dfs(k: int, cur_max: int) -> bool:
        nodes[0] += 1
        if nodes[0] > limit:
            return True
        if k == n:
            best[0] = cur_max
            best[1] = list(assign)
            return best[0] <= prob.lb_q
        # Even spreading the rest perfectly cannot beat the incumbent.
        if -(-(sum(loads) + suffix[k]) // d) >= best[0]:
            return False
        seen = set()
        for b in range(d):
            key = (loads[b], used[b])
            if key in seen:
                continue  # symmetric to a bin already tried
            seen.add(key)
            new = loads[b] + q[k]
            if new >= best[0]:
                continue
            if sz is not None and used[b] + sz[k] > cap:
                continue
            loads[b] = new
            used[b] += sz[k] if sz is not None else 0
            assign[k] = b
            stop = dfs(k + 1, max(cur_max, new))
            loads[b] -= q[k]
            used[b] -= sz[k] if sz is not None else 0
            if stop:
                return True
        return False

    dfs(0, 0)
    if best[1] is None:
        return incumbent
    out = np.empty(n, dtype=np.int64)
    out[np.asarray(order, dtype=np.int64)] = best[1]
    return out


# --------------------------------------------------------------------------------------------
# Padded cost


@dataclass(frozen=True, slots=True)
class PaddedResult:
    """An exact assignment for padded execution."""

    bins: np.ndarray
    """(n,) bin of each item."""

    loads: np.ndarray
    """(d,) ``count * f(max length)`` of each bin."""

    @property
    def max_load(self) -> float:
        """The largest bin load (the optimum)."""
        return float(self.loads.max()) if self.loads.size else 0.0


def balance_padded(
    lengths: np.ndarray,
    num_bins: int,
    length_cost: Callable[[np.ndarray], np.ndarray],
    *,
    cap: int | None = None,
    labels: Labels = None,
) -> PaddedResult:
    """Exact minimum of ``max_bin count * f(max length)`` when each bin is padded.

    Args:
        lengths: (n,) tokens of each item (> 0).
        num_bins: ``d``.
        length_cost: ``f``, vectorised, non-decreasing, >= 0: cost of one sequence padded to a
            length (e.g. ``PhaseCostModel.padded_length_cost`` via ``np.vectorize``, or
            ``lambda L: a*L + b*L**2 + c``). For a fixed pad length pass lengths all equal to it.
        cap: largest padded size ``count * max length`` of a bin.
        labels: names items in errors.

    Correctness. (1) *Contiguity.* Sort items by decreasing length. Some optimal solution has
    groups that are contiguous runs of this order: take any solution, order its groups by their
    longest item ``m_1 >= m_2 >= ...``, with sizes ``k_1, k_2, ...``, and give group ``j`` the
    sorted items ``K_{j-1}+1 .. K_j`` instead (``K_j = k_1 + ... + k_j``). Of the
    ``K_{j-1}+1`` longest items at most ``K_{j-1}`` sit in groups ``1..j-1``, so one sits in a
    group ``j' >= j`` and is at most ``m_{j'} <= m_j``; hence the new group ``j``, whose longest
    is the ``(K_{j-1}+1)``-th longest item, is no longer than ``m_j``. Counts are unchanged and
    ``f`` is non-decreasing, so no group costs more (nor exceeds the cap). (2) *Feasibility of a
    makespan T* over contiguous runs is decided exactly by the greedy that makes each run, from
    its first (longest) item ``i``, as long as allowed, ``min(floor(T / f(L_i)),
    floor(cap / L_i))`` items: any feasible solution's first run ends no later, and the rest of
    the items (a suffix) is covered by the remaining runs, since a later start is never longer.
    (3) *Search.* The optimum is one of the values ``k f(L_i)``; we bisect on T, and each time
    jump to the smallest such value above the infeasible bound, ``min_i f(L_i)(floor(lo /
    f(L_i)) + 1)``, stopping when it reaches the best feasible value found: no candidate lies
    in between. Cost O(n log n + (log range) * min(n, d)).

    Raises:
        InfeasibleCapError: one item is longer than ``cap``.
    """
    L = np.asarray(lengths, dtype=np.int64)
    d = int(num_bins)
    n = L.size
    if d <= 0:
        raise ValueError(f"num_bins must be positive, got {num_bins}")
    if n == 0:
        return PaddedResult(np.zeros(0, dtype=np.int64), np.zeros(d))
    if cap is not None:
        big = np.flatnonzero(L > cap)
        if big.size:
            i = int(big[np.argmax(L[big])])
            raise InfeasibleCapError(
                f"{_label(labels, i)} has {int(L[i])} tokens, more than the cap {cap}",
                item=i,
                label=_label(labels, i),
                size=int(L[i]),
                cap=int(cap),
            )
    order = np.lexsort((np.arange(n), -L))
    Ls = L[order]
    f = np.asarray(length_cost(Ls.astype(np.float64)), dtype=np.float64)
    if np.any(np.diff(f) > 0) or np.any(f < 0):
        raise ValueError("length_cost must be >= 0 and non-decreasing in the length")
    f = np.maximum(f, np.finfo(np.float64).tiny)
    cap_k = (
        np.full(n, n, dtype=np.int64) if cap is None else np.asarray(int(cap) // Ls, dtype=np.int64)
    )
    f_list, capk_list = f.tolist(), cap_k.tolist()
    tol = 1.0 + 1e-12

    def greedy(T: float) -> tuple[bool, float, list[int]]:
        i, starts, worst = 0, [], 0.0
        while i < n:
            if len(starts) == d:
                return False, 0.0, []
            k = min(int(T / f_list[i] * tol) if T < float("inf") else n, capk_list[i], n - i)
            if k <= 0:
                return False, 0.0, []
            starts.append(i)
            worst = max(worst, k * f_list[i])
            i += k
        return True, worst, starts

    ok, hi, starts = greedy(float("inf"))
    if not ok:
        raise InfeasibleCapError(
            f"{n} items cannot be padded into {d} bins under the cap {cap} "
            f"(each bin holds at most cap // longest items)",
            cap=cap,
        )
    lo = 0.0
    while True:
        k_lo = np.floor(lo / f * tol) + 1
        nxt = float(np.min(f * k_lo))
        if nxt >= hi:
            break
        mid = max(nxt, 0.5 * (lo + hi))
        ok, worst, st = greedy(mid)
        if ok:
            hi, starts = worst, st
        else:
            lo = mid
    bins_sorted = np.zeros(n, dtype=np.int64)
    bounds = starts + [n]
    for g in range(len(starts)):
        bins_sorted[bounds[g] : bounds[g + 1]] = g
    bins = np.empty(n, dtype=np.int64)
    bins[order] = bins_sorted
    counts = np.bincount(bins, minlength=d)
    first_len = np.zeros(d)
    first_len[: len(starts)] = f[np.asarray(starts, dtype=np.int64)]
    return PaddedResult(bins, counts * first_len)

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Padded cost: a bin runs its items padded to its longest, so its load is ``count * f(max)``.

:func:`balance_padded` solves it exactly; its docstring has the proof.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from orchestration.balance.problem import InfeasibleCapError, Labels, item_label


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
                f"{item_label(labels, i)} has {int(L[i])} tokens, more than the cap {cap}",
                item=i,
                label=item_label(labels, i),
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

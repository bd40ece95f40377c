# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Karmarkar–Karp multiway largest differencing, item-wise and over runs of items.

:mod:`orchestration.balance` (``kk``) describes both variants and when each runs. KK ignores
the cap; :func:`karmarkar_karp_capped` repairs its result with capped LPT.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from orchestration.balance.greedy import lpt
from orchestration.balance.problem import BalanceProblem, int_loads


def karmarkar_karp(prob: BalanceProblem) -> np.ndarray:
    """Multiway largest differencing (see :mod:`orchestration.balance`); ignores the cap."""
    d, n = prob.d, prob.n
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if d == 1:
        return np.zeros(n, dtype=np.int64)
    if n <= prob.budget.kk_itemwise_max:
        return _kk_itemwise(prob)
    return _kk_runs(prob)


def _kk_itemwise(prob: BalanceProblem) -> np.ndarray:
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


def _kk_runs(prob: BalanceProblem) -> np.ndarray:
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


def karmarkar_karp_capped(prob: BalanceProblem) -> np.ndarray:
    """KK, then, if it breaks the cap, its over-cap bins repaired by capped LPT."""
    bins = karmarkar_karp(prob)
    if prob.cap is None or prob.fits(bins):
        return bins
    return _repair_cap(prob, bins)


def _repair_cap(prob: BalanceProblem, bins: np.ndarray) -> np.ndarray:
    """Lift items off over-cap bins and re-place them by capped LPT: per kind of size over its
    cap, the bin's largest items in that kind, as few as bring it under."""
    bins = bins.copy()
    used = prob.bin_sizes(bins)
    over = np.flatnonzero(np.any(used > prob.cap, axis=1))
    lifted = []
    for b in over:
        members = np.flatnonzero(bins == b)
        for c in np.flatnonzero(used[b] > prob.cap).tolist():
            excess = used[b, c] - prob.cap[c]
            if excess <= 0:  # lifting for an earlier kind already brought this one under
                continue
            members = members[np.lexsort((members, -prob.sizes[members, c]))]
            k = int(np.searchsorted(np.cumsum(prob.sizes[members, c]), excess)) + 1
            lifted.append(members[:k])
            used[b] -= prob.sizes[members[:k]].sum(axis=0)
            bins[members[:k]] = -1
            members = members[k:]
    lifted = np.concatenate(lifted)
    lifted = lifted[np.lexsort((lifted, -prob.q[lifted]))]
    keep = bins >= 0
    loads = int_loads(prob.q[keep], bins[keep], prob.d)
    return lpt(prob, items=lifted, init=loads, init_sizes=used, bins_out=bins)

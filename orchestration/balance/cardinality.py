# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A floor on the items per bin, for costs that depend on how many items a bin holds.

The LLM phase runs a rank's samples as microbatches: ``min(M, samples)`` of them, ``M`` the
step's microbatch count. Where each microbatch carries a fixed cost (a forward and a backward
call, their kernel launches; on the 2-core CPU main job about 25 ms of a 100 ms LLM phase), a
rank left with fewer than ``M`` samples runs fewer microbatches and finishes far earlier than
its additive per-sample costs say: measured, 16 ms against the other rank's 53 ms, where the
plan predicted them within 12%. Per-item costs cannot express a per-microbatch term, so the
planner keeps every rank at ``M`` samples or more, as Megatron's own assignment does, and the
microbatch count is the same on every rank again.
"""

from __future__ import annotations

import numpy as np


def hold_at_least(
    bins: np.ndarray,
    costs: np.ndarray,
    d: int,
    minimum: int,
    sizes: np.ndarray | None = None,
    cap: int | None = None,
) -> np.ndarray | None:
    """``bins`` with every bin holding at least ``minimum`` items, by moving items from bins
    above the floor; None where it cannot (too few items, or a ``cap`` on the summed
    ``sizes`` per bin that every possible move would break).

    Each move fills the lowest-indexed bin below the floor with the cheapest item (then the
    lowest index) of a bin above it, choosing among the donors' cheapest items the move that
    leaves the smallest largest load. Deterministic.

    Args:
        bins: (n,) bin of each item.
        costs: (n,) cost of each item.
        d: bins.
        minimum: items every bin must hold.
        sizes: (n,) size of each item, with ``cap``.
        cap: the largest summed size per bin (None: no cap).
    """
    bins = np.asarray(bins).copy()
    costs = np.asarray(costs, dtype=np.float64)
    if minimum <= 0:
        return bins
    if bins.size < minimum * d:
        return None
    counts = np.bincount(bins, minlength=d)
    loads = np.bincount(bins, weights=costs, minlength=d)
    size = np.asarray(sizes, dtype=np.int64) if sizes is not None else None
    used = np.bincount(bins, weights=size, minlength=d) if size is not None else None
    by_cost = np.lexsort((np.arange(bins.size), costs))  # cheapest first, then lowest index
    while (counts < minimum).any():
        needy = int(np.flatnonzero(counts < minimum)[0])
        candidates = by_cost[counts[bins[by_cost]] > minimum]
        if cap is not None and size is not None:
            candidates = candidates[used[needy] + size[candidates] <= cap]
        if candidates.size == 0:
            return None
        # Each donor's cheapest item: the first of its bin in cost order.
        _, first = np.unique(bins[candidates], return_index=True)
        offers = candidates[first]
        src_of = bins[offers]
        # The largest load after each offer's move: the donor's and the needy bin's new loads
        # against the largest of the others (the first of the three heaviest that is neither).
        top = np.argsort(-loads, kind="stable")[:3]
        others = np.full(offers.size, -np.inf)
        for k in top[::-1].tolist():
            others = np.where((src_of != k) & (needy != k), loads[k], others)
        new_max = np.maximum(
            others, np.maximum(loads[src_of] - costs[offers], loads[needy] + costs[offers])
        )
        best = int(offers[int(np.argmin(new_max))])  # ties: the lowest donor bin, as before
        src = int(bins[best])
        bins[best] = needy
        counts[src] -= 1
        counts[needy] += 1
        loads[src] -= costs[best]
        loads[needy] += costs[best]
        if used is not None:
            used[src] -= size[best]
            used[needy] += size[best]
    return bins

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Greedy balancing: LPT (longest processing time first), with the cap.

:func:`lpt` is exact LPT on the quantised problem, vectorised; :mod:`orchestration.balance`
(``lpt``) says why a round of ``k`` items at once makes the same choices as the sequential
rule. :func:`vector_lpt` is sequential LPT for items with a cost per component (pipeline
stage), minimising the largest component of the largest bin.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from orchestration.balance.problem import DEFAULT_BUDGET, BalanceProblem, InfeasibleCapError, Labels


def lpt(
    prob: BalanceProblem,
    items: np.ndarray | None = None,
    init: np.ndarray | None = None,
    init_sizes: np.ndarray | None = None,
    bins_out: np.ndarray | None = None,
) -> np.ndarray:
    """Exact LPT (see :mod:`orchestration.balance`), vectorised in rounds, honouring the cap.

    Args:
        prob: the problem.
        items: indices of the items to place, in placement order (default: all, by decreasing
            cost); used by the cap repair to re-place a few items onto existing loads.
        init: (d,) int64 loads to start from (default zeros).
        init_sizes: (d, k) summed sizes to start from, with a cap.
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
        k_sizes = prob.cap.size
        used = np.zeros((d, k_sizes), dtype=np.int64) if init_sizes is None else init_sizes.copy()
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
            fits = prob.fits_in(used[sorted_bins[:k]], prob.sizes[items_j[:k]])
            if not fits.all():
                k = int(np.argmin(fits))
                if k == 0:
                    # The lightest bin is full for this item: place it alone on the lightest
                    # bin where it fits, as the sequential capped rule would.
                    i = int(items_j[0])
                    free = prob.fits_in(used, prob.sizes[i])
                    if not free.any():
                        raise _greedy_failure(prob, i, used)
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


def _greedy_failure(prob: BalanceProblem, i: int, used: np.ndarray) -> InfeasibleCapError:
    """LPT found no bin for item ``i`` with the bins' summed sizes ``used`` (d, k)."""
    # The kind of size that even the roomiest bin lacks most names the cap at fault.
    c = int(np.argmax((prob.sizes[i] - (prob.cap - used)).min(axis=0)))
    names, d = prob.size_names, prob.d
    kinds = range(prob.cap.size)
    size = ", ".join(f"{names[k]} {int(prob.sizes[i, k])}" for k in kinds)
    caps = ", ".join(f"{names[k]} {int(prob.cap[k])}" for k in kinds)
    totals = ", ".join(f"{names[k]} {int(prob.sizes[:, k].sum())}" for k in kinds)
    bound = ", ".join(f"{names[k]} {d * int(prob.cap[k])}" for k in kinds)
    if prob.cap.size == 1:
        caps, bound = str(int(prob.cap[0])), str(d * int(prob.cap[0]))
    return prob.item_cap_error(
        f"LPT could not fit {prob.label(i)} ({size}) in any of {d} bins under the cap {caps}: "
        f"every bin is too full (greedy failure; total {totals}, d x cap = {bound}); raise the "
        f"cap or add bins",
        i,
        c,
    )


def vector_lpt(
    costs: np.ndarray,
    num_bins: int,
    *,
    sizes: np.ndarray | None = None,
    cap: int | Sequence[int] | None = None,
    labels: Labels = None,
    size_names: Sequence[str] | None = None,
) -> np.ndarray:
    """LPT for vector costs: minimise the largest bin's largest component.

    Item ``i`` costs ``costs[i, s]`` in each of ``S`` components (e.g. pipeline stages); a
    bin's load is the per-component sum of its items, and its bottleneck the largest component.
    Items go by decreasing total cost (ties by index), each to the bin whose bottleneck after
    taking it is smallest (ties to the lowest bin), among the bins where it fits under ``cap``.
    The whole-sample planner (``orchestration.sample_plan.plan_whole_samples`` with
    ``stage_shares``) runs it; with ``S = 1`` it is plain sequential LPT.

    Unlike :func:`orchestration.balance.balance`, the costs are not quantised: the loads are
    float64 sums, formed item by item in the same order on every rank.

    Args:
        costs: (n, S) cost of each item in each component, >= 0.
        num_bins: ``d``, the number of bins.
        sizes: (n,) or (n, k) integer sizes of each item (tokens), for ``cap``.
        cap: largest summed size of a bin, one per kind of size; None for no cap.
        labels: names items in errors.
        size_names: names each kind of size in errors.

    Returns:
        (n,) the bin of each item.

    Raises:
        InfeasibleCapError: an item fits in no bin under the cap.
        ValueError: a cap without sizes.
    """
    vec = np.asarray(costs, dtype=np.float64)
    n = vec.shape[0]
    # The cap's checks and errors are those of the packed problem (on the summed costs).
    prob = BalanceProblem.make(
        vec.sum(axis=1), num_bins, sizes, cap, labels, DEFAULT_BUDGET, size_names
    )
    order = np.lexsort((np.arange(n), -vec.sum(axis=1)))
    loads = np.zeros((num_bins, vec.shape[1]))
    used = None if prob.cap is None else np.zeros((num_bins, prob.cap.size), dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for i in order.tolist():
        score = (loads + vec[i]).max(axis=1)
        if used is not None:
            fits = prob.fits_in(used, prob.sizes[i])
            if not fits.any():
                raise _greedy_failure(prob, i, used)
            score = np.where(fits, score, np.inf)
        g = int(np.argmin(score))
        out[i] = g
        loads[g] += vec[i]
        if used is not None:
            used[g] += prob.sizes[i]
    return out

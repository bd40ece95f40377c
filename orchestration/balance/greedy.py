# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Greedy balancing: exact LPT (longest processing time first), vectorised, with the cap.

:mod:`orchestration.balance` (``lpt``) says why a round of ``k`` items at once makes the same
choices as the sequential rule.
"""

from __future__ import annotations

import numpy as np

from orchestration.balance.problem import BalanceProblem, InfeasibleCapError


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

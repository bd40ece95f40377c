# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Exact search for small packed problems: depth-first branch and bound within a node budget."""

from __future__ import annotations

import numpy as np

from orchestration.balance.problem import BalanceProblem


def branch_and_bound(prob: BalanceProblem, incumbent: np.ndarray | None) -> np.ndarray | None:
    """Exact search for small ``n``, improving on ``incumbent``, within the node budget.

    Returns:
        The best assignment found (``incumbent`` if none beats it), or None when there is no
        incumbent and no assignment meeting the cap was found.
    """
    d, n = prob.d, prob.n
    order = prob.order.tolist()
    q = [int(prob.q[i]) for i in order]
    # Sizes and summed sizes as tuples (one entry per kind of size; none without a cap).
    kinds = 0 if prob.cap is None else prob.cap.size
    sz = [tuple(int(x) for x in prob.sizes[i]) for i in order] if kinds else None
    cap = tuple(int(x) for x in prob.cap) if kinds else ()
    if incumbent is not None:
        best = [prob.max_q(incumbent), None]
        if best[0] <= prob.lb_q:
            return incumbent
    else:
        best = [sum(q) + 1, None]
    suffix = [0] * (n + 1)
    for k in range(n - 1, -1, -1):
        suffix[k] = suffix[k + 1] + q[k]
    loads = [0] * d
    used = [(0,) * kinds] * d
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
            before = used[b]
            if sz is not None:
                after = tuple(u + s for u, s in zip(before, sz[k]))
                if any(u > c for u, c in zip(after, cap)):
                    continue
                used[b] = after
            loads[b] = new
            assign[k] = b
            stop = dfs(k + 1, max(cur_max, new))
            loads[b] -= q[k]
            used[b] = before
            if stop:
                return True
        return False

    dfs(0, 0)
    if best[1] is None:
        return incumbent
    out = np.empty(n, dtype=np.int64)
    out[np.asarray(order, dtype=np.int64)] = best[1]
    return out

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Local search on an assignment: ``refine`` (moves and swaps), ``repair`` (ejection chains).

:mod:`orchestration.balance` (``refine``, ``repair``) describes both and their stopping rules.
"""

from __future__ import annotations

import numpy as np

from orchestration.balance.greedy import lpt
from orchestration.balance.problem import BalanceProblem, InfeasibleCapError, int_loads

# --------------------------------------------------------------------------------------------
# Refinement


def refine(prob: BalanceProblem, bins: np.ndarray, iters: int | None = None) -> np.ndarray:
    """Moves and pairwise swaps that lower the heaviest loads (see :mod:`orchestration.balance`).

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


def _refine_single(prob: BalanceProblem, bins: np.ndarray, iters: int) -> np.ndarray:
    d, q = prob.d, prob.q
    loads = int_loads(q, bins, d)
    capped = prob.cap is not None
    sizes = prob.sizes if capped else None
    used = prob.bin_sizes(bins) if capped else None
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
            sx = sizes[x_items][:, None, :]
            sy = np.where((y_items >= 0)[:, None], sizes[y_items], 0)[None, :, :]
            valid &= prob.fits_in(used[top], sy - sx) & prob.fits_in(used[y_bin][None], sx - sy)
        if not valid.any():
            break
        flat = int(np.argmin(np.where(valid, new_max, big)))
        a, b = divmod(flat, y.size)
        _apply(prob, bins, loads, used, int(x_items[a]), int(y_items[b]), top, int(y_bin[b]))
    return bins


def _apply(prob, bins, loads, used, i: int, j: int, src: int, dst: int) -> None:
    """Move item ``i`` from ``src`` to ``dst`` and, if ``j >= 0``, item ``j`` back."""
    _move(prob, bins, loads, used, i, src, dst)
    if j >= 0:
        _move(prob, bins, loads, used, j, dst, src)


def _move(prob, bins, loads, used, i: int, src: int, dst: int) -> None:
    """Move item ``i`` from ``src`` to ``dst``, updating the loads and, with a cap, the sizes."""
    bins[i] = dst
    loads[src] -= prob.q[i]
    loads[dst] += prob.q[i]
    if used is not None:
        used[src] -= prob.sizes[i]
        used[dst] += prob.sizes[i]


def _refine_pairs(prob: BalanceProblem, bins: np.ndarray, iters: int) -> np.ndarray:
    d, q, n = prob.d, prob.q, prob.n
    loads = int_loads(q, bins, d)
    capped = prob.cap is not None
    sizes = prob.sizes
    used = prob.bin_sizes(bins) if capped else None
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
    sx_all = np.vstack((sizes, np.zeros((1, sizes.shape[1]), dtype=np.int64))) if capped else None
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
            sx = sx_all[xi][:, :, None, :]
            sy = sx_all[yi][:, None, :, :]
            valid &= prob.fits_in(used[heavy][:, None, None, :], sy - sx)
            valid &= prob.fits_in(used[light][:, None, None, :], sx - sy)
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
            ds = sizes[i] - np.where(swap[:, None], sizes[np.maximum(j, 0)], 0)
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


def repair(prob: BalanceProblem, owners: np.ndarray, target: int) -> np.ndarray | None:
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
    loads = int_loads(q, bins, d)
    capped = prob.cap is not None
    used = prob.bin_sizes(bins) if capped else None
    pinned = np.zeros(n, dtype=bool)
    last_over = n + 1
    for _ in range(prob.budget.repair_rounds):
        over = loads > target
        if capped:
            over |= np.any(used > prob.cap, axis=1)
        num_over = int(np.count_nonzero(over))
        if num_over == 0:
            return bins
        if num_over > last_over:
            return None  # the chain is spreading, not converging
        last_over = num_over
        lifted = _select_lift(prob, bins, loads, used, over, pinned, target)
        if lifted is None:
            return None
        loads -= int_loads(q[lifted], bins[lifted], d)
        if capped:
            used -= prob.bin_sizes(bins[lifted], lifted)
        bins[lifted] = -1
        lifted = lifted[np.lexsort((lifted, -q[lifted]))]
        try:
            lpt(prob, items=lifted, init=loads, init_sizes=used, bins_out=bins)
        except InfeasibleCapError:
            return None
        pinned[lifted] = True
        # Only the lifted items changed bins: update the loads, don't recount every item.
        loads += int_loads(q[lifted], bins[lifted], d)
        if capped:
            used += prob.bin_sizes(bins[lifted], lifted)
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
            size_ex = np.maximum(used[b] - prob.cap, 0)  # (k,)
            suff = (q[members] >= ex) & np.all(prob.sizes[members] >= size_ex, axis=1)
            if suff.any():
                lift[where[np.flatnonzero(suff)[0]]] = True
                continue
            # Otherwise the costliest members, as many as the cost and every size need.
            desc = where[::-1]
            need = int(np.searchsorted(np.cumsum(q[cand[desc]]), ex)) + 1 if ex > 0 else 0
            for c in np.flatnonzero(size_ex > 0).tolist():
                csum = np.cumsum(prob.sizes[cand[desc], c])
                need = max(need, int(np.searchsorted(csum, size_ex[c])) + 1)
            if need > desc.size:
                return None
            lift[desc[:need]] = True
    return cand[lift]

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The public driver :func:`balance`: runs one algorithm or all (``auto``) and chooses.

With owners, bins become ranks through :func:`orchestration.locality.map_bins_to_ranks`, and
the ordinary assignment competes; ties in max load go to the fewest moved items.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from orchestration.balance.differencing import karmarkar_karp_capped
from orchestration.balance.exact import branch_and_bound
from orchestration.balance.greedy import lpt
from orchestration.balance.local_search import refine, repair
from orchestration.balance.problem import (
    DEFAULT_BUDGET,
    TIE_SLACK,
    BalanceProblem,
    BalanceResult,
    Candidate,
    InfeasibleCapError,
    Labels,
    WorkBudget,
    check_owners,
)
from orchestration.locality import map_bins_to_ranks, moved_lower_bound

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


def balance(
    costs: np.ndarray,
    num_bins: int,
    *,
    algorithm: str = "auto",
    sizes: np.ndarray | None = None,
    cap: int | Sequence[int] | None = None,
    size_names: Sequence[str] | None = None,
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
        sizes: (n,) integer size of each item (tokens), for ``cap``; (n, k) for ``k`` kinds
            of size (e.g. the tokens of several phases), each with its own cap.
        cap: largest summed size of a bin (one per kind of size); None for no cap.
        size_names: names each kind of size in errors (default "size").
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
    prob = BalanceProblem.make(costs, num_bins, sizes, cap, labels, budget, size_names)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown balancing algorithm {algorithm!r}; choose from {ALGORITHMS}")
    own = None if owners is None else check_owners(owners, prob.n, prob.d)
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
        caps = ", ".join(f"{n} {int(c)}" for n, c in zip(prob.size_names, prob.cap))
        raise InfeasibleCapError(
            f"no assignment of {prob.n} items to {prob.d} bins meets the cap ({caps})",
            cap=int(prob.cap[0]) if prob.cap.size == 1 else None,
        )
    result = _choose(prob, cands, own, wts, gpus_per_node, slack)
    if result.sizes is not None and np.ndim(sizes) == 1:
        result = dataclasses.replace(result, sizes=result.sizes[:, 0])
    return result


def _run_one(prob: BalanceProblem, name: str, owners: np.ndarray | None) -> np.ndarray:
    """The assignment of the one algorithm ``name`` (bins; ranks for ``repair``)."""
    if name == "lpt":
        return lpt(prob)
    if name == "kk":
        return karmarkar_karp_capped(prob)
    if name == "lpt+refine":
        return refine(prob, lpt(prob))
    if name == "kk+refine":
        return refine(prob, karmarkar_karp_capped(prob))
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
        target = prob.max_q(refine(prob, karmarkar_karp_capped(prob)))
        bins = repair(prob, owners, target)
        if bins is None:
            raise ValueError(
                f"repair could not bring every bin under the load {target * prob.scale:.6g} "
                f"that KK+refine reaches; use 'auto', which then keeps another algorithm"
            )
        return bins
    raise ValueError(name)


def _auto_candidates(
    prob: BalanceProblem, owners: np.ndarray | None, slack: float = 0.0
) -> list[tuple[str, np.ndarray, bool]]:
    """What ``auto`` scores, as ``(name, bins, bins_are_ranks)`` in the order tried."""
    out: list[tuple[str, np.ndarray, bool]] = []
    errors: list[InfeasibleCapError] = []
    for name, fn in (("lpt", lambda: lpt(prob)), ("kk", lambda: karmarkar_karp_capped(prob))):
        try:
            out.append((name, fn(), False))
        except InfeasibleCapError as e:
            errors.append(e)
            continue
        if prob.max_q(out[-1][1]) <= prob.lb_q:
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
        starts = [min(out, key=lambda c: prob.max_q(c[1]))]
    for name, bins, _ in starts:
        if prob.max_q(bins) > prob.lb_q:
            out.append((name + "+refine", refine(prob, bins), False))
    best = min(out, key=lambda c: prob.max_q(c[1]))
    if prob.n <= prob.budget.exact_max_items:
        exact = branch_and_bound(prob, best[1])
        out.append(("exact", exact, False))
        best = min(out, key=lambda c: prob.max_q(c[1]))
    if owners is not None:
        target = prob.max_q(best[1])
        target += int(target * slack)
        fixed = repair(prob, owners, target)
        if fixed is not None:
            out.append(("repair", fixed, True))
    return out


def _choose(
    prob: BalanceProblem,
    cands: list[tuple[str, np.ndarray, bool]],
    owners: np.ndarray | None,
    wts: np.ndarray | None,
    gpus_per_node: int,
    slack: float = 0.0,
) -> BalanceResult:
    """The candidate with the lowest max load; with owners, ties within ``slack`` go to the
    fewest moved items once bins are mapped to ranks."""
    maxes = [prob.max_q(b) for _, b, _ in cands]
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
    loads = np.bincount(bins, weights=prob.costs, minlength=prob.d).astype(np.float64)
    out_sizes = None
    if prob.sizes is not None:
        out_sizes = prob.bin_sizes(bins)
    ordinary = moved_w = None
    if owners is not None:
        ordinary = np.bincount(owners, weights=prob.costs, minlength=prob.d)
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

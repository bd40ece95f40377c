# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Lower bounds on the optimal max load of a packed (additive) balancing problem.

Given item costs ``x`` (n of them, >= 0) and ``d`` bins, ``OPT`` is the smallest possible
largest bin sum. Every bound here is a true lower bound on ``OPT`` (a bound above ``OPT``
would make a report lie, so each comes with its argument). ``s_1 >= s_2 >= ... >= s_n`` are
the costs sorted in decreasing order.

* ``average``: ``sum(x) / d``. Some bin holds at least the average.
* ``largest``: ``s_1``. Its bin holds at least it.
* ``pair``: ``s_d + s_{d+1}`` (n > d). Of the ``d+1`` largest items two share a bin, and any
  two of them sum to at least the two smallest of them.
* ``pigeonhole``: for every k >= 1 with ``k d + 1 <= n``, ``s_{kd-k+1} + ... + s_{kd+1}``.
  Of the ``kd+1`` largest items some bin holds ``k+1`` (pigeonhole), whose sum is at least
  that of the ``k+1`` smallest among them. ``k = 1`` is ``pair``.
* ``smallest``: the sum of the ``ceil(n/d)`` smallest items. Some bin holds at least
  ``ceil(n/d)`` items (pigeonhole), and any ``ceil(n/d)`` items sum to at least the smallest
  ones. Valid; it is dominated by ``pigeonhole`` with the largest k (same count of items,
  each at least as large) but kept because it is the one people know.
* ``ilp``: for small problems, the dual bound of the exact ILP (HiGHS, via ``highspy``)
  ``min T  s.t.  sum_b y_ib = 1,  sum_i x_i y_ib <= T,  y binary`` within a time limit; when
  the solver proves optimality within its gap, the bound is the optimum (``proven``). The ILP
  also breaks the bins' symmetry (item ``i`` of the decreasing order only in bins
  ``0..i``), which removes no optimum: relabel bins by their first item.

The combinatorial bounds are O(n log n); the ILP is for tools and tests, never for plans
(its time limit is wall-clock, hence not deterministic). ``highspy`` is therefore an optional
dependency (``pip install 'orchweave[ilp]'``), imported only when the ILP runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class LowerBound:
    """The best lower bound on the optimal max load, and where it came from."""

    value: float
    """The bound: the largest of ``parts``."""

    which: str
    """Name of the bound that attains ``value``."""

    parts: dict[str, float] = field(default_factory=dict)
    """Every bound computed, by name."""

    proven_optimum: float | None = None
    """The optimum, when the ILP proved it (then ``value`` equals it up to the solver's gap)."""

    ilp_status: str | None = None
    """The ILP's model status, when it ran."""


def combinatorial_bounds(costs: np.ndarray, num_bins: int) -> dict[str, float]:
    """The O(n log n) bounds of the module doc, by name."""
    x = np.asarray(costs, dtype=np.float64)
    d = int(num_bins)
    n = x.size
    if n == 0:
        return {"average": 0.0}
    s = np.sort(x)[::-1]
    out = {"average": float(x.sum()) / d, "largest": float(s[0])}
    if n > d:
        out["pair"] = float(s[d - 1] + s[d])
        out["pigeonhole"] = float(pigeonhole_bound(s, d))
        per_bin = -(-n // d)
        out["smallest"] = float(np.sort(x)[:per_bin].sum())
    return out


def pigeonhole_bound(sorted_costs: np.ndarray, num_bins: int) -> int | float | None:
    """The ``pigeonhole`` bound of the module doc: the largest ``s_{kd-k+1} + ... + s_{kd+1}``.

    Shared by :func:`combinatorial_bounds` (float costs) and the balancer's bound on its
    quantised costs (``orchestration.balance``), which must stay exact integer arithmetic:
    the sums are taken in the array's own dtype.

    Args:
        sorted_costs: (n,) costs in decreasing order, int64 or float64.
        num_bins: ``d``.

    Returns:
        The bound, an int for int64 costs and a float for float64 ones; None when ``n <= d``
        (no ``k >= 1`` has ``kd + 1 <= n``).
    """
    s = np.asarray(sorted_costs)
    d = int(num_bins)
    n = s.size
    if n <= d:
        return None
    # prefix[i] = s_1 + ... + s_i (1-based); bound_k = prefix[kd+1] - prefix[kd-k].
    prefix = np.concatenate((np.zeros(1, dtype=s.dtype), np.cumsum(s)))
    k = np.arange(1, (n - 1) // d + 1)
    return (prefix[k * d + 1] - prefix[k * d - k]).max().item()


def lower_bound(
    costs: np.ndarray,
    num_bins: int,
    *,
    ilp: bool = False,
    time_limit: float = 3.0,
    incumbent: np.ndarray | None = None,
) -> LowerBound:
    """The best lower bound on the optimal max load of packing ``costs`` into ``num_bins``.

    Args:
        costs: (n,) item costs, >= 0.
        num_bins: ``d``.
        ilp: also solve the exact ILP with HiGHS (small problems: say n * d <= 2000; needs the
            ``ilp`` extra).
        time_limit: the ILP's limit in seconds (wall-clock).
        incumbent: (n,) a known assignment, given to the solver as a starting solution.
    """
    parts = combinatorial_bounds(costs, num_bins)
    status = proven = None
    if ilp and np.asarray(costs).size > 0 and num_bins > 1:
        res = ilp_bound(costs, num_bins, time_limit=time_limit, incumbent=incumbent)
        parts["ilp"] = res.dual_bound
        status = res.status
        proven = res.optimum if res.proven else None
    which = max(parts, key=lambda k: parts[k])
    return LowerBound(parts[which], which, parts, proven, status)


@dataclass(frozen=True, slots=True)
class IlpResult:
    """What HiGHS found for the makespan ILP."""

    dual_bound: float
    """A lower bound on the optimum (the optimum's value when proven)."""

    optimum: float | None
    """The best max load found, None if none."""

    proven: bool
    """Whether the solver proved ``optimum`` optimal (within its relative gap)."""

    status: str
    """HiGHS's model status."""

    bins: np.ndarray | None
    """(n,) the best assignment found."""


ILP_REL_GAP = 1e-6
"""Relative gap at which HiGHS stops and calls the solution optimal."""


def ilp_bound(
    costs: np.ndarray,
    num_bins: int,
    *,
    time_limit: float = 3.0,
    incumbent: np.ndarray | None = None,
) -> IlpResult:
    """Solve the makespan ILP with HiGHS within ``time_limit`` seconds.

    Raises:
        ImportError: ``highspy`` is not installed (``pip install 'orchweave[ilp]'``).
    """
    highspy = _import_highspy()

    x = np.asarray(costs, dtype=np.float64)
    n, d = x.size, int(num_bins)
    # Scale so the largest item is 1: HiGHS's tolerances are absolute.
    scale = float(x.max()) if n and x.max() > 0 else 1.0
    c = x / scale
    order = np.lexsort((np.arange(n), -c))
    lb = max(combinatorial_bounds(c, d).values())
    with _quiet_stdout():
        # HiGHS prints a banner on construction, on the C-level stdout: it would corrupt the
        # JSON output of the tools.
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", ILP_REL_GAP)
    h.setOptionValue("threads", 1)
    inf = highspy.kHighsInf
    # Columns: y[i, b] for the allowed (i, b) in decreasing-cost rank order, then T.
    allowed = [(int(i), b) for r, i in enumerate(order) for b in range(min(d, r + 1))]
    num_y = len(allowed)
    col_cost = np.zeros(num_y + 1)
    col_cost[-1] = 1.0
    col_lower = np.zeros(num_y + 1)
    col_lower[-1] = lb
    col_upper = np.ones(num_y + 1)
    col_upper[-1] = inf
    h.addVars(num_y + 1, col_lower, col_upper)
    h.changeColsCost(num_y + 1, np.arange(num_y + 1, dtype=np.int32), col_cost)
    h.changeColsIntegrality(
        num_y, np.arange(num_y, dtype=np.int32), np.full(num_y, highspy.HighsVarType.kInteger)
    )
    by_item: dict[int, list[int]] = {}
    by_bin: dict[int, list[int]] = {}
    for col, (i, b) in enumerate(allowed):
        by_item.setdefault(i, []).append(col)
        by_bin.setdefault(b, []).append(col)
    for i, cols in by_item.items():
        h.addRow(1.0, 1.0, len(cols), np.asarray(cols, dtype=np.int32), np.ones(len(cols)))
    for b, cols in by_bin.items():
        idx = np.asarray(cols + [num_y], dtype=np.int32)
        vals = np.r_[[c[allowed[k][0]] for k in cols], -1.0]
        h.addRow(-inf, 0.0, idx.size, idx, vals)
    if incumbent is not None:
        start = _symmetric_start(np.asarray(incumbent), order, d, c, allowed)
        if start is not None:
            sol = highspy.HighsSolution()
            sol.col_value = list(start)
            sol.value_valid = True
            h.setSolution(sol)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    dual = max(float(info.mip_dual_bound), lb) * scale
    proven = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    sol = h.getSolution()
    bins = None
    optimum = None
    if sol.value_valid:
        vals = np.asarray(sol.col_value)
        bins = np.zeros(n, dtype=np.int64)
        for col, (i, b) in enumerate(allowed):
            if vals[col] > 0.5:
                bins[i] = b
        optimum = float(np.bincount(bins, weights=x, minlength=d).max())
        if proven:
            dual = max(dual, optimum / (1.0 + ILP_REL_GAP))
    if not math.isfinite(dual):
        dual = lb * scale
    return IlpResult(dual, optimum, proven, status, bins)


def _import_highspy():
    """The ``highspy`` module, imported only when an ILP runs: it is an optional dependency
    (extra ``ilp``) that plans never need."""
    try:
        import highspy
    except ImportError as e:
        raise ImportError(
            "the ILP bound needs HiGHS (the highspy package): pip install 'orchweave[ilp]'"
        ) from e
    return highspy


def _symmetric_start(incumbent, order, d, c, allowed) -> np.ndarray | None:
    """The incumbent with bins relabelled by first appearance in decreasing order, as columns."""
    relabel: dict[int, int] = {}
    bins = np.empty(incumbent.size, dtype=np.int64)
    for i in order:
        b = int(incumbent[i])
        if b not in relabel:
            relabel[b] = len(relabel)
        bins[i] = relabel[b]
    col_of = {pair: k for k, pair in enumerate(allowed)}
    start = np.zeros(len(allowed) + 1)
    for i, b in enumerate(bins):
        k = col_of.get((i, int(b)))
        if k is None:
            return None
        start[k] = 1.0
    start[-1] = float(np.bincount(bins, weights=c, minlength=d).max())
    return start


@contextlib.contextmanager
def _quiet_stdout():
    """Silence the process's C-level stdout (file descriptor 1) for a moment."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)

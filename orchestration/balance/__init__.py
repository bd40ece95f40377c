# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Balancing algorithms: assign indivisible items to ``d`` bins, minimising the largest load.

Pure numpy, no collectives: every rank runs the same code on the same all-gathered metadata and
gets the same answer. The planners (``orchestration.phase_plan``, ``orchestration.sample_plan``)
call :func:`balance` once per phase; tools compare the individual algorithms through its
``algorithm`` argument. Public API:
:func:`balance` (packed cost) -> :class:`BalanceResult`, :func:`balance_padded` (padded cost)
-> :class:`PaddedResult`, :class:`InfeasibleCapError`, :class:`WorkBudget`, :func:`quantize`,
:func:`max_over_mean`, and :func:`vector_lpt` (vector cost).

Modules: ``problem`` (the quantised problem, budgets, errors, results), ``greedy`` (LPT),
``differencing`` (Karmarkar–Karp), ``local_search`` (refine, repair), ``exact`` (branch and
bound), ``padded`` (padded cost), ``cardinality`` (:func:`hold_at_least`, a floor on the items
per bin) and ``auto`` (:func:`balance`, which runs and chooses among
the others).

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
    fewest moved items, then to the order above. Its limits are counts of work, not time (see
    Determinism).

* **Padded cost** (:func:`balance_padded`): a bin runs its items padded to its longest, so its
  load is ``count * f(max length)`` with ``f`` non-decreasing. Solved exactly; see there.

* **Vector cost** (:func:`vector_lpt`): an item costs something in each of several components
  (the pipeline stages of a DP group), and a bin's load is its largest summed component.
  Sequential LPT on the float costs: items by decreasing total, each to the bin whose largest
  component grows least. The whole-sample planner runs it for static pipeline layouts.

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
``sizes`` (e.g. tokens) with ``cap`` bounds the summed size of every bin (memory). An item
may have several kinds of size, each with its own cap (``sizes`` (n, k), ``cap`` (k,): a whole
sample's tokens in every phase), and a bin must stay under all of them. LPT honours it while
placing (the lightest bin where the item fits); KK ignores it and is then repaired (items
lifted off over-cap bins and re-placed by capped LPT); refine and repair check every move. An
item larger than the cap, or a cap that a greedy cannot satisfy, raises
:class:`InfeasibleCapError` naming the item (``labels``, e.g. sample ids) and the kind of size
(``size_names``).

Ordinary assignment
-------------------
With ``owners`` (the rank holding each item now) bin ``k`` *is* rank ``k``: the bins of each
algorithm are mapped to ranks by :func:`orchestration.locality.map_bins_to_ranks` (node-aware,
most payload in place), and the ordinary assignment ``bins = owners`` is scored as well. The
result reports both, and the ordinary one is kept when nothing beats it (zero movement).
"""

from orchestration.balance.auto import ALGORITHMS, balance
from orchestration.balance.cardinality import hold_at_least
from orchestration.balance.greedy import vector_lpt
from orchestration.balance.padded import PaddedResult, balance_padded
from orchestration.balance.problem import (
    DEFAULT_BUDGET,
    TIE_SLACK,
    BalanceResult,
    InfeasibleCapError,
    WorkBudget,
    max_over_mean,
    quantize,
)

__all__ = [
    "ALGORITHMS",
    "DEFAULT_BUDGET",
    "TIE_SLACK",
    "BalanceResult",
    "InfeasibleCapError",
    "PaddedResult",
    "WorkBudget",
    "balance",
    "balance_padded",
    "hold_at_least",
    "max_over_mean",
    "quantize",
    "vector_lpt",
]

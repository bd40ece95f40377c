# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The packed balancing problem every algorithm of the package works on, and its results.

:class:`BalanceProblem` holds the quantised costs (:func:`quantize`; the package doc's
Determinism says why), the cap, the work budget and the decreasing order every greedy walks;
the algorithm modules take one and return ``(n,)`` bins. :class:`BalanceResult` is what
:func:`orchestration.balance.balance` makes of the chosen bins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from orchestration.bounds import pigeonhole_bound

QUANT_BITS = 38
"""At most this many bits for the largest item's quantised cost (fewer for many items)."""

Labels = Sequence[str] | Callable[[int], str] | None
"""How errors name item ``i``: a sequence, a function, or None (``item i``)."""


class InfeasibleCapError(ValueError):
    """The per-bin cap on summed size cannot be met: one item is too large, or a greedy failed.

    Attributes:
        item: index of the item at fault, or None.
        label: its label (e.g. a sample id), or None.
        size: its size, in the kind of size whose cap it breaks.
        cap: the cap that cannot be met.
        size_name: the name of that size (with several sizes, e.g. "vision tokens"), or None.
        phase: the phase whose cap it is, set by the planner that raised it, or None.
    """

    def __init__(
        self,
        message: str,
        item: int | None = None,
        label: str | None = None,
        size: int | None = None,
        cap: int | None = None,
        size_name: str | None = None,
    ) -> None:
        super().__init__(message)
        self.item = item
        self.label = label
        self.size = size
        self.cap = cap
        self.size_name = size_name
        self.phase: str | None = None


@dataclass(frozen=True, slots=True)
class WorkBudget:
    """Deterministic work limits of the algorithms (never wall-clock; see the package doc)."""

    refine_iters: int = 128
    """Improving moves/swaps of refine when ``d <= 64``."""

    refine_rounds: int = 8
    """Rounds of paired moves/swaps of refine when ``d > 64``."""

    refine_pairs: int = 256
    """Heaviest/lightest bin pairs refine improves per step when ``d > 64``."""

    kk_itemwise_max: int = 1024
    """Item-wise KK up to this many items; KK over runs of ``ceil(d/2)`` items beyond."""

    lpt_exact_rounds: int = 4096
    """Vectorised exact-LPT rounds before LPT finishes in plain rounds of the lightest bins."""

    refine_both_max: int = 256
    """``auto`` refines both LPT and KK up to this many items, only the better beyond."""

    repair_rounds: int = 8
    """Lift-and-place rounds of ``repair`` (ejection chain length)."""

    exact_max_items: int = 16
    """Largest instance ``auto`` tries the branch and bound on."""

    exact_nodes: int = 50_000
    """Search nodes of the branch and bound."""


DEFAULT_BUDGET = WorkBudget()
"""The budget :func:`orchestration.balance.balance` uses unless told."""

TIE_SLACK = 1e-6
"""Max loads within this relative distance of the best count as ties (broken by movement)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One scored assignment that :func:`orchestration.balance.balance` considered."""

    name: str
    """Algorithm that produced it."""

    max_load: float
    """Its largest bin load (quantised, then scaled back)."""

    moved_items: int | None
    """Items not on their owner after mapping bins to ranks; None without owners or when not
    needed to break a tie."""


@dataclass(frozen=True, slots=True)
class BalanceResult:
    """The chosen assignment of items to bins, and how it compares with the ordinary one."""

    bins: np.ndarray
    """(n,) bin of each item; with owners, the rank."""

    loads: np.ndarray
    """(d,) summed cost of each bin."""

    algorithm: str
    """The algorithm whose assignment was kept ("ordinary" if items stay with owners)."""

    sizes: np.ndarray | None = None
    """(d,) summed size of each bin, when sizes were given; (d, k) for ``k`` sizes per item."""

    ordinary_loads: np.ndarray | None = None
    """(d,) loads if every item stayed with its owner; None without owners."""

    moved_items: int | None = None
    """Items whose bin differs from their owner; None without owners."""

    moved_weight: float | None = None
    """Payload (``item_bytes``) of the moved items; None without owners."""

    candidates: tuple[Candidate, ...] = ()
    """Every assignment scored (``auto``), in the order tried."""

    lower_bound: float = 0.0
    """The combinatorial lower bound on the optimal max load (average, largest item, pigeonhole
    sums; see ``orchestration.bounds``), up to the quantisation of costs."""

    @property
    def max_load(self) -> float:
        """The largest bin load."""
        return float(self.loads.max()) if self.loads.size else 0.0

    @property
    def mean_load(self) -> float:
        """The mean bin load."""
        return float(self.loads.mean()) if self.loads.size else 0.0

    @property
    def imbalance(self) -> float:
        """Max over mean load (1.0 is perfect, and for an empty problem)."""
        mean = self.mean_load
        return self.max_load / mean if mean > 0 else 1.0

    @property
    def ordinary_imbalance(self) -> float | None:
        """Max over mean of the ordinary loads."""
        if self.ordinary_loads is None:
            return None
        return max_over_mean(self.ordinary_loads)


def max_over_mean(loads: np.ndarray) -> float:
    """Imbalance of per-rank loads: max over mean (1.0 is perfect; all-zero loads give 1.0)."""
    mean = float(loads.mean()) if loads.size else 0.0
    return float(loads.max()) / mean if mean > 0 else 1.0


def quantize(costs: np.ndarray) -> tuple[np.ndarray, float]:
    """Integer costs and the scale back: ``costs ~= q * scale``.

    The largest item becomes ``2**bits`` with ``bits = min(QUANT_BITS, 52 - bit_length(n))``,
    so that any sum of items is below 2**53: exact in int64 and in float64 alike.
    """
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"costs must be one-dimensional, got shape {c.shape}")
    if c.size and (not np.all(np.isfinite(c)) or c.min() < 0):
        raise ValueError("costs must be finite and >= 0")
    top = float(c.max()) if c.size else 0.0
    if top <= 0:
        return np.zeros(c.size, dtype=np.int64), 1.0
    bits = min(QUANT_BITS, 52 - int(c.size).bit_length())
    scale = top / float(2**bits)
    return np.rint(c / scale).astype(np.int64), scale


@dataclass(slots=True)
class BalanceProblem:
    """A packed problem: ``n`` items with quantised costs, ``d`` bins, an optional size cap.

    Build it with :meth:`make`, which validates the arguments; the algorithms only read it.
    """

    q: np.ndarray
    """(n,) int64 quantised costs (:func:`quantize`): every decision compares these."""

    scale: float
    """``costs ~= q * scale``."""

    d: int
    """Number of bins."""

    costs: np.ndarray
    """(n,) the float64 costs as given, for the reported loads."""

    sizes: np.ndarray | None
    """(n, k) int64 sizes (``k`` kinds of size per item, e.g. tokens of several phases), when
    there is a cap; else None."""

    cap: np.ndarray | None
    """(k,) int64 largest summed size of a bin in each kind; None for no cap."""

    size_names: tuple[str, ...]
    """(k,) how errors name each kind of size."""

    labels: Labels
    """Names items in errors."""

    budget: WorkBudget
    """Work limits of the algorithms."""

    n: int = 0
    """Number of items."""

    lb_q: int = 0
    """Combinatorial lower bound on the optimal max load, in quantised units: an algorithm that
    reaches it stops."""

    order: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(n,) items by decreasing cost, ties by index: the order every greedy walks."""

    @classmethod
    def make(
        cls,
        costs: np.ndarray,
        num_bins: int,
        sizes: np.ndarray | None,
        cap: int | Sequence[int] | None,
        labels: Labels,
        budget: WorkBudget,
        size_names: Sequence[str] | None = None,
    ) -> "BalanceProblem":
        """Quantise ``costs`` and check the arguments.

        Args:
            costs: (n,) cost of each item.
            num_bins: ``d``.
            sizes: (n,) or (n, k) integer sizes of each item, for ``cap``.
            cap: the largest summed size of a bin, one per kind of size (a number for one).
            labels: names items in errors.
            budget: work limits.
            size_names: names each kind of size in errors; default "size".

        Raises:
            ValueError: bad arguments (no bins, a cap without sizes, mismatched shapes, costs
                not finite and >= 0).
            InfeasibleCapError: an item exceeds the cap, or all of them exceed ``d`` caps.
        """
        d = int(num_bins)
        if d <= 0:
            raise ValueError(f"num_bins must be positive, got {num_bins}")
        q, scale = quantize(costs)
        s = caps = None
        if cap is not None:
            if sizes is None:
                raise ValueError("a cap needs item sizes")
            s = np.asarray(sizes, dtype=np.int64)
            s = s[:, None] if s.ndim == 1 else s
            caps = np.atleast_1d(np.asarray(cap, dtype=np.int64))
            if s.shape != (q.size, caps.size):
                raise ValueError(
                    f"sizes has shape {np.shape(sizes)}, costs {q.shape} and cap {caps.shape}"
                )
        if size_names is None:
            size_names = ("size",) * (1 if caps is None else caps.size)
        names = tuple(size_names)
        if caps is not None and len(names) != caps.size:
            raise ValueError(f"size_names {names} does not name the {caps.size} sizes")
        c = np.asarray(costs, dtype=np.float64)
        prob = cls(q, scale, d, c, s, caps, names, labels, budget, n=q.size)
        prob.order = np.argsort(-q, kind="stable")
        prob.lb_q = _lower_bound_q(q[prob.order], d)
        if s is not None:
            prob.check_cap()
        return prob

    def label(self, i: int) -> str:
        """The name of item ``i`` in errors."""
        return item_label(self.labels, i)

    def bin_sizes(self, bins: np.ndarray, items: np.ndarray | None = None) -> np.ndarray:
        """(d, k) int64 summed sizes per bin of ``items`` (default all) placed in ``bins``.

        ``bins`` gives the bin of each of ``items`` (of every item without ``items``).
        """
        sizes = self.sizes if items is None else self.sizes[items]
        out = np.zeros((self.d, sizes.shape[1]), dtype=np.int64)
        np.add.at(out, bins, sizes)
        return out

    def fits_in(self, used: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Whether adding ``sizes`` (..., k) to the summed sizes ``used`` (..., k) stays under
        the cap in every kind: a boolean array of the broadcast shape without the last axis."""
        return np.all(used + sizes <= self.cap, axis=-1)

    def describe_size(self, size: np.ndarray) -> tuple[int, str]:
        """The kind of ``size`` (k,) most over the cap (else the largest relative to it), as
        (index, text): ``size 12`` for one unnamed kind, ``vision tokens 12`` for a named one."""
        c = int(np.argmax(size - self.cap))
        return c, f"{self.size_names[c]} {int(size[c])}"

    def check_cap(self) -> None:
        """Raise :class:`InfeasibleCapError` if no assignment can meet the cap, plainly."""
        over = self.sizes - self.cap
        big = np.flatnonzero(over.max(axis=1) > 0)
        if big.size:
            i = int(big[np.argmax(over[big].max(axis=1))])
            c, text = self.describe_size(self.sizes[i])
            raise self.item_cap_error(
                f"{self.label(i)} has {text}, more than the per-bin cap {int(self.cap[c])}: it "
                f"can never fit (an item is never split)",
                i,
                c,
            )
        total = self.sizes.sum(axis=0)
        over = np.flatnonzero(total > self.d * self.cap)
        if over.size:
            c = int(over[0])
            raise InfeasibleCapError(
                f"the items' total {self.size_names[c]} {int(total[c])} exceeds {self.d} bins x "
                f"cap {int(self.cap[c])}",
                size=int(total[c]),
                cap=int(self.cap[c]),
                size_name=self.size_names[c],
            )

    def item_cap_error(self, message: str, i: int, c: int) -> InfeasibleCapError:
        """The error for item ``i`` at fault under the cap of size kind ``c``."""
        return InfeasibleCapError(
            message,
            item=i,
            label=self.label(i),
            size=int(self.sizes[i, c]),
            cap=int(self.cap[c]),
            size_name=self.size_names[c],
        )

    def fits(self, bins: np.ndarray) -> bool:
        """Whether the assignment ``bins`` meets the cap (always, without one)."""
        if self.cap is None:
            return True
        return bool(np.all(self.bin_sizes(bins) <= self.cap))

    def cap_error_for(self, bins: np.ndarray, what: str) -> InfeasibleCapError:
        """The error naming the fullest bin of ``bins``, which ``what`` produced."""
        used = self.bin_sizes(bins)
        b = int(np.argmax((used - self.cap).max(axis=1)))
        c, text = self.describe_size(used[b])
        return InfeasibleCapError(
            f"{what} puts {text} in bin {b}, more than the cap {int(self.cap[c])}",
            size=int(used[b, c]),
            cap=int(self.cap[c]),
            size_name=self.size_names[c],
        )

    def max_q(self, bins: np.ndarray) -> int:
        """The largest bin load of ``bins`` in quantised units (0 without items)."""
        return int(int_loads(self.q, bins, self.d).max()) if self.n else 0


def _lower_bound_q(sorted_q: np.ndarray, d: int) -> int:
    """Lower bound on the optimal max load in quantised units (see ``orchestration.bounds``):
    the average (rounded up), the largest item, and the pigeonhole sums."""
    n = sorted_q.size
    if n == 0:
        return 0
    best = max(int(sorted_q[0]), -(-int(sorted_q.sum()) // d))
    pigeonhole = pigeonhole_bound(sorted_q, d)
    return best if pigeonhole is None else max(best, pigeonhole)


def int_loads(q: np.ndarray, bins: np.ndarray, d: int) -> np.ndarray:
    """Exact int64 loads per bin.

    bincount sums in float64, which is exact here: :func:`quantize` keeps every partial sum
    below 2**53.
    """
    return np.bincount(bins, weights=q, minlength=d).astype(np.int64)


def item_label(labels: Labels, i: int) -> str:
    """The name of item ``i`` in errors: ``labels[i]``, ``labels(i)`` or ``item i``."""
    if labels is None:
        return f"item {i}"
    if callable(labels):
        return str(labels(i))
    return str(labels[i])


def check_owners(owners, n: int, d: int) -> np.ndarray:
    """``owners`` as an (n,) int64 array of ranks in ``[0, d)``.

    Raises:
        ValueError: wrong shape, or a rank out of range.
    """
    own = np.asarray(owners, dtype=np.int64)
    if own.shape != (n,):
        raise ValueError(f"owners has shape {own.shape}, expected ({n},)")
    if n and (own.min() < 0 or own.max() >= d):
        raise ValueError(f"owners must lie in [0, {d})")
    return own

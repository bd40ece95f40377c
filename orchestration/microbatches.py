# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Microbatches of one rank's samples: balanced in predicted cost, within the packing limit.

Pure numpy. After balancing, a rank holds a list of samples; :func:`form_microbatches` cuts it
into microbatches whose predicted costs are balanced (so the pipeline's microbatches take about
the same time) and whose packed length stays within ``--micro-batch-size x --seq-length``;
:func:`overlap_order` is the order the per-phase step runs them in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from orchestration.balance import DEFAULT_BUDGET, InfeasibleCapError, WorkBudget, balance


@dataclass(frozen=True, slots=True)
class MicrobatchPlan:
    """A rank's samples cut into microbatches balanced in cost, each within the packing limit."""

    microbatches: tuple[tuple[int, ...], ...]
    """Per microbatch, indices into the rank's sample list, ascending; microbatches ordered by
    their first index."""

    loads: np.ndarray
    """(M,) predicted cost of each microbatch."""

    tokens: np.ndarray
    """(M,) packed tokens of each microbatch."""

    requested: int
    """The number of microbatches asked for; ``len(microbatches)`` is larger when the packing
    limit required it, or smaller when there were fewer samples."""

    @property
    def num_microbatches(self) -> int:
        """Microbatches formed."""
        return len(self.microbatches)


def form_microbatches(
    costs: np.ndarray,
    tokens: np.ndarray,
    num_microbatches: int,
    max_tokens: int | None,
    *,
    labels: Sequence[str] | None = None,
    algorithm: str = "auto",
    budget: WorkBudget = DEFAULT_BUDGET,
) -> MicrobatchPlan:
    """Cut one rank's samples into microbatches: balanced cost, packed length <= ``max_tokens``.

    Starts from ``max(num_microbatches, ceil(total tokens / max_tokens))`` microbatches (never
    more than samples) and adds one at a time while the balancer cannot meet the limit. Empty
    microbatches never occur. Deterministic.

    Args:
        costs: (n,) predicted cost of each sample (any phase mix; e.g. ``SamplePlan.costs``).
        tokens: (n,) packed LLM tokens of each sample.
        num_microbatches: the count wanted (e.g. the baseline's).
        max_tokens: the sequence packing limit; None for none.
        labels: names samples in errors.

    Raises:
        InfeasibleCapError: a sample alone exceeds ``max_tokens`` (named).
    """
    c = np.asarray(costs, dtype=np.float64)
    t = np.asarray(tokens, dtype=np.int64)
    n = c.size
    if n == 0:
        return MicrobatchPlan((), np.zeros(0), np.zeros(0, dtype=np.int64), int(num_microbatches))
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    m = int(num_microbatches)
    if max_tokens is not None:
        big = np.flatnonzero(t > max_tokens)
        if big.size:
            i = int(big[0])
            name = labels[i] if labels is not None else f"sample {i}"
            raise InfeasibleCapError(
                f"{name} has {int(t[i])} tokens, more than the packing limit {max_tokens}",
                item=i,
                label=name,
                size=int(t[i]),
                cap=int(max_tokens),
            )
        m = max(m, -(-int(t.sum()) // int(max_tokens)))
    m = min(m, n)
    if m in (1, n) and np.all(c >= 0) and np.all(np.isfinite(c)):
        # One microbatch holds everything (the packing limit, checked above, allowed it), or
        # each holds one sample: the only answers once every microbatch must hold a sample,
        # in the balancer's order, without its candidates (per rank and iteration: at micro
        # batch = samples per rank, as OrchMLLM's one-microbatch LLM phase runs; at micro
        # batch 1, as the 84B model's 32 per rank). Bad costs take the balancer's path, which
        # names them.
        if m == 1:
            return MicrobatchPlan(
                (tuple(range(n)),), np.array([float(c.sum())]),
                np.array([int(t.sum())], dtype=np.int64), int(num_microbatches),
            )  # fmt: skip
        return MicrobatchPlan(
            tuple((i,) for i in range(n)), c.copy(), t.copy(), int(num_microbatches)
        )
    while True:
        try:
            res = balance(
                c,
                m,
                algorithm=algorithm,
                sizes=t if max_tokens is not None else None,
                cap=max_tokens,
                labels=labels,
                budget=budget,
            )
            break
        except InfeasibleCapError:
            if m >= n:
                raise
            m += 1
    bins = _fill_empty(res.bins.copy(), c, m)
    groups = [np.flatnonzero(bins == b) for b in range(m)]
    groups.sort(key=lambda g: int(g[0]))
    mbs = tuple(tuple(int(i) for i in g) for g in groups)
    loads = np.array([float(c[list(g)].sum()) for g in mbs])
    toks = np.array([int(t[list(g)].sum()) for g in mbs], dtype=np.int64)
    return MicrobatchPlan(mbs, loads, toks, int(num_microbatches))


def fewest_llm_microbatches(num_microbatches: int, pack_sequences: bool) -> int:
    """The fewest microbatches a balanced rank (PP = 1: its LLM phase) or DP group (PP > 1)
    cuts its samples into, and so the fewest LLM samples the per-phase plan leaves a rank:
    Megatron's count, so that every rank runs as many (each microbatch costs a per-call
    overhead that the plan does not see); with packed sequences (``--pack-sequences``) one, the
    packing limit adding as many as it needs, as first-fit decreasing packs Megatron's step."""
    return 1 if pack_sequences else int(num_microbatches)


def _fill_empty(bins: np.ndarray, costs: np.ndarray, m: int) -> np.ndarray:
    """Give every empty microbatch the cheapest sample of the fullest one (m <= n)."""
    counts = np.bincount(bins, minlength=m)
    for b in np.flatnonzero(counts == 0).tolist():
        donor = int(np.argmax(counts))
        members = np.flatnonzero(bins == donor)
        i = int(members[np.lexsort((members, costs[members]))[0]])
        bins[i] = b
        counts[donor] -= 1
        counts[b] += 1
    return bins


def overlap_order(is_local: Sequence[bool],
                  overlap: bool = True) -> tuple[list[int], list[int], list[int]]:  # fmt: skip
    """The order a per-phase balanced step runs its LLM microbatches in (their indices), as
    three groups: the first half of the *local* ones (every encoder row computed on this rank),
    those needing other ranks' rows, the other local ones; each group keeps the given order.

    The first group runs while the encoder outputs' exchange does, the last while their
    gradients go back (as long as each, since both move the same rows); with an odd count the
    first group gets the extra one. Without ``overlap`` (``--no-overlap-exchanges``) every
    microbatch is in the middle group, in the given order.
    """
    if not overlap:
        return [], list(range(len(is_local))), []
    local = [i for i, flag in enumerate(is_local) if flag]
    remote = [i for i, flag in enumerate(is_local) if not flag]
    half = math.ceil(len(local) / 2)
    return local[:half], remote, local[half:]

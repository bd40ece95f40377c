# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Where samples go in a step: Megatron's sampler order, our padding and encoder subs.

The trainer (``megatron.mllm``) and SEMU (``pipeweaver.semu``) both lay samples into
microbatches and sub-microbatches with these rules, so they live here, below both.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def microbatch_indices(
    iteration: int, dp_rank: int, dp_size: int, micro_batch_size: int, num_microbatches: int
) -> list[list[int]]:
    """Stream indices of one DP rank's microbatches at ``iteration``, in Megatron's order.

    Megatron's pretraining sampler walks the stream in chunks of ``micro_batch_size * dp_size``
    samples and gives DP rank ``r`` the ``r``-th slice of ``micro_batch_size`` of each chunk;
    ``num_microbatches`` such chunks make one global batch.
    """
    global_batch = micro_batch_size * dp_size * num_microbatches
    base = iteration * global_batch
    out = []
    for m in range(num_microbatches):
        start = base + m * micro_batch_size * dp_size + dp_rank * micro_batch_size
        out.append(list(range(start, start + micro_batch_size)))
    return out


def first_fit_decreasing(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Indices of ``sizes`` in sequences of at most ``limit``, first-fit decreasing: Megatron-LM's
    packed sequences (``--pack-sequences``), as a strong offline packer forms them.

    Longest first (ties in the given order), each into the first sequence it fits, a new one
    when none; sequences in the order they were opened, each holding its indices in the order
    they were placed. Deterministic. A size over ``limit`` gets a sequence of its own (callers
    name it as an error first).
    """
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if sizes[i] <= free:
                bins[b].append(i)
                room[b] -= sizes[i]
                break
        else:
            bins.append([i])
            room.append(limit - sizes[i])
    return bins


def pack_sequences(items: Sequence[T], size_of: Callable[[T], int], limit: int) -> list[list[T]]:
    """``items`` in sequences of at most ``limit`` (``size_of`` each), :func:`first_fit_decreasing`."""
    bins = first_fit_decreasing([size_of(x) for x in items], limit)
    return [[items[i] for i in b] for b in bins]


def padding_runs(packed: int, pad_to: int | None, max_run: int) -> list[int]:
    """Lengths of the padding sequences that fill a packed microbatch up to ``pad_to`` tokens.

    Padding is split into runs of at most ``max_run`` tokens (the sequence length) so that its
    positions stay inside the position embedding and its attention costs what padding each
    sample to the sequence length would cost, no more.
    """
    if pad_to is None or packed >= pad_to:
        return []
    pad = pad_to - packed
    return [max_run] * (pad // max_run) + ([pad % max_run] if pad % max_run else [])


def sub_microbatch_groups(
    items: Sequence[tuple[int, int, int]], max_tokens: int | None
) -> list[tuple[int, int]]:
    """Group consecutive items into subs of at most ``max_tokens`` encoder tokens.

    Items stay whole (an item's units pool together into its LLM rows), so a sub holds at
    least one item, however large.

    Args:
        items: ``(units, encoder tokens, LLM rows)`` of each of an encoder's items in a
            microbatch, in packing order.
        max_tokens: the trainer's ``--encoder-sub-microbatch-tokens``; None or 0 keeps all of
            a microbatch's items in one sub.

    Returns:
        ``(start, stop)`` item ranges, one per sub.
    """
    if not items:
        return []
    if not max_tokens:
        return [(0, len(items))]
    groups, start, tokens = [], 0, 0
    for i, (_, n, _) in enumerate(items):
        if i > start and tokens + n > max_tokens:
            groups.append((start, i))
            start, tokens = i, 0
        tokens += n
    groups.append((start, len(items)))
    return groups


def balanced_contiguous_split(weights: Sequence[float], num_groups: int) -> list[tuple[int, int]]:
    """Cut ``weights`` into ``num_groups`` non-empty contiguous groups, the largest sum smallest.

    Exact: the smallest achievable largest group sum M* first; then, among the splits whose
    every group sums to at most M*, the one with the smallest sum of squared group sums (the
    most even); remaining ties give the earlier groups the larger share, so equal weights split
    exactly as :func:`pipeweaver.placement.split_layers` does. O(num_groups x n^2), for the
    handful of layers or items a split sees.

    Args:
        weights: non-negative weight of each element (a layer's cost, an item's units).
        num_groups: groups to form, 1 <= num_groups <= len(weights).

    Returns:
        ``(start, stop)`` index ranges, in order, covering every element once.

    Raises:
        ValueError: no elements, a negative weight, or a group count outside 1..len(weights).
    """
    n = len(weights)
    if not 1 <= num_groups <= n:
        raise ValueError(f"cannot cut {n} elements into {num_groups} non-empty groups")
    if any(w < 0 for w in weights):
        raise ValueError("weights must be non-negative")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)

    def total(a: int, b: int) -> float:
        return prefix[b] - prefix[a]

    # The exact M*: the smallest group sum that lets a greedy left-to-right cut use at most
    # num_groups groups (any group splits further without growing, so fewer is enough).
    def groups_needed(cap: float) -> int:
        count, start = 1, 0
        for i in range(1, n):
            if total(start, i + 1) > cap:
                count, start = count + 1, i
        return count

    candidates = sorted({total(a, b) for a in range(n) for b in range(a + 1, n + 1)})
    lo = next(i for i, c in enumerate(candidates) if c >= max(weights))
    hi = len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if groups_needed(candidates[mid]) <= num_groups:
            hi = mid
        else:
            lo = mid + 1
    cap = candidates[lo]
    # best[j][i]: smallest sum of squares of items i..n-1 in j groups, each <= cap.
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_groups + 1)]
    best[0][n] = 0.0
    for j in range(1, num_groups + 1):
        for i in range(n - j, -1, -1):
            for b in range(i + 1, n - j + 2):
                s = total(i, b)
                if s > cap:
                    break
                value = s * s + best[j - 1][b]
                if value < best[j][i]:
                    best[j][i] = value
    groups, i = [], 0
    for j in range(num_groups, 0, -1):
        target, choice = best[j][i], None
        # The longest first group that keeps the optimum (ties to within rounding).
        for b in range(i + 1, n - j + 2):
            s = total(i, b)
            if s > cap:
                break
            if s * s + best[j - 1][b] <= target + 1e-9 * max(1.0, abs(target)):
                choice = b
        groups.append((i, choice))
        i = choice
    return groups


def sub_microbatch_count(num_units: int, sub_units: int) -> int:
    """Sub-microbatches of a microbatch with ``num_units`` units of an encoder, at most
    ``sub_units`` each (DIP's online rule, M_i = ceil(N_i / B_i))."""
    if sub_units < 1:
        raise ValueError(f"a sub-microbatch holds at least 1 unit, got {sub_units}")
    return -(-num_units // sub_units)


def near_equal_sub_groups(
    items: Sequence[tuple[int, int, int]], sub_units: int
) -> list[tuple[int, int]]:
    """Cut an encoder's items into ceil(units / ``sub_units``) near-equal sub-microbatches.

    Items stay whole, so there are at most as many subs as items; among the contiguous cuts
    into that many subs, the largest sub holds the fewest units (then the most even, see
    :func:`balanced_contiguous_split`).

    Args:
        items: ``(units, encoder tokens, LLM rows)`` of each item, in packing order.
        sub_units: B_i, the trainer's ``--encoder-sub-microbatch-size``.

    Returns:
        ``(start, stop)`` item ranges, one per sub.
    """
    if not items:
        return []
    units = [u for u, _, _ in items]
    count = min(sub_microbatch_count(sum(units), sub_units), len(items))
    return balanced_contiguous_split(units, count)


def encoder_sub_groups(
    items: Sequence[tuple[int, int, int]],
    max_tokens: int | None = None,
    sub_units: int | None = None,
) -> list[tuple[int, int]]:
    """An encoder's sub-microbatches: by units (``sub_units``, DIP's count rule) when given,
    else by a token cap (:func:`sub_microbatch_groups`); the trainer and SEMU both cut here."""
    if sub_units:
        return near_equal_sub_groups(items, sub_units)
    return sub_microbatch_groups(items, max_tokens)

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Where samples go in a step: Megatron's sampler order, our padding and encoder subs.

The trainer (``megatron.mllm``) and SEMU (``pipeweaver.semu``) both lay samples into
microbatches and sub-microbatches with these rules, so they live here, below both.
"""

from __future__ import annotations

from typing import Sequence


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

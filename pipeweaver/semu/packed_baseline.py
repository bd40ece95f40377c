# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The packed-sequence Megatron baseline (``tools/semu.py --pad packed``).

Megatron's pipeline runs one fixed microbatch shape, so a run whose samples are far shorter than
``--seq-length`` pads most of every microbatch unless the samples are packed into sequences
first: Megatron-LM's packed-sequence datasets pack samples offline into sequences of at most the
sequence length (documents separated by the attention mask), and each pipeline microbatch is one
such sequence, padded to the fixed length. This module forms that baseline from the same samples
as every other mode: each DP rank's samples of the iteration (Megatron's sampler order, the
config's global batch in samples) are packed first-fit decreasing into sequences of at most
``micro batch x sequence length`` tokens, and each sequence is one microbatch. First-fit
decreasing over the rank's batch is what a strong offline packer achieves on this data; the
number of microbatches per rank then follows from the data (fewer than the samples).
"""

from __future__ import annotations

from typing import Callable, Sequence

from orchestration.packing import microbatch_indices, pack_sequences
from orchestration.workload import SampleMeta
from pipeweaver.semu.batches import MicrobatchMeta


def pack_first_fit_decreasing(samples: Sequence[SampleMeta], limit: int) -> list[list[SampleMeta]]:
    """``samples`` in sequences of at most ``limit`` LLM tokens, first-fit decreasing.

    Longest first (ties in the given order), each into the first sequence it fits, a new one
    when none; sequences in the order they were opened, each holding its samples in the order
    they were placed. Deterministic.

    Raises:
        ValueError: a sample alone is longer than ``limit`` (named).
    """
    longest = max(samples, key=lambda s: s.llm_tokens, default=None)
    if longest is not None and longest.llm_tokens > limit:
        raise ValueError(
            f"sample {longest.sample_id!r} has {longest.llm_tokens} LLM tokens, more than a "
            f"packed sequence of {limit}"
        )
    return pack_sequences(samples, lambda s: s.llm_tokens, limit)


def packed_batches(
    sample_of: Callable[[int], SampleMeta],
    pack: Callable[[list[SampleMeta]], MicrobatchMeta],
    iteration: int,
    data_parallel: int,
    micro_batch_size: int,
    num_microbatches: int,
    limit: int,
) -> list[list[MicrobatchMeta]]:
    """Every DP rank's packed sequences of one iteration, one microbatch each: ``[rank][mb]``.

    Args:
        sample_of: stream index -> sample metadata.
        pack: a sequence's samples -> its microbatch (padded to the fixed length with PP > 1).
        iteration, data_parallel, micro_batch_size, num_microbatches: Megatron's sampler
            (which samples each rank loads).
        limit: tokens of one packed sequence (``micro batch x sequence length``).
    """
    out = []
    for d in range(data_parallel):
        idx = microbatch_indices(iteration, d, data_parallel, micro_batch_size, num_microbatches)
        samples = [sample_of(k) for mb in idx for k in mb]
        out.append([pack(seq) for seq in pack_first_fit_decreasing(samples, limit)])
    return out

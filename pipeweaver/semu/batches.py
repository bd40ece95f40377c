# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Microbatch metadata as SEMU reads it, built from samples the way the trainer packs them.

A :class:`MicrobatchMeta` holds, per encoder, the units of each sub-microbatch and the LLM rows they
produce, and the LLM's packed sequence lengths (padding runs included). It is derived from
:class:`~orchestration.workload.SampleMeta` alone, mirroring
``megatron.mllm.batch.build_microbatch`` (which pipeweaver may not import; tests check that both
sides agree) and sharing :mod:`orchestration.packing` with the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from orchestration.packing import encoder_sub_groups, microbatch_indices, padding_runs
from orchestration.workload import SampleMeta
from pipeweaver.dataflow import MicrobatchStructure


@dataclass(frozen=True)
class SubBatch:
    """One sub-microbatch of an encoder."""

    units: tuple[int, ...]
    """Encoder tokens of each unit, in packing order (each unit attends only to itself)."""

    rows: int
    """LLM rows the sub's items produce (their ``llm_tokens``)."""


@dataclass(frozen=True)
class MicrobatchMeta:
    """The shapes of one microbatch, per module."""

    llm_seq_lens: tuple[int, ...]
    """Packed LLM sequences: one per sample, then the padding runs."""

    real_tokens: int
    """LLM tokens that are not padding."""

    encoders: Mapping[str, tuple[SubBatch, ...]] = field(default_factory=dict)
    """Per encoder with units in this microbatch, its subs."""

    model_flops: float = 0.0
    """Model training FLOPs of the samples (real tokens only), for MFU."""

    num_samples: int = 0
    """Samples packed in it (0: unknown; host costs then count every LLM sequence)."""

    def __hash__(self) -> int:
        return hash((self.llm_seq_lens, self.real_tokens, tuple(sorted(self.encoders.items()))))

    def num_subs(self, encoder: str) -> int:
        """Subs of an encoder (0 when absent)."""
        return len(self.encoders.get(encoder, ()))

    def compute_sequences(self, module: str, sub: int) -> tuple[tuple[int, ...], int]:
        """The sequences a compute of ``module`` on sub ``sub`` runs over, and the LLM rows the
        sub projects (0 for the LLM): :class:`pipeweaver.interleave.SequencedMicrobatch`."""
        if module == "llm":
            return self.llm_seq_lens, 0
        batch = self.encoders[module][sub]
        return batch.units, batch.rows


def pack_microbatch(
    samples: Sequence[SampleMeta],
    encoders: Sequence[str],
    pad_to: int | None = None,
    max_pad_run: int | None = None,
    sub_tokens: int | None = None,
    flops_of: Callable[[SampleMeta], float] | None = None,
    sub_units: Mapping[str, int] | None = None,
) -> MicrobatchMeta:
    """The shapes of a microbatch of ``samples``, packed as the trainer packs them.

    Args:
        samples: in packing order.
        encoders: encoders the model has (items of others are ignored, as the model has no
            place for them; the trainer rejects them).
        pad_to: pad the LLM sequence to this many tokens (PP > 1 baseline).
        max_pad_run: longest padding run (the sequence length).
        sub_tokens: encoder tokens per sub-microbatch, the trainer's
            ``--encoder-sub-microbatch-tokens`` (None or 0: one sub per encoder).
        flops_of: model FLOPs of a sample (for MFU), e.g. ``ModelShape.sample_phase_flops``.
        sub_units: per encoder, B_i units per sub-microbatch (the trainer's
            ``--encoder-sub-microbatch-size``): N units are cut into ceil(N / B_i) near-equal
            subs, instead of by ``sub_tokens``.
    """
    lens = [s.llm_tokens for s in samples]
    real = sum(lens)
    lens += padding_runs(real, pad_to, max_pad_run or pad_to or 1)
    enc_out = {}
    for enc in encoders:
        items = [item for s in samples for item in s.encoder_items(enc)]
        if not items:
            continue
        groups = encoder_sub_groups(
            [(len(it.units), it.encoder_tokens, it.llm_tokens) for it in items],
            sub_tokens,
            (sub_units or {}).get(enc),
        )
        enc_out[enc] = tuple(
            SubBatch(
                tuple(u for it in items[lo:hi] for u in it.units),
                sum(it.llm_tokens for it in items[lo:hi]),
            )
            for lo, hi in groups
        )
    flops = sum(flops_of(s) for s in samples) if flops_of is not None else 0.0
    return MicrobatchMeta(tuple(lens), real, enc_out, flops, len(samples))


def structure_of(
    microbatches: Sequence[MicrobatchMeta], encoders: Sequence[str]
) -> MicrobatchStructure:
    """The IR's microbatch structure (subs per encoder and microbatch)."""
    return MicrobatchStructure(
        len(microbatches), {e: tuple(mb.num_subs(e) for mb in microbatches) for e in encoders}
    )


def step_microbatches(
    sample_of: Callable[[int], SampleMeta],
    iteration: int,
    data_parallel: int,
    micro_batch_size: int,
    num_microbatches: int,
    encoders: Sequence[str],
    pad_to: int | None = None,
    max_pad_run: int | None = None,
    sub_tokens: int | None = None,
    flops_of: Callable[[SampleMeta], float] | None = None,
    sub_units: Mapping[str, int] | None = None,
) -> list[list[MicrobatchMeta]]:
    """Every DP rank's microbatches of one iteration, as the trainer forms them.

    Args:
        sample_of: stream index -> sample metadata (e.g. ``WorkloadGenerator.sample``).
        sub_units: as :func:`pack_microbatch`'s.

    Returns:
        ``[dp_rank][microbatch]``.
    """
    out = []
    for d in range(data_parallel):
        idx = microbatch_indices(iteration, d, data_parallel, micro_batch_size, num_microbatches)
        out.append(
            [
                pack_microbatch(
                    [sample_of(k) for k in mb],
                    encoders,
                    pad_to,
                    max_pad_run,
                    sub_tokens,
                    flops_of,
                    sub_units,
                )
                for mb in idx
            ]
        )
    return out

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Samples longer than ``--seq-length``: an error, cut to fit, or skipped (``--overlong-samples``).

Pure numpy. Every decision is taken on the *gathered* metadata of an iteration, on every DP rank
alike, and depends only on the sample itself and ``--seq-length``: the same global batch is cut
the same way whatever the parallel layout, and the counts of what was done are global without
another collective.

- ``error`` (the default): the first over-long sample stops every rank, named
  (:func:`check_fits`).
- ``truncate``: the sample's text is cut from its end until the sample fits; items are never
  cut. The first and last text tokens (``<s>`` and ``</s>`` of real data) are kept.
- ``drop``: the sample leaves the batch; its microbatch may end up with no sample at all (it is
  then packed as one masked padding token, so every rank still runs every microbatch).

Under ``truncate`` and ``drop``, an item whose own LLM tokens plus the sample's text that
cannot be cut exceed ``--seq-length`` is an error naming the sample and the item; so is, under
``truncate``, a sample whose items together leave no room for that text.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from orchestration.metadata import GatheredMetadata
from orchestration.workload import MODALITIES, SampleMeta

OVERLONG_CHOICES = ("error", "truncate", "drop")
"""``--overlong-samples`` choices."""

KEPT_TEXT_TOKENS = 2
"""Text tokens truncation never cuts: the sample's first and last (``<s>`` and ``</s>``)."""


class SequenceTooLongError(ValueError):
    """A sample does not fit the LLM's sequence length."""


@dataclass(frozen=True, slots=True)
class FittedBatch:
    """An iteration's gathered metadata after ``--overlong-samples`` was applied."""

    metadata: GatheredMetadata
    """The batch as it trains: truncated samples' text shortened, dropped samples removed."""

    source_offsets: np.ndarray
    """(R+1,) the ``sample_offsets`` of the gathered metadata before fitting."""

    kept_text: np.ndarray
    """(S,) per sample of the gathered metadata, the text tokens it keeps; -1 when dropped."""

    truncated: int
    """Samples of the whole batch (all DP ranks) whose text was cut."""

    dropped: int
    """Samples of the whole batch (all DP ranks) that were skipped."""

    def own(
        self, microbatches: Sequence[Sequence[tuple[int, SampleMeta]]], rank: int
    ) -> list[list[tuple[int, SampleMeta]]]:
        """DP rank ``rank``'s ``(stream index, metadata)`` microbatches, fitted the same way.

        Args:
            microbatches: the rank's samples as loaded (their order is the gathered one).
            rank: the rank's index in the DP group.
        """
        position = int(self.source_offsets[rank])
        out = []
        for mb in microbatches:
            kept = []
            for k, meta in mb:
                text = int(self.kept_text[position])
                position += 1
                if text >= 0:
                    kept.append((k, truncated_meta(meta, text)))
            out.append(kept)
        return out


def truncated_meta(meta: SampleMeta, text_tokens: int) -> SampleMeta:
    """``meta`` with its text cut to ``text_tokens`` (itself when nothing is cut)."""
    if text_tokens >= meta.text_tokens:
        return meta
    runs = meta.text_runs
    if runs is not None:
        # The kept ids are the text's prefix and its last id (truncated_text_ids): the prefix
        # fills the document's runs in order, and the last id ends the last run.
        left, cut = text_tokens - 1, []
        for r in runs:
            cut.append(min(r, left))
            left -= cut[-1]
        cut[-1] += 1
        runs = tuple(cut)
    return dataclasses.replace(meta, text_tokens=text_tokens, text_runs=runs)


def truncated_text_ids(text_ids: Sequence[int], text_tokens: int) -> tuple[int, ...]:
    """Real data: the token ids a truncated sample keeps: the prefix of its text, then its last
    id (``</s>``), ``text_tokens`` in all."""
    ids = tuple(text_ids)
    if text_tokens >= len(ids):
        return ids
    if text_tokens < min(len(ids), KEPT_TEXT_TOKENS):
        raise ValueError(f"cannot keep {text_tokens} of {len(ids)} text ids: <s> and </s> stay")
    return ids[: text_tokens - 1] + ids[-1:]


def check_fits(metadata: GatheredMetadata, seq_length: int) -> None:
    """Raise :class:`SequenceTooLongError` naming the first sample longer than ``seq_length``."""
    lengths = metadata.sample_llm
    too_long = np.flatnonzero(lengths > seq_length)
    if not too_long.size:
        return
    s = int(too_long[0])
    rank = int(metadata.sample_rank[s])
    text = int(metadata.sample_text[s])
    n = int(lengths[s])
    raise SequenceTooLongError(
        f"sample {_sample_id(metadata, s)!r} (stream index {int(metadata.sample_stream[s])}, "
        f"loaded by data-parallel rank {rank}) has {n} LLM tokens ({text} text + {n - text} "
        f"from encoders), more than --seq-length {seq_length}"
    )


def fit_batch(metadata: GatheredMetadata, seq_length: int, policy: str) -> FittedBatch:
    """Apply ``--overlong-samples truncate`` or ``drop`` to an iteration's gathered metadata.

    Raises:
        SequenceTooLongError: naming the first over-long sample (canonical order) with an item
            that alone does not fit, or (``truncate``) whose items leave no room for its text.
    """
    if policy not in ("truncate", "drop"):
        raise ValueError(f"fit_batch applies 'truncate' or 'drop', not {policy!r}")
    md = metadata
    text = md.sample_text.astype(np.int64)
    kept = text.copy()
    over = np.flatnonzero(md.sample_llm > seq_length)
    if not over.size:
        return FittedBatch(md, md.sample_offsets, kept, 0, 0)
    fixed = np.minimum(text, KEPT_TEXT_TOKENS)
    items_llm = md.sample_llm - text
    for s in over.tolist():
        _check_items(md, s, int(fixed[s]), seq_length)
        if policy == "drop":
            kept[s] = -1
        elif items_llm[s] + fixed[s] > seq_length:
            raise SequenceTooLongError(
                f"{_where(md, s)}: its items take {int(items_llm[s])} LLM tokens, more than "
                f"--seq-length {seq_length} with the {int(fixed[s])} text tokens truncation "
                "keeps (<s> and </s>); --overlong-samples truncate cannot make it fit (drop "
                "skips such samples)"
            )
        else:
            kept[s] = seq_length - int(items_llm[s])
    rank_samples = []
    for r in range(md.num_ranks):
        rank_samples.append(
            [
                (int(md.sample_stream[s]), truncated_meta(md.sample_meta(s), int(kept[s])))
                for s in md.rank_samples(r)
                if kept[s] >= 0
            ]
        )
    truncated = int(np.count_nonzero((kept >= 0) & (kept < text)))
    dropped = int(np.count_nonzero(kept < 0))
    fitted = GatheredMetadata.from_rank_samples(rank_samples)
    return FittedBatch(fitted, md.sample_offsets, kept, truncated, dropped)


def _check_items(md: GatheredMetadata, s: int, fixed_text: int, seq_length: int) -> None:
    """Raise naming sample ``s``'s first item that, with ``fixed_text``, exceeds the limit."""
    lo, hi = np.searchsorted(md.item_sample, [s, s + 1])
    seen = {m: 0 for m in MODALITIES}
    for i in range(int(lo), int(hi)):
        modality = MODALITIES[int(md.item_modality[i])]
        index = seen[modality]
        seen[modality] += 1
        llm = int(md.item_llm[i])
        if llm + fixed_text > seq_length:
            units = int(np.count_nonzero(md.unit_item == i))
            raise SequenceTooLongError(
                f"{_where(md, s)}: its {modality} {index} alone takes {llm} LLM tokens "
                f"({units} encoder units), with its {fixed_text} text tokens that cannot be cut "
                f"more than --seq-length {seq_length}: raise --seq-length, or lower the image or "
                "audio resolution"
            )


def _sample_id(md: GatheredMetadata, s: int) -> str:
    return md.sample_ids[s] if md.sample_ids is not None else f"#{s}"


def _where(md: GatheredMetadata, s: int) -> str:
    return (
        f"--overlong-samples: sample {_sample_id(md, s)!r} (stream index "
        f"{int(md.sample_stream[s])}, loaded by data-parallel rank {int(md.sample_rank[s])}, "
        f"{int(md.sample_llm[s])} LLM tokens)"
    )

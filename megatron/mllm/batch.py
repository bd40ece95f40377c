# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Packed microbatches: samples of different lengths in one THD sequence per module.

The LLM sees the microbatch's samples back to back, each attending only to itself (causal);
each encoder sees the microbatch's units back to back, each attending only to itself. Every
index a module needs (where an item's encoder outputs go in the LLM sequence, which encoder
tokens pool into which LLM token) is derived from sample metadata alone, so all ranks agree on
shapes without exchanging them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.mllm.preprocess import IMAGE_MEAN, IMAGE_STD
from orchestration.packing import padding_runs
from orchestration.workload import ENCODER_OF_MODALITY, MODALITIES, SampleMeta

PLACEHOLDER_TOKEN = 0
"""Token id at item positions and padding; its embedding is replaced or masked."""


@dataclass(frozen=True)
class ItemSpan:
    """Where one item sits in its sample's LLM sequence."""

    modality: str
    """"image", "audio" or "video"."""

    index: int
    """Index of the item among the sample's items of that modality."""

    start: int
    """First LLM position of the item."""

    length: int
    """LLM positions of the item."""


def sample_layout(meta: SampleMeta) -> tuple[list[ItemSpan], list[tuple[int, int]]]:
    """Where items and text sit in a sample's LLM sequence.

    With ``meta.text_runs`` (a real document), the items sit in document order with those text
    runs around them. Without, the text is split evenly into ``n_items + 1`` runs around the
    items in ``MODALITIES`` order (the remainder goes to the last run):
    ``text_0, item_0, text_1, item_1, ..., text_n``.

    Returns:
        The item spans in sequence order, and the ``(start, length)`` text runs.
    """
    items = meta.document_items()
    if meta.text_runs is not None:
        lengths = list(meta.text_runs)
    else:
        runs = len(items) + 1
        base = meta.text_tokens // runs
        lengths = [base] * runs
        lengths[-1] += meta.text_tokens - base * runs
    spans, text, pos = [], [], 0
    for r, length in enumerate(lengths):
        text.append((pos, length))
        pos += length
        if r < len(items):
            m, i, item = items[r]
            spans.append(ItemSpan(m, i, pos, item.llm_tokens))
            pos += item.llm_tokens
    return spans, text


@dataclass(frozen=True)
class ChatTurns:
    """The turn token ids of ``--prompt-format chat``: the loss then scores only the assistant's
    replies (:func:`build_microbatch`)."""

    user: int
    """``<|user|>``: opens a user turn."""

    assistant: int
    """``<|assistant|>``: opens an assistant turn."""

    end: int
    """``<|end|>``: closes a turn."""

    @classmethod
    def of(cls, tokenizer) -> "ChatTurns":
        """The ids of a :class:`~megatron.mllm.tokenizer.TextTokenizer`'s chat tokens."""
        from megatron.mllm.tokenizer import CHAT_TOKENS  # (user, assistant, end), our order

        return cls(*(tokenizer.token_id(t) for t in CHAT_TOKENS))

    def in_reply(self, tokens: np.ndarray) -> np.ndarray:
        """Which positions of a sample's ``tokens`` lie in an assistant turn: after its
        ``<|assistant|>``, up to and including the ``<|end|>`` that closes it.

        Position ``j`` is in a reply when the last turn token before it is ``<|assistant|>``;
        the turn tokens themselves are not (but for the closing ``<|end|>``).
        """
        tokens = np.asarray(tokens)
        kind = np.full(tokens.shape[0], -1, dtype=np.int8)  # -1: not a turn token
        kind[(tokens == self.user) | (tokens == self.end)] = 0
        kind[tokens == self.assistant] = 1
        last = np.where(kind >= 0, np.arange(tokens.shape[0]), -1)
        np.maximum.accumulate(last, out=last)  # the last turn token at or before each position
        opened = np.where(last >= 0, kind[np.maximum(last, 0)], 0) == 1
        out = np.zeros(tokens.shape[0], dtype=bool)
        out[1:] = opened[:-1]
        return out


@dataclass
class SamplePayload:
    """The data of one sample, consistent with its metadata."""

    tokens: np.ndarray
    """LLM token ids ``[llm_tokens]``; item positions hold :data:`PLACEHOLDER_TOKEN`."""

    units: dict[str, list[np.ndarray]] = field(default_factory=dict)
    """Per encoder, the input of each unit, ``[unit_tokens, input_dim]``: float32 features, or
    an image's uint8 pixel patches (real data: :func:`encoder_features` normalises them)."""


PIXEL_ENCODER = ENCODER_OF_MODALITY["image"]
"""The encoder whose real-data units are raw pixels (:mod:`megatron.mllm.preprocess`)."""


def encoder_input_dtype(encoder: str, real_data: bool) -> torch.dtype:
    """The dtype of ``encoder``'s payload units, which every rank must agree on before an
    exchange (a rank with no units still sends an empty block of that dtype): uint8 pixel
    patches for the image encoder of real data (``--data-path``), else float32."""
    return torch.uint8 if real_data and encoder == PIXEL_ENCODER else torch.float32


def encoder_features(rows: Tensor) -> Tensor:
    """An encoder's input rows as its first layer takes them.

    Float rows are features already. Uint8 rows are pixel patches ``[n, 3 p p]``, channel-major,
    normalised here by the ImageNet mean and deviation: on the device that runs the encoder,
    after any exchange, so a patch moves as a byte per channel and every rank computes the same
    floats from the same bytes.
    """
    if rows.dtype != torch.uint8:
        return rows
    if rows.shape[-1] % 3:
        raise ValueError(f"pixel patches must hold 3 channels, got rows of {rows.shape[-1]}")
    per_channel = rows.shape[-1] // 3

    def channels(values):
        return torch.tensor(values, dtype=torch.float32, device=rows.device).repeat_interleave(
            per_channel
        )

    return (rows.to(torch.float32) / 255.0 - channels(IMAGE_MEAN)) / channels(IMAGE_STD)


@dataclass
class EncoderInput:
    """One encoder's share of a packed microbatch."""

    unit_lens: list[int]
    """Tokens of each unit, in packing order."""

    features: Tensor | None
    """Input features ``[tokens, input_dim]``, or None where the payload is not needed."""

    positions: Tensor
    """Position of every token within its unit ``[tokens]``."""

    pool_rows: Tensor
    """For each pooling pair, the output row it adds to."""

    pool_tokens: Tensor
    """For each pooling pair, the encoder token it reads."""

    pool_counts: Tensor
    """Encoder tokens averaged into each output row ``[rows, 1]``."""

    num_rows: int
    """Output rows: the LLM tokens this encoder produces for the microbatch."""

    @property
    def num_tokens(self) -> int:
        """Encoder tokens of the microbatch."""
        return sum(self.unit_lens)

    def packed_seq_params(self) -> PackedSeqParams:
        """THD parameters: one sequence per unit."""
        return thd_params(self.unit_lens, self.positions.device)


@dataclass
class LanguageInput:
    """The LLM's share of a packed microbatch."""

    seq_lens: list[int]
    """Length of each packed sequence: one per sample, plus one padding run when padded."""

    tokens: Tensor
    """Token ids ``[S]``."""

    position_ids: Tensor
    """Position within each sample ``[S]``."""

    labels: Tensor
    """Next-token targets ``[S]`` (0 where the loss mask is 0)."""

    loss_mask: Tensor
    """1.0 where the next token is a text token of the same sample ``[S]`` (with chat turns, one
    of an assistant's reply)."""

    splice_positions: dict[str, Tensor] = field(default_factory=dict)
    """Per encoder, the LLM positions that receive its output rows, in row order."""

    @property
    def length(self) -> int:
        """Total packed length S, padding included."""
        return sum(self.seq_lens)

    def packed_seq_params(self) -> PackedSeqParams:
        """THD parameters: one sequence per sample (and the padding run)."""
        return thd_params(self.seq_lens, self.tokens.device)


@dataclass
class PackedMicrobatch:
    """A microbatch as every module of the model consumes it."""

    sample_ids: list[str]
    """Ids of the samples, in packing order."""

    language: LanguageInput
    """The LLM's inputs."""

    encoders: dict[str, EncoderInput]
    """Each encoder's inputs; an encoder with no units in this microbatch is absent."""

    encoder_hidden: dict[str, Tensor] = field(default_factory=dict)
    """Per encoder, the final hidden states of its units ``[tokens, h]`` when they were computed
    elsewhere (the per-phase balanced step); the model then runs only the encoder's head."""

    @property
    def num_loss_tokens(self) -> int:
        """Tokens that contribute to the loss."""
        return int(self.language.loss_mask.sum().item())


def thd_params(lens: Sequence[int], device) -> PackedSeqParams:
    """THD parameters of independent sequences of ``lens`` tokens: one per unit or sample."""
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
    cu = cu.to(device)
    longest = max(lens) if lens else 0
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )


def pooling_pairs(encoder_tokens: int, llm_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Which encoder tokens average into which LLM token, for one item.

    LLM token ``r`` of ``K`` averages the encoder tokens ``[floor(r E / K), floor((r+1) E / K))``
    of ``E``, at least one: a merge of ``E/K`` consecutive tokens when ``K <= E`` (a 2x2 patch
    merge over row-major tokens when E/K = 4), and a repetition when ``K > E``.

    Returns:
        ``(rows, tokens)``: parallel arrays of pairs.
    """
    r = np.arange(llm_tokens)
    lo = (r * encoder_tokens) // llm_tokens
    hi = np.maximum(((r + 1) * encoder_tokens) // llm_tokens, lo + 1)
    counts = hi - lo
    rows = np.repeat(r, counts)
    offsets = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return rows, lo[rows] + offsets


def build_microbatch(
    samples: Sequence[tuple[SampleMeta, SamplePayload]],
    encoders: Sequence[str],
    pad_to: int | None = None,
    device: torch.device | str = "cpu",
    with_features: bool = True,
    max_pad_run: int | None = None,
    chat_turns: ChatTurns | None = None,
) -> PackedMicrobatch:
    """Pack samples into one microbatch.

    Args:
        samples: ``(metadata, payload)`` pairs, in packing order.
        encoders: encoders the model has; items of other encoders are an error.
        pad_to: pad the LLM sequence to this length (fixed shapes for Megatron's pipeline
            schedules); None packs without padding.
        device: where the tensors go.
        with_features: materialise encoder input features; stages that run no encoder input
            layer only need shapes, tokens and labels.
        max_pad_run: the longest padding run (longer padding is split into several).
        chat_turns: ``--prompt-format chat``'s turn tokens: a position is then a target only
            where the next token is text inside an assistant turn (its reply and the
            ``<|end|>`` closing it), read off the token ids alone, so every rank that packs a
            sample masks it alike. None (captions, synthetic data): every next text token.

    Raises:
        ValueError: a payload disagrees with its metadata, a sample needs an encoder the model
            lacks, or the packed length exceeds ``pad_to``; the message names the sample.
    """
    if not samples and pad_to is None:
        # Every sample was dropped (--overlong-samples drop): one masked padding token keeps
        # the microbatch, so each rank still runs its forward and backward (zero loss tokens).
        pad_to = 1
    seq_lens: list[int] = []
    tokens, positions, labels, mask = [], [], [], []
    splice: dict[str, list[np.ndarray]] = {e: [] for e in encoders}
    enc_units: dict[str, list[int]] = {e: [] for e in encoders}
    enc_feats: dict[str, list[np.ndarray]] = {e: [] for e in encoders}
    enc_pool: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {e: [] for e in encoders}
    enc_tokens = {e: 0 for e in encoders}
    enc_rows = {e: 0 for e in encoders}
    offset = 0
    for meta, payload in samples:
        n = meta.llm_tokens
        spans, _ = sample_layout(meta)
        is_text = np.ones(n, dtype=bool)
        for span in spans:
            is_text[span.start : span.start + span.length] = False
            enc = ENCODER_OF_MODALITY[span.modality]
            if enc not in splice:
                raise ValueError(
                    f"sample {meta.sample_id!r} has {span.modality} items but the model has no "
                    f"{enc} encoder (--{enc}-num-layers is 0)"
                )
            item = meta.items(span.modality)[span.index]
            splice[enc].append(np.arange(span.start, span.start + span.length) + offset)
            rows, toks = pooling_pairs(item.encoder_tokens, item.llm_tokens)
            enc_pool[enc].append((rows + enc_rows[enc], toks + enc_tokens[enc]))
            enc_units[enc].extend(item.units)
            enc_tokens[enc] += item.encoder_tokens
            enc_rows[enc] += item.llm_tokens
        if payload.tokens.shape != (n,):
            raise ValueError(
                f"sample {meta.sample_id!r}: payload has {payload.tokens.shape[0]} tokens, "
                f"metadata says {n}"
            )
        tokens.append(payload.tokens)
        if with_features:
            for enc in encoders:
                enc_feats[enc].extend(payload.units.get(enc, []))
        positions.append(np.arange(n))
        lab = np.zeros(n, dtype=np.int64)
        m = np.zeros(n, dtype=np.float32)
        nxt = is_text[1:]
        if chat_turns is not None:
            nxt = nxt & chat_turns.in_reply(payload.tokens)[1:]
        m[:-1] = nxt
        lab[:-1] = np.where(nxt, payload.tokens[1:], 0)
        labels.append(lab)
        mask.append(m)
        seq_lens.append(n)
        offset += n
    if pad_to is not None:
        if offset > pad_to:
            raise ValueError(
                f"samples {[meta.sample_id for meta, _ in samples]} pack to {offset} LLM tokens, "
                f"more than the fixed microbatch length {pad_to}"
            )
        for pad in padding_runs(offset, pad_to, max_pad_run or pad_to):
            seq_lens.append(pad)
            tokens.append(np.full(pad, PLACEHOLDER_TOKEN, dtype=np.int64))
            positions.append(np.arange(pad))
            labels.append(np.zeros(pad, dtype=np.int64))
            mask.append(np.zeros(pad, dtype=np.float32))

    def t(parts, dtype):
        return torch.from_numpy(np.concatenate(parts).astype(dtype, copy=False)).to(device)

    language = LanguageInput(
        seq_lens=seq_lens,
        tokens=t(tokens, np.int64),
        position_ids=t(positions, np.int64),
        labels=t(labels, np.int64),
        loss_mask=t(mask, np.float32),
        splice_positions={e: t(v, np.int64) for e, v in splice.items() if v},
    )
    enc_inputs = {}
    for enc in encoders:
        if not enc_units[enc]:
            continue
        feats = None
        if with_features:
            got = sum(f.shape[0] for f in enc_feats[enc])
            if got != enc_tokens[enc] or len(enc_feats[enc]) != len(enc_units[enc]):
                raise ValueError(
                    f"{enc} payload of samples {[meta.sample_id for meta, _ in samples]} has "
                    f"{len(enc_feats[enc])} units / {got} tokens, metadata says "
                    f"{len(enc_units[enc])} / {enc_tokens[enc]}"
                )
            feats = encoder_features(torch.from_numpy(np.concatenate(enc_feats[enc])).to(device))
        rows = np.concatenate([r for r, _ in enc_pool[enc]])
        toks = np.concatenate([k for _, k in enc_pool[enc]])
        counts = np.bincount(rows, minlength=enc_rows[enc]).astype(np.float32)
        enc_inputs[enc] = EncoderInput(
            unit_lens=list(enc_units[enc]),
            features=feats,
            positions=t([np.arange(u) for u in enc_units[enc]], np.int64),
            pool_rows=torch.from_numpy(rows).to(device),
            pool_tokens=torch.from_numpy(toks).to(device),
            pool_counts=torch.from_numpy(counts).view(-1, 1).to(device),
            num_rows=enc_rows[enc],
        )
    return PackedMicrobatch(
        sample_ids=[meta.sample_id for meta, _ in samples], language=language, encoders=enc_inputs
    )


def split_encoder_input(
    enc: EncoderInput, items: Sequence[tuple[int, int, int]], groups: Sequence[tuple[int, int]]
) -> list[EncoderInput]:
    """Cut a microbatch's encoder inputs into sub-microbatches of whole items.

    Args:
        enc: the microbatch's inputs of one encoder.
        items: ``(units, encoder tokens, LLM rows)`` of each item, in packing order.
        groups: ``[start, stop)`` item ranges of the subs, consecutive and covering all items.

    Returns:
        One :class:`EncoderInput` per sub; its rows are the sub's slice of the microbatch's rows
        (items never straddle subs, so every pooling pair stays inside its sub).
    """
    bounds = np.cumsum([(0, 0, 0)] + [tuple(x) for x in items], axis=0)
    pool_rows = enc.pool_rows
    out = []
    for a, b in groups:
        u0, t0, r0 = (int(v) for v in bounds[a])
        u1, t1, r1 = (int(v) for v in bounds[b])
        sel = (pool_rows >= r0) & (pool_rows < r1)
        out.append(
            EncoderInput(
                unit_lens=enc.unit_lens[u0:u1],
                features=None if enc.features is None else enc.features[t0:t1],
                positions=enc.positions[t0:t1],
                pool_rows=pool_rows[sel] - r0,
                pool_tokens=enc.pool_tokens[sel] - t0,
                pool_counts=enc.pool_counts[r0:r1],
                num_rows=r1 - r0,
            )
        )
    return out

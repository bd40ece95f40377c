# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The metadata every DP rank all-gathers before planning, and the items of each phase.

Pure numpy. Each DP rank encodes its samples' metadata (a few ints per sample, item and unit)
with :func:`encode_rank_metadata`; the dispatcher all-gathers these int64 arrays and
:meth:`GatheredMetadata.from_flat` rebuilds the global table, identical on every rank. Tests and
tools use :meth:`GatheredMetadata.from_rank_samples`, the same without collectives.

Items and local lists
---------------------
The items of a phase come in a *canonical order*: rank, sample position on the rank, then
(encoders) modality in ``MODALITIES`` order, item, unit. An encoder phase's items are all the
encoder units of its modalities (an image, a tile, a 30 s window); the LLM phase's items are
the samples. Each rank holds a *local list* of a phase's items before an exchange (its own, in
canonical order: ``src_pos``) and another after (those assigned to it, ordered by (source
rank, source position): ``dst_pos``). Units of one sample are therefore consecutive in both.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from orchestration.cost_model import unit_output_tokens
from orchestration.workload import (
    ENCODER_OF_MODALITY,
    MODALITIES,
    PHASES,
    Item,
    SampleMeta,
    missing_encoder_error,
)

METADATA_VERSION = 2
"""First int of every encoded rank's metadata; bump when the layout changes."""

_ENCODER_CODE = {"vision": 0, "audio": 1}
_MODALITY_ENCODER = np.array([_ENCODER_CODE[ENCODER_OF_MODALITY[m]] for m in MODALITIES])


class PlanError(ValueError):
    """Bad input to the planner: malformed metadata, or plans that differ across ranks."""


class PlanDigestMismatch(PlanError):
    """Ranks computed different plans (different metadata or a nondeterministic planner)."""


def check_digests(digests: Sequence[str], what: str = "balance plan") -> None:
    """Raise :class:`PlanDigestMismatch` naming the ranks whose digest differs from rank 0's.

    Args:
        digests: every rank's digest, in rank order (all-gathered by the dispatcher).
        what: names the digest in the error.
    """
    bad = [r for r, d in enumerate(digests) if d != digests[0]]
    if bad:
        detail = ", ".join(f"rank {r}: {digests[r][:12]}" for r in [0, *bad])
        raise PlanDigestMismatch(
            f"{what} digest differs across ranks {bad} vs rank 0 ({detail}): the ranks saw "
            "different sample metadata, or planned with different flags"
        )


def encode_rank_metadata(samples: Sequence[tuple[int, SampleMeta]]) -> np.ndarray:
    """One rank's metadata as a flat int64 array, the payload of the metadata all-gather.

    Layout: ``[VERSION, S, I, U, stream[S], text[S], item_sample[I], item_modality[I],
    item_llm[I], item_units[I], unit_tokens[U]]`` with ``S`` samples, ``I`` items, ``U``
    units; ``item_sample`` is the sample's position on this rank. When a sample has a text
    layout (``SampleMeta.text_runs``), a tail follows: ``[L, (pos, runs[n+1], order[n]) * L]``
    for the ``L`` such samples, ``pos`` the sample's position, ``n`` its items and ``order[j]``
    the canonical index (modality order) of its ``j``-th item in document order. Without one
    there is no tail: synthetic metadata costs what it did.

    Args:
        samples: (stream index, metadata) of each of the rank's samples, in loading order.
    """
    stream, text, i_s, i_m, i_l, i_u, u_t = [], [], [], [], [], [], []
    for pos, (index, meta) in enumerate(samples):
        stream.append(int(index))
        text.append(meta.text_tokens)
        for code, m in enumerate(MODALITIES):
            for item in meta.items(m):
                i_s.append(pos)
                i_m.append(code)
                i_l.append(item.llm_tokens)
                i_u.append(len(item.units))
                u_t.extend(item.units)
    head = [METADATA_VERSION, len(stream), len(i_s), len(u_t)]
    tail = _layout_tail(samples)
    return np.array(head + stream + text + i_s + i_m + i_l + i_u + u_t + tail, dtype=np.int64)


def encode_strings(strings: Sequence[str]) -> np.ndarray:
    """Strings (sample ids) as int64 words, to ride on the metadata all-gather instead of a
    pickled object gather of their own: ``[n, nbytes, len[n], utf8 bytes padded to 8]``."""
    raw = [s.encode("utf-8") for s in strings]
    data = b"".join(raw)
    padded = data + bytes(-len(data) % 8)
    head = np.array([len(raw), len(data), *(len(b) for b in raw)], dtype=np.int64)
    return np.concatenate([head, np.frombuffer(padded, dtype=np.int64)])


def decode_strings(words: np.ndarray) -> tuple[list[str], int]:
    """:func:`encode_strings`' strings, and the words they took."""
    n, nbytes = int(words[0]), int(words[1])
    lens = words[2 : 2 + n].tolist()
    end = 2 + n + -(-nbytes // 8)
    data = np.ascontiguousarray(words[2 + n : end]).tobytes()[:nbytes]
    out, at = [], 0
    for length in lens:
        out.append(data[at : at + length].decode("utf-8"))
        at += length
    return out, end


def _layout_tail(samples: Sequence[tuple[int, SampleMeta]]) -> list[int]:
    """The text layouts of the samples that have one (see :func:`encode_rank_metadata`)."""
    tail: list[int] = []
    count = 0
    for pos, (_, meta) in enumerate(samples):
        if meta.text_runs is None:
            continue
        canonical = {(m, i): c for c, (m, i, _) in enumerate(_canonical_items(meta))}
        order = [canonical[(m, i)] for m, i, _ in meta.document_items()]
        tail += [pos, *meta.text_runs, *order]
        count += 1
    return [count, *tail] if count else []


def _canonical_items(meta: SampleMeta) -> list[tuple[str, int, Item]]:
    return [(m, i, item) for m in MODALITIES for i, item in enumerate(meta.items(m))]


def _parse_layouts(
    tail: np.ndarray, items_per_sample: np.ndarray, texts: np.ndarray, first: int, rank: int
) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """The text layouts of one rank's tail, keyed by global sample index (``first`` is the
    rank's first); :class:`PlanError` naming the rank on a malformed tail."""

    def bad(why: str) -> PlanError:
        return PlanError(f"metadata of DP rank {rank}: malformed text-layout tail ({why})")

    if tail.size == 0:
        return {}
    count, at, out = int(tail[0]), 1, {}
    for _ in range(max(count, 0)):
        if at >= tail.size:
            raise bad("it ends early")
        pos = int(tail[at])
        if not 0 <= pos < items_per_sample.size or first + pos in out:
            raise bad(f"sample position {pos}")
        n = int(items_per_sample[pos])
        chunk = tail[at + 1 : at + 2 + 2 * n]
        if chunk.size != 2 * n + 1:
            raise bad("it ends early")
        runs, order = chunk[: n + 1], chunk[n + 1 :]
        if runs.min() < 0 or int(runs.sum()) != int(texts[pos]):
            raise bad(f"text runs {runs.tolist()} of sample position {pos}")
        if sorted(order.tolist()) != list(range(n)):
            raise bad(f"item order {order.tolist()} of sample position {pos}")
        out[first + pos] = (tuple(int(r) for r in runs), tuple(int(o) for o in order))
        at += 2 * n + 2
    if count < 0 or at != tail.size:
        raise bad(f"{tail.size} ints for {count} layouts")
    return out


@dataclass(frozen=True, slots=True)
class GatheredMetadata:
    """The metadata of every DP rank's samples, as global arrays in canonical order."""

    num_ranks: int
    """DP ranks (the all-gather's group size)."""

    sample_offsets: np.ndarray
    """(R+1,) the samples of rank r are ``[sample_offsets[r], sample_offsets[r+1])``."""

    sample_stream: np.ndarray
    """(S,) stream index of each sample (its position in the data stream)."""

    sample_text: np.ndarray
    """(S,) text tokens of each sample."""

    item_sample: np.ndarray
    """(I,) global sample index of each item (image, clip, video)."""

    item_modality: np.ndarray
    """(I,) index of each item's modality in ``MODALITIES``."""

    item_llm: np.ndarray
    """(I,) LLM tokens of each item."""

    unit_item: np.ndarray
    """(U,) global item index of each encoder unit."""

    unit_tokens: np.ndarray
    """(U,) encoder tokens of each unit."""

    sample_ids: tuple[str, ...] | None = None
    """Sample ids, when known (not part of the all-gather; names samples in errors)."""

    text_layouts: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]] | None = None
    """Global sample index to ``(text runs, document order of its canonical items)``, for the
    samples with a text layout (``SampleMeta.text_runs``); None when none has one."""

    @classmethod
    def from_flat(
        cls, arrays: Sequence[np.ndarray], sample_ids: Sequence[str] | None = None
    ) -> "GatheredMetadata":
        """Rebuild the table from every rank's :func:`encode_rank_metadata`, in rank order.

        Raises:
            PlanError: an array is malformed (wrong version or length).
        """
        R = len(arrays)
        if R == 0:
            raise PlanError("metadata of no DP rank: the all-gather returned nothing")
        flat = [np.asarray(a).ravel() for a in arrays]
        lens = np.array([a.size for a in flat], dtype=np.int64)
        big = np.concatenate(flat).astype(np.int64)
        base = np.r_[0, np.cumsum(lens)[:-1]]
        short = np.flatnonzero(lens < 4)
        if short.size:
            r = int(short[0])
            raise PlanError(f"metadata of DP rank {r}: bad header {flat[r][:4].tolist()}")
        head = big[base[:, None] + np.arange(4)]
        bad = np.flatnonzero(head[:, 0] != METADATA_VERSION)
        if bad.size:
            r = int(bad[0])
            raise PlanError(
                f"metadata of DP rank {r}: bad header {head[r].tolist()} (expected version "
                f"{METADATA_VERSION})"
            )
        S, I, U = head[:, 1], head[:, 2], head[:, 3]
        bad = np.flatnonzero((np.minimum(np.minimum(S, I), U) < 0) | (lens < 4 + 2 * S + 4 * I + U))
        if bad.size:
            r = int(bad[0])
            raise PlanError(
                f"metadata of DP rank {r}: {int(lens[r])} ints do not match {int(S[r])} "
                f"samples, {int(I[r])} items, {int(U[r])} units"
            )

        def field_of(start: np.ndarray, count: np.ndarray) -> np.ndarray:
            # Every rank's run [start, start + count) of ``big``, concatenated.
            total = int(count.sum())
            first = np.r_[0, np.cumsum(count)[:-1]]
            return big[np.repeat(start - first, count) + np.arange(total)]

        off = base + 4
        cat = {}
        for key, count in (
            ("st", S),
            ("tx", S),
            ("is", I),
            ("im", I),
            ("il", I),
            ("iu", I),
            ("ut", U),
        ):
            cat[key] = field_of(off, count)
            off = off + count
        offsets = np.r_[0, np.cumsum(S)]
        base_sample = int(offsets[-1])
        # Item sample positions are per rank: make them global.
        cat["is"] = cat["is"] + np.repeat(offsets[:-1], I)
        item_units = cat["iu"]
        if cat["ut"].size != int(item_units.sum()) or (item_units.size and item_units.min() < 1):
            raise PlanError("metadata: item unit counts do not match the units")
        if cat["im"].size and (cat["im"].min() < 0 or cat["im"].max() >= len(MODALITIES)):
            raise PlanError("metadata: unknown modality code")
        unit_item = np.repeat(np.arange(item_units.size), item_units)
        layouts: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        body = 4 + 2 * S + 4 * I + U
        for r in np.flatnonzero(lens > body).tolist():
            mine = slice(int(offsets[r]), int(offsets[r + 1]))
            per_sample = np.bincount(
                cat["is"][int(np.sum(I[:r])) : int(np.sum(I[: r + 1]))] - offsets[r],
                minlength=int(S[r]),
            )
            tail = flat[r][int(body[r]) :].astype(np.int64)
            layouts.update(_parse_layouts(tail, per_sample, cat["tx"][mine], int(offsets[r]), r))
        ids = None if sample_ids is None else tuple(str(x) for x in sample_ids)
        if ids is not None and len(ids) != base_sample:
            raise PlanError(f"{len(ids)} sample ids for {base_sample} samples")
        return cls(
            num_ranks=R,
            sample_offsets=offsets.astype(np.int64),
            sample_stream=cat["st"],
            sample_text=cat["tx"],
            item_sample=cat["is"],
            item_modality=cat["im"],
            item_llm=cat["il"],
            unit_item=unit_item,
            unit_tokens=cat["ut"],
            sample_ids=ids,
            text_layouts=layouts or None,
        )

    @classmethod
    def from_rank_samples(
        cls, rank_samples: Sequence[Sequence[tuple[int, SampleMeta]]]
    ) -> "GatheredMetadata":
        """The table from every rank's (stream index, metadata) pairs, as if all-gathered."""
        ids = [meta.sample_id for samples in rank_samples for _, meta in samples]
        return cls.from_flat([encode_rank_metadata(s) for s in rank_samples], sample_ids=ids)

    @property
    def num_samples(self) -> int:
        """Samples over all ranks."""
        return int(self.sample_offsets[-1])

    @property
    def sample_rank(self) -> np.ndarray:
        """(S,) the DP rank that loaded each sample."""
        return np.repeat(np.arange(self.num_ranks), np.diff(self.sample_offsets))

    @property
    def sample_pos(self) -> np.ndarray:
        """(S,) each sample's position in its rank's loading order."""
        return np.arange(self.num_samples) - np.repeat(
            self.sample_offsets[:-1], np.diff(self.sample_offsets)
        )

    @property
    def sample_llm(self) -> np.ndarray:
        """(S,) LLM tokens of each sample: text plus its items' LLM tokens."""
        enc = np.bincount(self.item_sample, weights=self.item_llm, minlength=self.num_samples)
        return self.sample_text + enc.astype(np.int64)

    def sample_meta(self, s: int) -> SampleMeta:
        """The metadata of global sample ``s``, rebuilt from the table (ids must be known)."""
        if self.sample_ids is None:
            raise PlanError("the gathered metadata has no sample ids to rebuild samples with")
        items: dict[str, list[Item]] = {m: [] for m in MODALITIES}
        # Items are sorted by sample and units by item (canonical order): slice, don't scan.
        lo, hi = np.searchsorted(self.item_sample, [s, s + 1])
        for i in range(int(lo), int(hi)):
            a, b = np.searchsorted(self.unit_item, [i, i + 1])
            units = tuple(int(u) for u in self.unit_tokens[a:b])
            items[MODALITIES[int(self.item_modality[i])]].append(Item(units, int(self.item_llm[i])))
        layout = {}
        if self.text_layouts is not None and s in self.text_layouts:
            runs, order = self.text_layouts[s]
            modality = [MODALITIES[int(c)] for c in self.item_modality[int(lo) : int(hi)]]
            layout = {"text_runs": runs, "item_order": tuple(modality[c] for c in order)}
        return SampleMeta(
            self.sample_ids[s],
            int(self.sample_text[s]),
            **{m: tuple(v) for m, v in items.items()},
            **layout,
        )

    def rank_samples(self, rank: int) -> range:
        """Global indices of the samples ``rank`` loaded, in its loading order."""
        return range(int(self.sample_offsets[rank]), int(self.sample_offsets[rank + 1]))

    def sample_label(self, s: int) -> str:
        """Names sample ``s`` in errors: its id when known, and where it was loaded."""
        r = int(np.searchsorted(self.sample_offsets, s, side="right")) - 1
        where = (
            f"DP rank {r}, position {s - int(self.sample_offsets[r])}, "
            f"stream index {int(self.sample_stream[s])}"
        )
        if self.sample_ids is not None:
            return f"sample {self.sample_ids[s]!r} ({where})"
        return f"sample at {where}"

    def digest(self) -> str:
        """sha256 of the table (ids excluded): equal on every rank iff the metadata is."""
        h = hashlib.sha256(b"orchweave-metadata-v1")
        h.update(np.int64(self.num_ranks).tobytes())
        for a in (
            self.sample_offsets,
            self.sample_stream,
            self.sample_text,
            self.item_sample,
            self.item_modality,
            self.item_llm,
            self.unit_tokens,
        ):
            h.update(np.int64(a.size).tobytes())
            h.update(np.ascontiguousarray(a, dtype="<i8").tobytes())
        # Only tables with text layouts hash them: a synthetic table's digest is what it was.
        for s, (runs, order) in sorted((self.text_layouts or {}).items()):
            h.update(np.array([s, len(runs), *runs, *order], dtype="<i8").tobytes())
        return h.hexdigest()


def as_metadata(metadata) -> GatheredMetadata:
    if isinstance(metadata, GatheredMetadata):
        return metadata
    return GatheredMetadata.from_rank_samples(metadata)


# --------------------------------------------------------------------------------------------
# Items of a phase


@dataclass(frozen=True, slots=True)
class PhaseItems:
    """The items of one phase, in canonical order."""

    phase: str
    """"vision", "audio" or "llm"."""

    owner: np.ndarray
    """(n,) the DP rank that loaded each item."""

    src_pos: np.ndarray
    """(n,) position of each item in its owner's local list of this phase."""

    sample: np.ndarray
    """(n,) global sample index of each item (itself, for the LLM phase)."""

    tokens: np.ndarray
    """(n,) tokens of each item: encoder tokens of a unit, LLM tokens of a sample."""

    out_tokens: np.ndarray
    """(n,) LLM tokens attributed to each unit (see ``cost_model.unit_output_tokens``); 0 for
    the LLM phase."""

    unit_in_sample: np.ndarray
    """(n,) position of a unit among its sample's units of this encoder (the order of
    ``SampleMeta.encoder_units``); 0 for the LLM phase."""

    @property
    def size(self) -> int:
        """Number of items."""
        return int(self.tokens.size)


def phase_items(metadata: GatheredMetadata, phase: str) -> PhaseItems:
    """The items of ``phase`` in canonical order."""
    md = metadata
    if phase == "llm":
        n = md.num_samples
        zeros = np.zeros(n, dtype=np.int64)
        return PhaseItems(
            phase,
            md.sample_rank,
            md.sample_pos,
            np.arange(n, dtype=np.int64),
            md.sample_llm,
            zeros,
            zeros,
        )
    if phase not in _ENCODER_CODE:
        raise ValueError(f"unknown phase {phase!r}; phases are {PHASES}")
    units = np.flatnonzero(
        _MODALITY_ENCODER[md.item_modality[md.unit_item]] == _ENCODER_CODE[phase]
    )
    unit_item = md.unit_item[units]
    tokens = md.unit_tokens[units]
    # All units of an item go to one encoder, so the selection keeps items whole.
    out = unit_output_tokens(tokens, unit_item, md.item_llm)
    sample = md.item_sample[unit_item]
    owner = md.sample_rank[sample]
    n = units.size
    # Positions within the owner's list and within the sample: offsets of sorted runs.
    src_pos = np.arange(n) - _run_starts(owner)
    unit_in_sample = np.arange(n) - _run_starts(sample)
    return PhaseItems(phase, owner, src_pos, sample, tokens, out, unit_in_sample)


def check_encoders(metadata: GatheredMetadata, encoders: Sequence[str]) -> None:
    """Every item can be encoded: raise naming the first sample (canonical order) with items
    for an encoder not in ``encoders``.

    Raises:
        WorkloadError: from :func:`orchestration.workload.missing_encoder_error`.
    """
    md = metadata
    readable = np.array([ENCODER_OF_MODALITY[m] in encoders for m in MODALITIES])
    bad = np.flatnonzero(~readable[md.item_modality])
    if bad.size:
        i = int(bad[0])
        modality = MODALITIES[int(md.item_modality[i])]
        raise missing_encoder_error(md.sample_label(int(md.item_sample[i])), modality)


def sample_encoder_tokens(metadata: GatheredMetadata, encoder: str) -> np.ndarray:
    """(S,) encoder tokens each sample gives ``encoder`` (its feature rows)."""
    units = phase_items(metadata, encoder)
    weights = np.bincount(units.sample, weights=units.tokens, minlength=metadata.num_samples)
    return weights.astype(np.int64)


def _run_starts(keys: np.ndarray) -> np.ndarray:
    """For a non-decreasing array, the index where each element's run of equal keys starts."""
    n = keys.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return np.repeat(first, np.diff(np.r_[first, n]))

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Balance plans of one iteration: who computes what, and how data moves there and back.

Pure numpy; no collectives. Every rank computes the same plan from the same all-gathered
metadata, and compares digests. This is the API the dispatcher and the trainer call.

Dataflow and API
----------------
1. Each DP rank encodes its samples' metadata (a few ints per sample, item and unit) with
   :func:`encode_rank_metadata`; the dispatcher all-gathers these int64 arrays (sizes first,
   or padded) and rebuilds the global table with :meth:`GatheredMetadata.from_flat`. Tests and
   tools use :meth:`GatheredMetadata.from_rank_samples`, the same thing without collectives.
2. **PP = 1, per-phase mode**: :func:`plan_iteration` returns an :class:`IterationPlan` with
   one :class:`PhasePlan` per phase (each encoder, then the LLM) and, per encoder, the
   :class:`Exchange` that routes encoder outputs to the LLM-phase owner of their sample.
3. **PP > 1, whole-sample mode**: :func:`plan_whole_samples` moves whole samples between DP
   groups (:class:`SamplePlan`), balancing the predicted cost of each group's pipeline.
4. Either way, each rank then forms its microbatches with :func:`form_microbatches`.

Items and local lists
---------------------
The items of a phase come in a *canonical order*: rank, sample position on the rank, then
(encoders) modality in ``MODALITIES`` order, item, unit. An encoder phase's items are all the
encoder units of its modalities (an image, a tile, a 30 s window); the LLM phase's items are
the samples. Each rank holds a *local list* of a phase's items before the exchange (its own, in
canonical order: ``src_pos``) and another after (those assigned to it, ordered by (source
rank, source position): ``dst_pos``). Units of one sample are therefore consecutive in both.

Exchanges
---------
An :class:`Exchange` moves ``n`` items between ranks: item ``i`` goes from position
``src_pos[i]`` of rank ``src[i]``'s list to position ``dst_pos[i]`` of rank ``dst[i]``'s list.
For one ``all_to_all`` on rank ``r``:

* pack the send buffer with the local items ``send_index(r)`` (grouped by destination rank,
  then by destination position) and split it by ``send_counts(r)`` items, or
  ``send_rows(r)`` rows when items are variable-length (``rows`` per item: tokens);
* receive with ``recv_counts(r)`` / ``recv_rows(r)``; received item ``k`` belongs at local
  position ``recv_index(r)[k]`` (identity for phase dispatches, whose destination order is
  the arrival order);
* the reverse trip (outputs back, or gradients in backward) is ``exchange.transpose()``.

Every count comes from the plan, so no size handshake is needed. :func:`row_index` expands an
item order into row indices for variable-length payloads.

Usage
-----
PP = 1, per-phase mode (``dp`` = this rank's DP group, ``me`` = its rank in it)::

    flat = all_gather_arrays(encode_rank_metadata(local_samples))   # list, one per DP rank
    md = GatheredMetadata.from_flat(flat, sample_ids=all_ids)       # ids: for error messages
    plan = plan_iteration(md, CostModel.build(shape, calibration), algorithm="auto",
                          caps={"vision": 65536}, gpus_per_node=8)
    check_digest(plan.digest)                   # all-gather the digests, then check_digests()
    for phase in plan.phases:                   # "vision", "audio", then "llm"
        ex = phase.dispatch
        rows = phase.items.tokens[ex.src_items(me)]          # my local items' sizes
        send = payload[row_index(ex.send_index(me), rows)]    # pack, grouped by destination
        got = all_to_all(send, ex.send_rows(me), ex.recv_rows(me))   # or ex.rows_matrix()
        # got holds my destination list in order: items ex.dst_items(me), rows back to back
    route = plan.to_llm["vision"]               # encoder worker -> LLM worker (autograd a2a;
    ...                                         # backward uses route.transpose())
    mb = form_microbatches(llm.costs[mine], llm.items.tokens[mine], num_microbatches,
                           max_tokens=micro_batch_size * seq_length)

PP > 1, whole-sample mode (one entry per DP group; ``me`` = this group's DP rank)::

    plan = plan_whole_samples(md, cost_model, algorithm="auto")
    ex = plan.dispatch                          # samples: owner group -> new group
    mine = ex.dst_items(me)                     # global sample indices this group trains
    mb = form_microbatches(plan.costs[mine], plan.items.tokens[mine], num_microbatches,
                           max_tokens=seq_length * micro_batch_size)

Costs and the PP > 1 objective
------------------------------
Per-phase costs come from :class:`orchestration.cost_model.CostModel`. A DP group's step with
pipeline parallelism takes roughly ``max over stages of the stage's work + bubbles``. With
PipeWeaver every module is cut into chunks spread over all stages, so every stage gets about
``1/S`` of every phase and the bottleneck stage is ``total/S``: balancing each group's *sum of
all phases* (the default) balances the groups' steady-state time. With a static layout (e.g.
upstream Megatron: encoders on the first stage, LLM layers split evenly) pass
``stage_shares`` and the objective becomes the group's bottleneck stage,
``max_s sum_p share[p][s] * cost_p``. Bubbles scale with the microbatch cost, which
:func:`form_microbatches` balances within the group afterwards.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from orchestration.balance import (
    DEFAULT_BUDGET,
    TIE_SLACK,
    BalanceResult,
    InfeasibleCapError,
    WorkBudget,
    balance,
    balance_padded,
    max_over_mean,
    vector_lpt,
)
from orchestration.cost_model import CostModel, PhaseCostModel, unit_output_tokens
from orchestration.locality import map_bins_to_ranks
from orchestration.workload import ENCODER_OF_MODALITY, MODALITIES, PHASES, SampleMeta

METADATA_VERSION = 1
"""First int of every encoded rank's metadata; bump when the layout changes."""

PLAN_VERSION = b"orchweave-plan-v1"
"""Prefix of every plan digest."""

_ENCODER_CODE = {"vision": 0, "audio": 1}
_MODALITY_ENCODER = np.array([_ENCODER_CODE[ENCODER_OF_MODALITY[m]] for m in MODALITIES])


class PlanError(ValueError):
    """Bad input to the planner: malformed metadata, or plans that differ across ranks."""


# --------------------------------------------------------------------------------------------
# Gathered metadata


def encode_rank_metadata(samples: Sequence[tuple[int, SampleMeta]]) -> np.ndarray:
    """One rank's metadata as a flat int64 array, the payload of the metadata all-gather.

    Layout: ``[VERSION, S, I, U, stream[S], text[S], item_sample[I], item_modality[I],
    item_llm[I], item_units[I], unit_tokens[U]]`` with ``S`` samples, ``I`` items, ``U``
    units; ``item_sample`` is the sample's position on this rank.

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
    return np.array(head + stream + text + i_s + i_m + i_l + i_u + u_t, dtype=np.int64)


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
        bad = np.flatnonzero(
            (np.minimum(np.minimum(S, I), U) < 0) | (lens != 4 + 2 * S + 4 * I + U)
        )
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
        return h.hexdigest()


def _as_metadata(metadata) -> GatheredMetadata:
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


def _run_starts(keys: np.ndarray) -> np.ndarray:
    """For a non-decreasing array, the index where each element's run of equal keys starts."""
    n = keys.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return np.repeat(first, np.diff(np.r_[first, n]))


# --------------------------------------------------------------------------------------------
# Exchanges


@dataclass(frozen=True, slots=True)
class Exchange:
    """A movement of items between ranks: one ``all_to_all`` (see the module doc).

    Arrays are read-only. Per-rank queries cost O(n) and are meant to be called for one's own
    rank.
    """

    num_ranks: int
    """Ranks taking part (every rank joins, even with nothing to send or receive)."""

    src: np.ndarray
    """(n,) rank each item leaves."""

    src_pos: np.ndarray
    """(n,) its position in the source rank's local list."""

    dst: np.ndarray
    """(n,) rank each item goes to."""

    dst_pos: np.ndarray
    """(n,) its position in the destination rank's local list."""

    rows: np.ndarray
    """(n,) rows (tokens) of each item's payload, for variable-length splits."""

    def __post_init__(self) -> None:
        for name in ("src", "src_pos", "dst", "dst_pos", "rows"):
            getattr(self, name).flags.writeable = False

    @property
    def size(self) -> int:
        """Number of items."""
        return int(self.src.size)

    def send_index(self, rank: int) -> np.ndarray:
        """Source-list positions of the items ``rank`` sends, in send-buffer order."""
        sel = np.flatnonzero(self.src == rank)
        order = np.lexsort((self.dst_pos[sel], self.dst[sel]))
        return self.src_pos[sel[order]]

    def send_counts(self, rank: int) -> np.ndarray:
        """(R,) items ``rank`` sends to each rank."""
        return np.bincount(self.dst[self.src == rank], minlength=self.num_ranks)

    def send_rows(self, rank: int) -> np.ndarray:
        """(R,) rows ``rank`` sends to each rank."""
        sel = self.src == rank
        return np.bincount(self.dst[sel], weights=self.rows[sel], minlength=self.num_ranks).astype(
            np.int64
        )

    def recv_counts(self, rank: int) -> np.ndarray:
        """(R,) items ``rank`` receives from each rank."""
        return np.bincount(self.src[self.dst == rank], minlength=self.num_ranks)

    def recv_rows(self, rank: int) -> np.ndarray:
        """(R,) rows ``rank`` receives from each rank."""
        sel = self.dst == rank
        return np.bincount(self.src[sel], weights=self.rows[sel], minlength=self.num_ranks).astype(
            np.int64
        )

    def recv_index(self, rank: int) -> np.ndarray:
        """Destination-list position of each received item, in receive-buffer order."""
        sel = np.flatnonzero(self.dst == rank)
        order = np.lexsort((self.dst_pos[sel], self.src[sel]))
        return self.dst_pos[sel[order]]

    def num_src_items(self, rank: int) -> int:
        """Length of ``rank``'s source list."""
        return int(np.count_nonzero(self.src == rank))

    def num_dst_items(self, rank: int) -> int:
        """Length of ``rank``'s destination list."""
        return int(np.count_nonzero(self.dst == rank))

    def dst_items(self, rank: int) -> np.ndarray:
        """Item indices (into this exchange's arrays) of ``rank``'s destination list, in order."""
        sel = np.flatnonzero(self.dst == rank)
        return sel[np.argsort(self.dst_pos[sel], kind="stable")]

    def src_items(self, rank: int) -> np.ndarray:
        """Item indices of ``rank``'s source list, in order."""
        sel = np.flatnonzero(self.src == rank)
        return sel[np.argsort(self.src_pos[sel], kind="stable")]

    def transpose(self) -> "Exchange":
        """The reverse movement: outputs back to the sources, or gradients in backward."""
        return Exchange(self.num_ranks, self.dst, self.dst_pos, self.src, self.src_pos, self.rows)

    def with_rows(self, rows: np.ndarray) -> "Exchange":
        """The same movement with other payload sizes (e.g. LLM rows instead of tokens)."""
        return Exchange(
            self.num_ranks,
            self.src,
            self.src_pos,
            self.dst,
            self.dst_pos,
            np.asarray(rows, dtype=np.int64),
        )

    def counts_matrix(self) -> np.ndarray:
        """(R, R) items from each rank (row) to each rank (column); O(R^2) memory."""
        r = self.num_ranks
        return np.bincount(self.src * r + self.dst, minlength=r * r).reshape(r, r)

    def rows_matrix(self) -> np.ndarray:
        """(R, R) rows from each rank to each rank; O(R^2) memory."""
        r = self.num_ranks
        m = np.bincount(self.src * r + self.dst, weights=self.rows, minlength=r * r)
        return m.astype(np.int64).reshape(r, r)

    @property
    def moved_items(self) -> int:
        """Items that change rank."""
        return int(np.count_nonzero(self.src != self.dst))

    @property
    def moved_rows(self) -> int:
        """Rows that change rank."""
        return int(self.rows[self.src != self.dst].sum())


def row_index(order: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Row indices of the items ``order`` of a local list whose items have ``rows`` rows each.

    ``payload[row_index(ex.send_index(r), rows_of_local_items)]`` packs a send buffer of
    variable-length items stored back to back.
    """
    rows = np.asarray(rows, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    starts = np.r_[0, np.cumsum(rows)[:-1]]
    counts = rows[order]
    base = np.repeat(starts[order] - np.r_[0, np.cumsum(counts)[:-1]], counts)
    return base + np.arange(int(counts.sum()))


def _dst_positions(dst: np.ndarray, num_ranks: int) -> np.ndarray:
    """Position of each item in its destination's list, in index order."""
    # 16-bit keys get numpy's radix sort: O(n) instead of timsort.
    small = dst.astype(np.int16) if num_ranks <= np.iinfo(np.int16).max else dst
    order = np.argsort(small, kind="stable")
    start = _exclusive_cumsum(np.bincount(dst, minlength=num_ranks))
    pos = np.empty(dst.size, dtype=np.int64)
    pos[order] = np.arange(dst.size) - start[dst[order]]
    return pos


def _exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


# --------------------------------------------------------------------------------------------
# Per-phase plans (PP = 1)


@dataclass(frozen=True, slots=True)
class PhasePlan:
    """The balanced assignment of one phase's items, and the exchange that carries it out."""

    phase: str
    """"vision", "audio" or "llm"."""

    items: PhaseItems
    """The items, in canonical order."""

    costs: np.ndarray
    """(n,) predicted cost of each item."""

    dispatch: Exchange
    """Owner -> worker: inputs (pixels, features, token ids) go to the rank computing them;
    its transpose brings outputs or gradients back."""

    loads_before: np.ndarray
    """(R,) predicted phase cost of each rank without balancing."""

    loads_after: np.ndarray
    """(R,) predicted phase cost of each rank with this plan."""

    algorithm: str
    """The algorithm whose assignment was kept ("ordinary" when nothing beat it)."""

    lower_bound: float
    """Combinatorial lower bound on the optimal max load (``orchestration.bounds``)."""

    unit: str
    """Unit of costs and loads: "flops" or "seconds"."""

    @property
    def imbalance_before(self) -> float:
        """Max over mean load without balancing."""
        return max_over_mean(self.loads_before)

    @property
    def imbalance_after(self) -> float:
        """Max over mean load with the plan."""
        return max_over_mean(self.loads_after)

    @property
    def moved_fraction(self) -> float:
        """Fraction of items that change rank."""
        return self.dispatch.moved_items / self.items.size if self.items.size else 0.0


@dataclass(frozen=True, slots=True)
class IterationPlan:
    """Every phase's plan for one iteration (PP = 1), and the digest ranks compare."""

    num_ranks: int
    """DP ranks."""

    phases: tuple[PhasePlan, ...]
    """Per phase, in iteration order: encoders, then the LLM."""

    to_llm: Mapping[str, Exchange]
    """Per encoder phase: encoder worker -> LLM-phase worker of the unit's sample. Source list
    = the encoder worker's destination list; destination list = for each sample of the LLM
    worker (in its order), the sample's units of this encoder in order. ``rows`` = encoder
    tokens (hidden states before pooling); ``.with_rows(phase.items.out_tokens)`` gives the
    projected rows' sizes when pooling runs per unit on the encoder worker."""

    metadata_digest: str
    """:meth:`GatheredMetadata.digest` of the input."""

    digest: str
    """sha256 of the metadata digest and every phase's destinations: equal on every rank."""

    def phase(self, name: str) -> PhasePlan:
        """The plan of one phase."""
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(f"no plan for phase {name!r}; have {[p.phase for p in self.phases]}")

    def check_digest(self, other_digests: Sequence[str]) -> None:
        """Raise :class:`PlanError` when another rank's digest differs from ours."""
        check_digests([self.digest, *other_digests])


def check_digests(digests: Sequence[str]) -> None:
    """Raise :class:`PlanError` naming the ranks whose plan digest differs from rank 0's."""
    bad = [r for r, d in enumerate(digests) if d != digests[0]]
    if bad:
        raise PlanError(
            f"plan digests differ across ranks: rank 0 has {digests[0][:16]}..., ranks {bad} "
            f"have {sorted({digests[r][:16] for r in bad})}: the gathered metadata or the "
            f"planner's inputs differ between ranks"
        )


def plan_iteration(
    metadata: GatheredMetadata | Sequence[Sequence[tuple[int, SampleMeta]]],
    cost_model: CostModel,
    *,
    algorithm: str = "auto",
    phases: Iterable[str] | None = None,
    caps: Mapping[str, int] | None = None,
    gpus_per_node: int = 8,
    bytes_per_token: Mapping[str, float] | None = None,
    budget: WorkBudget = DEFAULT_BUDGET,
    slack: float = TIE_SLACK,
) -> IterationPlan:
    """Plan every phase of one iteration in per-phase mode (PP = 1).

    Args:
        metadata: the gathered metadata, or every rank's (stream index, metadata) pairs.
        cost_model: per-phase costs; its phases are the phases planned.
        algorithm: "none" (everything stays with its owner) or a name of
            ``orchestration.balance.ALGORITHMS``.
        phases: phases to balance (default all); the others keep the ordinary assignment.
        caps: per phase, the largest summed tokens per rank (memory).
        gpus_per_node: ranks per node, for the node-aware locality mapping.
        bytes_per_token: per phase, payload bytes per token moved (pixels, features, ids), to
            weigh locality; default 1 (tokens).
        budget: deterministic work limits of the algorithms.
        slack: relative max-load slack traded for fewer moved items (see
            ``orchestration.balance.balance``).

    Raises:
        InfeasibleCapError: a cap cannot be met (names the sample).
        PlanError: the data has items of a phase the model lacks.
    """
    md = _as_metadata(metadata)
    R = md.num_ranks
    chosen = set(cost_model.phase_order if phases is None else phases)
    unknown = chosen - set(cost_model.phase_order)
    if unknown:
        raise PlanError(
            f"cannot balance phases {sorted(unknown)}: the model has {list(cost_model.phase_order)}"
        )
    plans = []
    for phase in PHASES:
        items = phase_items(md, phase)
        if phase not in cost_model:
            if items.size:
                raise PlanError(
                    f"the data has {items.size} {phase} units but the model has no {phase} encoder"
                )
            continue
        alg = algorithm if phase in chosen else "none"
        plans.append(
            _plan_phase(
                md,
                items,
                cost_model[phase],
                alg,
                (caps or {}).get(phase),
                gpus_per_node,
                (bytes_per_token or {}).get(phase, 1.0),
                budget,
                slack,
            )
        )
    llm = next((p for p in plans if p.phase == "llm"), None)
    if llm is None:
        raise PlanError(
            "the cost model has no 'llm' phase: encoder outputs would have nowhere to go"
        )
    to_llm = {p.phase: _route_to_llm(p, llm, R) for p in plans if p.phase != "llm"}
    mdig = md.digest()
    h = hashlib.sha256(PLAN_VERSION)
    h.update(mdig.encode())
    for p in plans:
        _hash_exchange(h, p.phase, p.dispatch)
    return IterationPlan(R, tuple(plans), to_llm, mdig, h.hexdigest())


def _hash_exchange(h, name: str, ex: Exchange) -> None:
    h.update(name.encode() + b"\0")
    h.update(np.int64(ex.size).tobytes())
    h.update(np.ascontiguousarray(ex.dst, dtype="<i4").tobytes())


def _plan_phase(
    md: GatheredMetadata,
    items: PhaseItems,
    model: PhaseCostModel,
    algorithm: str,
    cap: int | None,
    gpus_per_node: int,
    bytes_per_token: float,
    budget: WorkBudget,
    slack: float,
) -> PhasePlan:
    R = md.num_ranks
    costs = model.item_costs(items.tokens, items.out_tokens)
    owner = items.owner
    labels = _labeler(md, items)
    if model.padded:
        dst, before, after, alg = _plan_padded(
            items, model, R, algorithm, cap, gpus_per_node, bytes_per_token, labels
        )
        lb = float(after.max()) if after.size and alg != "none" else 0.0
    else:
        alg_name = "ordinary" if algorithm == "none" else algorithm
        result: BalanceResult = balance(
            costs,
            R,
            algorithm=alg_name,
            sizes=items.tokens if cap is not None else None,
            cap=cap,
            owners=owner,
            item_bytes=items.tokens * float(bytes_per_token),
            gpus_per_node=gpus_per_node,
            labels=labels,
            budget=budget,
            slack=slack,
        )
        dst = result.bins
        before = result.ordinary_loads
        after = result.loads
        alg = result.algorithm
        lb = result.lower_bound
    dispatch = Exchange(R, owner, items.src_pos, dst, _dst_positions(dst, R), items.tokens)
    return PhasePlan(items.phase, items, costs, dispatch, before, after, alg, lb, model.unit)


def _labeler(md: GatheredMetadata, items: PhaseItems):
    if items.phase == "llm":
        return lambda i: md.sample_label(int(items.sample[i]))
    return lambda i: (
        f"{items.phase} unit {int(items.unit_in_sample[i])} of "
        f"{md.sample_label(int(items.sample[i]))}"
    )


def _plan_padded(items, model, R, algorithm, cap, gpus_per_node, bytes_per_token, labels):
    """Padded phase: exact contiguous-runs algorithm, then locality; keep the ordinary if better."""
    lengths = items.tokens if model.pad_to is None else np.full(items.size, model.pad_to)
    f = lambda L: model.linear * L + model.quadratic * L * L + model.const  # noqa: E731
    before = _padded_loads(items.owner, lengths, R, f) + _proj_loads(items, model, items.owner, R)
    if algorithm == "none" or items.size == 0:
        return items.owner, before, before, "ordinary"
    res = balance_padded(lengths, R, f, cap=cap, labels=labels)
    mapping = map_bins_to_ranks(
        res.bins, items.owner, items.tokens * float(bytes_per_token), R, gpus_per_node
    )
    dst = mapping.bin_to_rank[res.bins]
    after = _padded_loads(dst, lengths, R, f) + _proj_loads(items, model, dst, R)
    ordinary_ok = cap is None or _padded_sizes(items.owner, lengths, R).max() <= cap
    if ordinary_ok and before.max() <= after.max():
        return items.owner, before, before, "ordinary"
    return dst, before, after, "padded-exact"


def _padded_loads(ranks, lengths, R, f) -> np.ndarray:
    counts = np.bincount(ranks, minlength=R)
    longest = np.zeros(R)
    np.maximum.at(longest, ranks, lengths.astype(np.float64))
    return counts * np.where(counts > 0, f(longest), 0.0)


def _padded_sizes(ranks, lengths, R) -> np.ndarray:
    counts = np.bincount(ranks, minlength=R)
    longest = np.zeros(R, dtype=np.int64)
    np.maximum.at(longest, ranks, lengths.astype(np.int64))
    return counts * longest


def _proj_loads(items, model, ranks, R) -> np.ndarray:
    if not model.per_output_token:
        return np.zeros(R)
    return model.per_output_token * np.bincount(ranks, weights=items.out_tokens, minlength=R)


def _route_to_llm(enc: PhasePlan, llm: PhasePlan, R: int) -> Exchange:
    """Encoder worker -> LLM worker of each unit's sample, in the LLM worker's sample order.

    No sort: the LLM plan already orders every worker's samples, and a sample's units are
    consecutive in canonical order, so each unit's place follows from counts.
    """
    s = enc.items.sample
    S = llm.items.size
    dst = llm.dispatch.dst[s]
    # Every sample's rank in the destination-major order of all LLM workers' lists...
    grank = _exclusive_cumsum(np.bincount(llm.dispatch.dst, minlength=R))[llm.dispatch.dst]
    grank += llm.dispatch.dst_pos
    # ...gives where its run of units starts in the same order over all units...
    per_sample = np.bincount(s, minlength=S)
    by_rank = np.empty(S, dtype=np.int64)
    by_rank[grank] = per_sample
    unit_start = _exclusive_cumsum(by_rank)[grank]
    # ...and each unit's position in its worker's list.
    pos = unit_start[s] + enc.items.unit_in_sample
    dst_pos = pos - _exclusive_cumsum(np.bincount(dst, minlength=R))[dst]
    return Exchange(R, enc.dispatch.dst, enc.dispatch.dst_pos, dst, dst_pos, enc.items.tokens)


# --------------------------------------------------------------------------------------------
# Whole-sample plans (PP > 1)


@dataclass(frozen=True, slots=True)
class SamplePlan:
    """Whole samples re-assigned across DP groups (PP > 1)."""

    num_groups: int
    """DP groups (each a whole pipeline)."""

    items: PhaseItems
    """The samples, as the LLM phase's items."""

    costs: np.ndarray
    """(S,) predicted cost of each sample: the sum of its phases' costs."""

    phase_costs: Mapping[str, np.ndarray]
    """Per phase, (S,) the sample's cost in that phase."""

    dispatch: Exchange
    """Owner group -> new group, for every sample (its whole payload moves together)."""

    loads_before: np.ndarray
    """(G,) predicted cost of each group's batch without balancing (the objective's value)."""

    loads_after: np.ndarray
    """(G,) the same with this plan."""

    algorithm: str
    """The algorithm whose assignment was kept."""

    metadata_digest: str
    """:meth:`GatheredMetadata.digest` of the input."""

    digest: str
    """sha256 of the metadata digest and the destinations: equal on every rank."""

    @property
    def imbalance_before(self) -> float:
        """Max over mean group load without balancing."""
        return max_over_mean(self.loads_before)

    @property
    def imbalance_after(self) -> float:
        """Max over mean group load with the plan."""
        return max_over_mean(self.loads_after)

    def phase_loads(self, phase: str, after: bool = True) -> np.ndarray:
        """(G,) the summed cost of one phase per group, with the plan or without."""
        ranks = self.dispatch.dst if after else self.dispatch.src
        return np.bincount(ranks, weights=self.phase_costs[phase], minlength=self.num_groups)


def sample_phase_costs(metadata: GatheredMetadata, cost_model: CostModel) -> dict[str, np.ndarray]:
    """Per phase of ``cost_model``, (S,) each sample's cost in that phase (packed)."""
    md = _as_metadata(metadata)
    out = {}
    for phase in cost_model.phase_order:
        items = phase_items(md, phase)
        costs = cost_model[phase].item_costs(items.tokens, items.out_tokens)
        out[phase] = np.bincount(items.sample, weights=costs, minlength=md.num_samples)
    return out


def plan_whole_samples(
    metadata: GatheredMetadata | Sequence[Sequence[tuple[int, SampleMeta]]],
    cost_model: CostModel,
    *,
    algorithm: str = "auto",
    stage_shares: Mapping[str, Sequence[float]] | None = None,
    cap: int | None = None,
    groups_per_node: int = 1,
    bytes_per_token: float = 1.0,
    budget: WorkBudget = DEFAULT_BUDGET,
    slack: float = TIE_SLACK,
) -> SamplePlan:
    """Re-assign whole samples across DP groups, balancing each group's predicted step.

    Args:
        metadata: the gathered metadata of every DP group (one entry per DP rank).
        cost_model: per-phase costs, in one unit (they are added).
        algorithm: "none" or a name of ``orchestration.balance.ALGORITHMS``; with
            ``stage_shares`` only "none" and vector LPT ("lpt"/"auto") apply.
        stage_shares: per phase, the fraction of its cost on each pipeline stage (static
            layouts); None when every stage gets an equal share of every phase (PipeWeaver's
            chunked layout), which makes the objective the group's summed cost.
        cap: largest summed LLM tokens of a group's batch.
        groups_per_node: DP groups per node (usually 1 or fewer with PP x TP >= 8: pass 1).
        bytes_per_token: payload bytes per LLM token, to weigh locality.
        budget: deterministic work limits.
        slack: relative max-load slack traded for fewer moved samples.
    """
    md = _as_metadata(metadata)
    G = md.num_ranks
    if cost_model.unit == "mixed":
        raise PlanError("whole-sample mode adds the phases' costs: calibrate all phases or none")
    items = phase_items(md, "llm")
    per_phase = sample_phase_costs(md, cost_model)
    total = np.sum([per_phase[p] for p in per_phase], axis=0) if per_phase else np.zeros(items.size)
    labels = _labeler(md, items)
    if stage_shares is None:
        res = balance(
            total,
            G,
            algorithm="ordinary" if algorithm == "none" else algorithm,
            sizes=items.tokens if cap is not None else None,
            cap=cap,
            owners=items.owner,
            item_bytes=items.tokens * float(bytes_per_token),
            gpus_per_node=max(1, groups_per_node),
            labels=labels,
            budget=budget,
            slack=slack,
        )
        dst, before, after, alg = res.bins, res.ordinary_loads, res.loads, res.algorithm
    else:
        vec = _stage_vectors(per_phase, stage_shares)
        before = _bottleneck(items.owner, vec, G)
        if algorithm == "none":
            dst, after, alg = items.owner, before, "ordinary"
        else:
            dst = vector_lpt(vec, G, sizes=items.tokens, cap=cap, labels=labels)
            mapping = map_bins_to_ranks(
                dst, items.owner, items.tokens * float(bytes_per_token), G, max(1, groups_per_node)
            )
            dst = mapping.bin_to_rank[dst]
            after = _bottleneck(dst, vec, G)
            alg = "vector-lpt"
            if after.max() >= before.max() and (
                cap is None
                or np.bincount(items.owner, weights=items.tokens, minlength=G).max() <= cap
            ):
                dst, after, alg = items.owner, before, "ordinary"
    dispatch = Exchange(G, items.owner, items.src_pos, dst, _dst_positions(dst, G), items.tokens)
    mdig = md.digest()
    h = hashlib.sha256(PLAN_VERSION + b"-samples")
    h.update(mdig.encode())
    _hash_exchange(h, "samples", dispatch)
    return SamplePlan(G, items, total, per_phase, dispatch, before, after, alg, mdig, h.hexdigest())


def _stage_vectors(
    per_phase: Mapping[str, np.ndarray], shares: Mapping[str, Sequence[float]]
) -> np.ndarray:
    stages = {len(v) for v in shares.values()}
    if len(stages) != 1:
        raise PlanError(
            f"stage_shares must give every phase the same number of stages, got {dict(shares)}"
        )
    S = stages.pop()
    n = next(iter(per_phase.values())).size
    vec = np.zeros((n, S))
    for phase, costs in per_phase.items():
        if phase not in shares:
            raise PlanError(f"stage_shares lacks phase {phase!r}")
        vec += costs[:, None] * np.asarray(shares[phase], dtype=np.float64)[None, :]
    return vec


def _bottleneck(ranks: np.ndarray, vec: np.ndarray, G: int) -> np.ndarray:
    loads = np.zeros((G, vec.shape[1]))
    np.add.at(loads, ranks, vec)
    return loads.max(axis=1)


# --------------------------------------------------------------------------------------------
# Microbatches


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

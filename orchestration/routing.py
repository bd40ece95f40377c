# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Routes: how a plan moves items between ranks, as one ``all_to_all`` each way.

Pure numpy. A :class:`Route` moves ``n`` items between ranks: item ``i`` goes from position
``src_pos[i]`` of rank ``src[i]``'s local list to position ``dst_pos[i]`` of rank ``dst[i]``'s
(local lists: :mod:`orchestration.metadata`). For one ``all_to_all`` on rank ``r``:

* pack the send buffer with the local items ``send_index(r)`` (grouped by destination rank,
  then by destination position) and split it by ``send_counts(r)`` items, or
  ``send_rows(r)`` rows when items are variable-length (``rows`` per item: tokens);
* receive with ``recv_counts(r)`` / ``recv_rows(r)``; received item ``k`` belongs at local
  position ``recv_index(r)[k]`` (identity for phase dispatches, whose destination order is
  the arrival order);
* the reverse trip (outputs back, or gradients in backward) is ``route.transpose()``.

Every count comes from the plan, so no size handshake is needed. :func:`row_index` expands an
item order into row indices for variable-length payloads; the dispatcher's
``Dispatcher.move`` does the packing and the exchange in one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Route:
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

    def arrival_order(self, rank: int) -> np.ndarray:
        """Item indices arriving at ``rank``, in receive-buffer order (source, then position)."""
        sel = np.flatnonzero(self.dst == rank)
        return sel[np.lexsort((self.dst_pos[sel], self.src[sel]))]

    def dst_items(self, rank: int) -> np.ndarray:
        """Item indices (into this exchange's arrays) of ``rank``'s destination list, in order."""
        sel = np.flatnonzero(self.dst == rank)
        return sel[np.argsort(self.dst_pos[sel], kind="stable")]

    def src_items(self, rank: int) -> np.ndarray:
        """Item indices of ``rank``'s source list, in order."""
        sel = np.flatnonzero(self.src == rank)
        return sel[np.argsort(self.src_pos[sel], kind="stable")]

    def transpose(self) -> "Route":
        """The reverse movement: outputs back to the sources, or gradients in backward."""
        return Route(self.num_ranks, self.dst, self.dst_pos, self.src, self.src_pos, self.rows)

    def with_rows(self, rows: np.ndarray) -> "Route":
        """The same movement with other payload sizes (e.g. LLM rows instead of tokens)."""
        return Route(
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
    def moves_nothing(self) -> bool:
        """Whether every item stays on its rank. The all-to-all would then hand every rank its
        own packed send buffer back (arrival order is by source rank, then destination
        position, as the send buffer is), so a step may skip the collective; all ranks know it
        from the plan alike."""
        return not bool(np.any(self.src != self.dst))

    @property
    def moved_rows(self) -> int:
        """Rows that change rank."""
        return int(self.rows[self.src != self.dst].sum())


def row_index(order: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Row indices of the items ``order`` of a local list whose items have ``rows`` rows each.

    ``payload[row_index(route.send_index(r), rows_of_local_items)]`` packs a send buffer of
    variable-length items stored back to back.
    """
    rows = np.asarray(rows, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    starts = np.r_[0, np.cumsum(rows)[:-1]]
    counts = rows[order]
    base = np.repeat(starts[order] - np.r_[0, np.cumsum(counts)[:-1]], counts)
    return base + np.arange(int(counts.sum()))


def dst_positions(dst: np.ndarray, num_ranks: int) -> np.ndarray:
    """Position of each item in its destination's list, in index order (``dst`` per item)."""
    # 16-bit keys get numpy's radix sort: O(n) instead of timsort.
    small = dst.astype(np.int16) if num_ranks <= np.iinfo(np.int16).max else dst
    order = np.argsort(small, kind="stable")
    start = exclusive_cumsum(np.bincount(dst, minlength=num_ranks))
    pos = np.empty(dst.size, dtype=np.int64)
    pos[order] = np.arange(dst.size) - start[dst[order]]
    return pos


def exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]``: where each count's run starts."""
    out = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out

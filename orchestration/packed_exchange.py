# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Several payloads in one all-to-all: the byte layout of a packed exchange.

A balanced step moves every payload of one hop together (each encoder's inputs and the token
ids, or each encoder's outputs), since every collective costs a latency on every rank however
little it carries. :class:`PackedLayout` says where each part's rows go in the byte buffer that
crosses ranks and how they come out again, from the parts' ``[world, world]`` row counts alone,
so that no size handshake is needed:

- only the rows that change rank travel: a part's *home* block (``counts[me, me]`` rows) stays
  where it is and is never copied through the collective, so a step can use it before the
  exchange completes;
- on the wire, this rank's buffer holds, for each destination in turn, every part's block for
  it, part by part; the buffer received holds, for each source in turn, every part's block
  from it;
- unpacked, each part's rows come back in their own dtype and shape, ordered by source rank
  (:meth:`PackedLayout.unpack`, without the home block; :meth:`PackedLayout.assemble` puts it
  back at its place among the sources).

Pure tensor bookkeeping: the collective itself is the dispatcher's
(``orchestration.dispatcher.Dispatcher.start_exchange``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np
import torch

from orchestration.exchange_cost import busiest_rank_bytes


@dataclass(frozen=True)
class PackedLayout:
    """Where every part's rows travel in one packed all-to-all, seen from one rank."""

    rank: int
    """This rank (in the exchange's group)."""

    counts: tuple[np.ndarray, ...]
    """Per part, ``[world, world]`` rows from each source to each destination (home included),
    identical on every rank."""

    row_bytes: tuple[int, ...]
    """Per part, bytes of one row."""

    dtypes: tuple[torch.dtype, ...]
    """Per part, the rows' dtype."""

    shapes: tuple[tuple[int, ...], ...]
    """Per part, one row's shape."""

    @classmethod
    def of(cls, parts: Sequence[tuple[torch.Tensor, np.ndarray]], rank: int) -> "PackedLayout":
        """The layout of ``parts``: per part, this rank's rows ordered by destination and its
        row counts."""
        rows = [r for r, _ in parts]
        return cls(
            rank,
            tuple(np.asarray(c, dtype=np.int64) for _, c in parts),
            tuple(r.element_size() * int(np.prod(r.shape[1:], dtype=np.int64)) for r in rows),
            tuple(r.dtype for r in rows),
            tuple(tuple(r.shape[1:]) for r in rows),
        )

    @property
    def world(self) -> int:
        return self.counts[0].shape[0] if self.counts else 0

    @cached_property
    def byte_counts(self) -> np.ndarray:
        """``[world, world]`` bytes that cross ranks, from each source to each destination (a
        zero diagonal: home blocks stay). Computed once: an exchange asks for it several times,
        and at thousands of ranks it is a large matrix."""
        total = np.zeros((self.world, self.world), dtype=np.int64)
        for c, rb in zip(self.counts, self.row_bytes):
            total += c * rb
        np.fill_diagonal(total, 0)
        total.flags.writeable = False  # shared by every caller
        return total

    @property
    def moves_nothing(self) -> bool:
        """No part moves a row across ranks: every rank sees the same counts, so all skip the
        collective alike."""
        return not self.byte_counts.any()

    def busiest_bytes(self) -> float:
        """Bytes the busiest rank sends or receives, the larger (the same on every rank)."""
        return busiest_rank_bytes(self.byte_counts)

    def home_span(self, p: int) -> tuple[int, int]:
        """Rows of part ``p`` in this rank's send order before its home block, and its size."""
        c = self.counts[p]
        return int(c[self.rank, : self.rank].sum()), int(c[self.rank, self.rank])

    def home(self, p: int, rows: torch.Tensor) -> torch.Tensor:
        """The rows of part ``p`` (``rows``: this rank's, ordered by destination) that stay."""
        start, n = self.home_span(p)
        return rows[start : start + n]

    def pack(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        """This rank's send buffer (uint8): for each other destination in turn, every part's
        rows for it."""
        blocks = []
        as_bytes = [_as_bytes(r, rb) for r, rb in zip(rows, self.row_bytes)]
        starts = [0] * len(rows)
        for d in range(self.world):
            for p, (b, c) in enumerate(zip(as_bytes, self.counts)):
                n = int(c[self.rank, d])
                if d != self.rank and n:
                    blocks.append(b[starts[p] : starts[p] + n].reshape(-1))
                starts[p] += n
        if not blocks:
            device = rows[0].device if rows else torch.device("cpu")
            return torch.empty(0, dtype=torch.uint8, device=device)
        return torch.cat(blocks)

    def unpack(self, recv: torch.Tensor) -> list[torch.Tensor]:
        """Per part, the rows that arrived from the other ranks, ordered by source rank."""
        pieces: list[list[torch.Tensor]] = [[] for _ in self.counts]
        offset = 0
        for s in range(self.world):
            if s == self.rank:
                continue
            for p, (c, rb) in enumerate(zip(self.counts, self.row_bytes)):
                n = int(c[s, self.rank]) * rb
                if n:
                    pieces[p].append(recv[offset : offset + n])
                offset += n
        out = []
        for blocks, dtype, shape in zip(pieces, self.dtypes, self.shapes):
            if blocks:
                out.append(torch.cat(blocks).view(dtype).reshape(-1, *shape))
            else:
                out.append(torch.empty((0, *shape), dtype=dtype, device=recv.device))
        return out

    def home_offset(self, p: int) -> int:
        """Where part ``p``'s home block sits among its arrivals (rows from lower ranks first)."""
        return int(self.counts[p][: self.rank, self.rank].sum())

    def assemble(self, p: int, remote: torch.Tensor, home: torch.Tensor) -> torch.Tensor:
        """Part ``p``'s arrivals in source order: ``remote`` (:meth:`unpack`'s) with ``home``
        at its place (differentiable: gradients reach both)."""
        return with_home(remote, self.home_offset(p), home)


def with_home(others: torch.Tensor, at: int, home: torch.Tensor) -> torch.Tensor:
    """``others`` with ``home`` inserted before row ``at`` (differentiable)."""
    if not others.shape[0]:
        return home
    return torch.cat([others[:at], home, others[at:]])


def _as_bytes(rows: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """``rows`` as ``[n, row_bytes]`` uint8 (a view where the layout allows, else a copy)."""
    flat = rows.detach().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # a one-element column slice keeps its stride
        flat = torch.empty_like(flat, memory_format=torch.contiguous_format).copy_(flat)
    if not flat.numel():
        return torch.empty(rows.shape[0], row_bytes, dtype=torch.uint8, device=rows.device)
    return flat.view(torch.uint8).view(rows.shape[0], row_bytes)

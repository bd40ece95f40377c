# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The packed exchange's byte layout, with the all-to-all played out in one process."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestration.packed_exchange import PackedLayout, with_home


def _rows(rank: int, counts: np.ndarray, part: int) -> torch.Tensor:
    """What ``rank`` sends of ``part``: its blocks in destination order, each row naming its
    source, destination, index and part; parts differ in dtype and width."""
    out = [[rank, d, i, part] for d in range(counts.shape[0]) for i in range(counts[rank, d])]
    t = torch.tensor(out, dtype=torch.float64).view(-1, 4)
    return [t, t[:, :2].to(torch.int32), t.to(torch.float16)[:, 3]][part % 3]


def _all_to_all(sends: list[torch.Tensor], byte_counts: np.ndarray) -> list[torch.Tensor]:
    """The collective itself: every rank's buffer split by the byte counts, concatenated by
    source on each destination."""
    world = len(sends)
    pieces = [torch.split(s, [int(n) for n in byte_counts[r]]) for r, s in enumerate(sends)]
    return [torch.cat([pieces[s][d] for s in range(world)]) for d in range(world)]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.randoms(use_true_random=False))
def test_every_part_arrives_in_source_order_and_home_rows_never_travel(world, n_parts, rnd):
    counts = [
        np.array([[rnd.randint(0, 3) for _ in range(world)] for _ in range(world)])
        for _ in range(n_parts)
    ]
    if rnd.random() < 0.2:  # everything stays home
        counts = [np.diag(np.diag(c)) for c in counts]
    layouts, sends = [], []
    for r in range(world):
        parts = [(_rows(r, c, p), c) for p, c in enumerate(counts)]
        layout = PackedLayout.of(parts, r)
        layouts.append(layout)
        sends.append(layout.pack([rows for rows, _ in parts]))
    byte_counts = layouts[0].byte_counts
    assert all(np.array_equal(lay.byte_counts, byte_counts) for lay in layouts)
    assert not byte_counts.diagonal().any()
    assert layouts[0].moves_nothing == (not byte_counts.any())
    recvs = _all_to_all(sends, byte_counts)
    for r, (layout, recv) in enumerate(zip(layouts, recvs)):
        assert recv.numel() == byte_counts[:, r].sum()
        for p, (c, got) in enumerate(zip(counts, layout.unpack(recv))):
            # What arrives: every other rank's block for r, by source.
            want = torch.cat([_rows(s, c, p)[int(c[s, :r].sum()) :][: c[s, r]]
                              for s in range(world)])  # fmt: skip
            home = layout.home(p, _rows(r, c, p))
            assert home.shape[0] == c[r, r]
            assert torch.equal(layout.assemble(p, got, home), want), (r, p)
            assert got.shape[0] == c[:, r].sum() - c[r, r]
            start, n = layout.home_span(p)
            assert (start, n) == (int(c[r, :r].sum()), int(c[r, r]))


def test_home_rows_go_back_at_their_offset_with_gradients():
    others = torch.arange(6.0).view(3, 2).requires_grad_(True)
    home = torch.full((2, 2), 9.0, requires_grad=True)
    out = with_home(others, 1, home)
    assert out[:, 0].tolist() == [0.0, 9.0, 9.0, 2.0, 4.0]
    out.sum().backward()
    assert others.grad.tolist() == [[1.0, 1.0]] * 3 and home.grad.tolist() == [[1.0, 1.0]] * 2
    assert with_home(others[:0], 0, home) is home  # nothing from others: the home rows as they are

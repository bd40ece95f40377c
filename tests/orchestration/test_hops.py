# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The hops of an exchange (orchestration.hops), against the routing rule applied block by
block, and the byte matrices SEMU costs against the blocks' sums."""

from __future__ import annotations

import numpy as np

from orchestration.hops import hop_matrices, inter_node_messages, plan_hops


def _route_one_block(s: int, d: int, g: int | None, world: int) -> list[int]:
    """The oracle: where block (s, d) is after each hop, by the module's rule, one block at a
    time."""
    if not g or g >= world or world % g:
        return [d]
    if s // g == d // g:
        return [d, d, d]  # already in its destination's node: straight there, then it stays
    proxy = (s // g) * g + (d // g) % g  # in the source node, the destination node's index
    across = (d // g) * g + (s // g) % g  # in the destination node, the source node's index
    return [proxy, across, d]


def _expected_hops(counts: np.ndarray, g: int | None) -> list:
    world = counts.shape[0]
    blocks = [(s, d) for s in range(world) for d in range(world) if counts[s, d] > 0]
    paths = {b: [b[0], *_route_one_block(*b, g, world)] for b in blocks}
    hops = []
    for h in range(len(next(iter(paths.values()))) - 1 if paths else 1):
        sends = [[[] for _ in range(world)] for _ in range(world)]
        for b in blocks:  # (src, dst) order: each message's wire order
            sends[paths[b][h]][paths[b][h + 1]].append(b)
        hops.append(tuple(tuple(tuple(x) for x in row) for row in sends))
    return hops


def test_hops_follow_the_routing_rule_block_by_block():
    rng = np.random.default_rng(0)
    for _ in range(200):
        world = int(rng.integers(1, 19))
        g = [None, 2, 3, 4, 8][int(rng.integers(0, 5))]
        counts = rng.integers(0, 4, size=(world, world)) * (rng.random((world, world)) < 0.6)
        got = [h.blocks for h in plan_hops(counts, g)]
        want = _expected_hops(counts, g)
        if counts.any():
            assert got == want, (world, g)
        assert len(got) == (3 if g and g < world and world % g == 0 else 1)


def test_hop_matrices_are_the_blocks_sums_in_wire_order():
    rng = np.random.default_rng(1)
    for _ in range(100):
        world = int(rng.integers(1, 17))
        g = [None, 2, 4][int(rng.integers(0, 3))]
        values = rng.random((world, world)) * 1e7 * (rng.random((world, world)) < 0.5)
        for hop, matrix in zip(plan_hops(values, g), hop_matrices(values, g), strict=True):
            want = [[float(sum(values[b] for b in msg)) for msg in row] for row in hop.blocks]
            assert matrix.tolist() == want  # exactly: the same additions in the same order


def test_node_wise_sends_one_message_per_node_pair():
    rng = np.random.default_rng(1)
    for nodes, g in [(2, 2), (3, 4), (4, 2)]:
        world = nodes * g
        counts = rng.integers(1, 5, size=(world, world))  # everyone talks to everyone
        assert inter_node_messages(counts, g, node_wise=False) == world * world - nodes * g * g
        assert inter_node_messages(counts, g, node_wise=True) == nodes * (nodes - 1)


def test_every_block_arrives_exactly_once():
    rng = np.random.default_rng(2)
    counts = rng.integers(0, 3, size=(6, 6))
    hops = plan_hops(counts, 2)
    last = hops[-1]
    arrived = sorted(b for src in range(6) for dst in range(6) for b in last.blocks[src][dst])
    assert arrived == sorted((s, d) for s in range(6) for d in range(6) if counts[s, d] > 0)
    for dst in range(6):
        assert all(b[1] == dst for src in range(6) for b in last.blocks[src][dst])

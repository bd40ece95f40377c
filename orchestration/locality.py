# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Map balanced bins to ranks so that as much data as possible is already where it must go.

A balancing algorithm forms ``d`` bins of items with no identity: any bijection of bins to the
``d`` ranks gives the same loads. This module picks the bijection that keeps the most payload
in place, node first:

1. **Bins to nodes.** Node ``k`` holds ranks ``[k*g, min((k+1)*g, d))`` (``g`` =
   ``gpus_per_node``) and takes as many bins as it has ranks. The weight of (bin, node) is the
   payload of the bin's items whose owner lives on that node; the assignment maximises the
   total, i.e. minimises inter-node traffic, the slow links.
2. **Bins to ranks within each node.** The weight of (bin, rank) is the payload the rank
   already owns; maximised per node, i.e. minimises NVLink traffic after the IB traffic is
   fixed.

Each stage is an assignment problem. For ``d <= exact_max_ranks`` (default 16) it is solved
exactly with a small Hungarian algorithm (maximum weight perfect matching; a node with ``c``
ranks is ``c`` identical columns). For larger ``d`` a vectorised greedy solves it: every
unassigned bin proposes to its heaviest column that still has room, each column accepts its
heaviest proposals up to its remaining capacity, and this repeats (``GREEDY_ROUNDS`` times at
most); bins left over take the remaining room in index order. A round costs a few passes over
the non-zero (bin, column) pairs, at most ``n`` of them, and no sort of them.

Everything is deterministic: ties break by bin index, then column index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EXACT_MAX_RANKS = 16
"""Up to this many ranks both stages are solved exactly."""


@dataclass(frozen=True, slots=True)
class LocalityResult:
    """A bijection of bins to ranks and how much payload it keeps in place."""

    bin_to_rank: np.ndarray
    """(d,) the rank each bin is mapped to."""

    in_place: float
    """Payload whose bin is mapped to its owner rank (does not move)."""

    in_node: float
    """Payload whose bin is mapped to a rank on its owner's node (moves over NVLink at most);
    includes ``in_place``."""

    total: float
    """All payload."""

    exact: bool
    """Whether both stages were solved exactly."""


def group_ranks_per_node(group_ranks, gpus_per_node: int) -> int | None:
    """How many members of a process group share a node, as the balancer counts nodes: in
    group rank order, each node holding the same number of consecutive members.

    ``--gpus-per-node`` counts global ranks; with tensor or pipeline parallelism a node holds
    fewer data-parallel ranks (8 GPUs at TP=8 hold one), so the node-aware placement and the
    node-wise exchange need the group's own count.

    Args:
        group_ranks: the group's members' global ranks, in group rank order.
        gpus_per_node: global ranks per node (node ``n`` holds ``[n*g, (n+1)*g)``).

    Returns:
        Members per node, or None when the group's nodes are not consecutive equal runs of its
        members (then no node grouping of the group is exact).
    """
    nodes = [int(r) // int(gpus_per_node) for r in group_ranks]
    runs: list[list[int]] = []
    for node in nodes:
        if runs and runs[-1][0] == node:
            runs[-1][1] += 1
        else:
            runs.append([node, 1])
    sizes = {count for _, count in runs}
    if len(sizes) != 1 or len({node for node, _ in runs}) != len(runs):
        return None
    return sizes.pop()


def first_data_parallel_ranks(tensor: int, data: int) -> list[int]:
    """The global ranks of the DP group of (TP rank 0, stage 0), in group rank order: Megatron's
    tp-cp-dp-pp order puts DP rank ``d`` at ``tensor * d``. Every other DP group is this one
    shifted, so it stands for all when nodes are counted (:func:`group_ranks_per_node`)."""
    return [tensor * d for d in range(data)]


def node_wise_layout_problem(world: int, tensor: int, pipeline: int, gpus_per_node: int):
    """Why the node-wise exchange cannot route this layout, or None when it can.

    It needs whole nodes, and DP groups whose ranks fill them in equal runs, counted as the
    Dispatcher counts them (:func:`group_ranks_per_node` of :func:`first_data_parallel_ranks`).
    """
    g = gpus_per_node
    if world % g:
        return (
            f"--gpus-per-node {g} does not divide the world size {world} (the exchange routes "
            "between whole nodes)"
        )
    dp = world // (tensor * pipeline)
    if group_ranks_per_node(first_data_parallel_ranks(tensor, dp), g) is None:
        return (
            f"with --tensor-model-parallel-size {tensor} the {dp} data-parallel ranks of a group "
            f"do not fill nodes of --gpus-per-node {g} in equal runs"
        )
    return None


def map_bins_to_ranks(
    bins: np.ndarray,
    owners: np.ndarray,
    weights: np.ndarray | None,
    num_ranks: int,
    gpus_per_node: int = 8,
    exact_max_ranks: int = EXACT_MAX_RANKS,
) -> LocalityResult:
    """Choose the rank of every bin, node-aware, keeping the most payload in place.

    Args:
        bins: (n,) bin of each item, in ``[0, num_ranks)``.
        owners: (n,) rank that holds each item now.
        weights: (n,) payload of each item (bytes, tokens); None counts items.
        num_ranks: number of bins and of ranks (``d``).
        gpus_per_node: ranks per node; the last node may be partial.
        exact_max_ranks: solve exactly up to this many ranks, greedily beyond.

    Returns:
        The mapping; ``ranks = result.bin_to_rank[bins]`` places every item.
    """
    d = int(num_ranks)
    bins = np.asarray(bins, dtype=np.int64)
    owners = np.asarray(owners, dtype=np.int64)
    w = np.ones(bins.size) if weights is None else np.asarray(weights, dtype=np.float64)
    g = max(1, min(int(gpus_per_node), d))
    exact = d <= exact_max_ranks
    num_nodes = -(-d // g)
    node_sizes = np.minimum(g, d - g * np.arange(num_nodes))

    # Stage 1: bins to nodes.
    if num_nodes == 1:
        bin_node = np.zeros(d, dtype=np.int64)
    else:
        rows, cols, vals = _aggregate(bins, owners // g, w, d, num_nodes)
        if exact:
            dense = np.zeros((d, num_nodes))
            dense[rows, cols] = vals
            # A node with c ranks is c identical columns of the assignment problem.
            slot_node = np.repeat(np.arange(num_nodes), node_sizes)
            bin_node = slot_node[_hungarian_max(dense[:, slot_node])]
        else:
            bin_node = _greedy_assign(rows, cols, vals, d, node_sizes)

    # Stage 2: within each node, bins to its ranks. Only items owned on the bin's node count;
    # columns are local ranks (owner % g), so the pairs index a small (d, g) table.
    on_node = bin_node[bins] == owners // g
    rows, local, vals = _aggregate(bins[on_node], owners[on_node] % g, w[on_node], d, g)
    cols = bin_node[rows] * g + local
    bin_to_rank = np.empty(d, dtype=np.int64)
    if exact:
        dense = np.zeros((d, d))
        dense[rows, cols] = vals
        for k in range(num_nodes):
            node_bins = np.flatnonzero(bin_node == k)
            node_ranks = np.arange(k * g, k * g + node_sizes[k])
            sub = dense[np.ix_(node_bins, node_ranks)]
            bin_to_rank[node_bins] = node_ranks[_hungarian_max(sub)]
    else:
        # One greedy over all nodes at once: columns are ranks with capacity 1, and a bin only
        # has pairs with ranks of its own node. Bins left over take the free ranks of their
        # node, both in index order.
        assigned = _greedy_assign(rows, cols, vals, d, np.ones(d, dtype=np.int64), fill=False)
        bin_to_rank[:] = assigned
        taken = np.zeros(d, dtype=bool)
        taken[assigned[assigned >= 0]] = True
        left = np.flatnonzero(assigned < 0)
        if left.size:
            free = np.flatnonzero(~taken)
            left = left[np.argsort(bin_node[left], kind="stable")]
            free = free[np.argsort(free // g, kind="stable")]
            bin_to_rank[left] = free
    ranks = bin_to_rank[bins]
    in_place = float(w[ranks == owners].sum())
    in_node = float(w[ranks // g == owners // g].sum())
    return LocalityResult(bin_to_rank, in_place, in_node, float(w.sum()), exact)


def moved_lower_bound(bins: np.ndarray, owners: np.ndarray, num_ranks: int) -> int:
    """A lower bound on the items that move under *any* bin-to-rank mapping of these bins.

    Each bin can keep in place at most the items of one owner, the one it has most of. With
    many ranks, owners are folded modulo 64 before counting: merged counts only overestimate
    what can stay, so the bound stays valid and costs one bincount.
    """
    bins = np.asarray(bins, dtype=np.int64)
    if bins.size == 0:
        return 0
    fold = num_ranks if num_ranks * num_ranks <= _DENSE_MAX else 64
    key = bins * fold + np.asarray(owners, dtype=np.int64) % fold
    counts = np.bincount(key, minlength=num_ranks * fold).reshape(num_ranks, fold)
    return int(bins.size - counts.max(axis=1).sum())


def _aggregate(
    rows: np.ndarray, cols: np.ndarray, w: np.ndarray, num_rows: int, num_cols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum ``w`` per (row, col) pair; only pairs with positive weight, in (row, col) order."""
    key = rows * num_cols + cols
    # A dense table costs its size, a sort n log n: dense only when the table is small.
    if num_rows * num_cols <= min(_DENSE_MAX, max(8 * key.size, 4096)):
        table = np.bincount(key, weights=w, minlength=num_rows * num_cols)
        uniq = np.flatnonzero(table > 0)
        vals = table[uniq]
    else:
        uniq, inv = np.unique(key, return_inverse=True)
        vals = np.bincount(inv, weights=w, minlength=uniq.size)
        keep = vals > 0
        uniq, vals = uniq[keep], vals[keep]
    return uniq // num_cols, uniq % num_cols, vals


_DENSE_MAX = 1 << 21
"""Largest (rows x cols) table aggregated densely with bincount (16 MiB of float64)."""

GREEDY_ROUNDS = 16
"""Proposal rounds of the greedy; rows still unassigned then take the remaining room."""


def _greedy_assign(
    rows: np.ndarray,
    cols: np.ndarray,
    vals: np.ndarray,
    num_rows: int,
    capacity: np.ndarray,
    fill: bool = True,
) -> np.ndarray:
    """Greedy maximum-weight assignment of rows to columns with capacities, vectorised.

    Each round, every unassigned row proposes to its heaviest column that still has room (ties:
    lowest column), and each column accepts its heaviest proposals (ties: lowest row) up to its
    room. A round is a few O(pairs) numpy passes with no sort of the pairs.

    Args:
        rows, cols, vals: the positive-weight pairs, in (row, col) order.
        num_rows: rows to assign (every row must end up assigned when ``fill``).
        capacity: (C,) rows each column can take; sums to at least ``num_rows`` when ``fill``.
        fill: give rows left without a column the remaining room, rows and columns in index
            order; otherwise leave them at -1.

    Returns:
        (num_rows,) the column of each row.
    """
    cap = np.asarray(capacity, dtype=np.int64).copy()
    out = np.full(num_rows, -1, dtype=np.int64)
    r, c, v = rows, cols, np.asarray(vals, dtype=np.float64)
    for _ in range(GREEDY_ROUNDS):
        if r.size == 0:
            break
        # Each row's heaviest live pair (ties: lowest column, the first in (row, col) order).
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        seg_of = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, r.size]))
        best = np.maximum.reduceat(v, starts)
        pos = np.arange(r.size)
        first = np.minimum.reduceat(np.where(v == best[seg_of], pos, r.size), starts)
        pr, pc, pv = r[first], c[first], v[first]
        # Each column accepts its heaviest proposals (ties: lowest row) up to its room.
        by_col = np.lexsort((pr, -pv, pc))
        pr, pc = pr[by_col], pc[by_col]
        cstart = np.flatnonzero(np.r_[True, pc[1:] != pc[:-1]])
        rank = np.arange(pc.size) - np.repeat(cstart, np.diff(np.r_[cstart, pc.size]))
        accept = rank < cap[pc]
        out[pr[accept]] = pc[accept]
        cap -= np.bincount(pc[accept], minlength=cap.size)
        # Drop the pairs of assigned rows and of full columns; the rest stays in order.
        keep = (out[r] < 0) & (cap[c] > 0)
        r, c, v = r[keep], c[keep], v[keep]
    if fill:
        left = np.flatnonzero(out < 0)
        if left.size:
            free = np.repeat(np.arange(cap.size), np.maximum(cap, 0))
            out[left] = free[: left.size]
    return out


def _hungarian_max(weight: np.ndarray) -> np.ndarray:
    """Maximum-weight perfect matching of a small square matrix: the column of each row.

    The shortest-augmenting-path Hungarian method with potentials, O(n^3), in plain Python
    (faster than numpy at the sizes used here, n <= EXACT_MAX_RANKS). Ties resolve to the
    lowest column index.
    """
    w = np.asarray(weight, dtype=np.float64)
    n = w.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    top = float(w.max())
    cost = (top - w).tolist()  # minimise
    inf = float("inf")
    u = [0.0] * (n + 1)
    v = [0.0] * (n + 1)
    match = [0] * (n + 1)  # match[col] = row (1-based); 0 = free
    way = [0] * (n + 1)
    for i in range(1, n + 1):
        match[0] = i
        j0 = 0
        minv = [inf] * (n + 1)
        used = [False] * (n + 1)
        while True:
            used[j0] = True
            i0 = match[j0]
            row = cost[i0 - 1]
            ui0 = u[i0]
            delta = inf
            j1 = 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = row[j - 1] - ui0 - v[j]
                    if cur < minv[j]:
                        minv[j] = cur
                        way[j] = j0
                    if minv[j] < delta:
                        delta = minv[j]
                        j1 = j
            for j in range(n + 1):
                if used[j]:
                    u[match[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
    col_of_row = np.empty(n, dtype=np.int64)
    for j in range(1, n + 1):
        col_of_row[match[j] - 1] = j - 1
    return col_of_row

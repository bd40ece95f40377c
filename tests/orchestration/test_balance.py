# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Tests of the balancing algorithms, the lower bounds and the locality mapping.

Oracles are written here independently of the code under test: a branch and bound over
restricted-growth assignments for the optimum, plain enumeration for padded problems and
small bijections, and a heap for LPT.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestration.balance import (
    ALGORITHMS,
    DEFAULT_BUDGET,
    InfeasibleCapError,
    balance,
    balance_padded,
    quantize,
)
from orchestration.balance.differencing import karmarkar_karp
from orchestration.balance.greedy import lpt
from orchestration.balance.local_search import refine, repair
from orchestration.balance.problem import BalanceProblem as _Problem
from orchestration.bounds import combinatorial_bounds, lower_bound
from orchestration.locality import _greedy_assign, _hungarian_max, map_bins_to_ranks

PACKED = [a for a in ALGORITHMS if a not in ("ordinary", "repair")]


# --------------------------------------------------------------------------------------------
# Oracles


def optimum(costs, d: int, sizes=None, cap=None) -> float:
    """Exact min max load by branch and bound over restricted-growth assignments."""
    order = sorted(range(len(costs)), key=lambda i: -costs[i])
    c = [float(costs[i]) for i in order]
    s = [int(sizes[i]) for i in order] if sizes is not None else [0] * len(c)
    best = [float("inf")]
    loads, used = [0.0] * d, [0] * d

    def dfs(k: int, opened: int, cur: float) -> None:
        if cur >= best[0]:
            return
        if k == len(c):
            best[0] = cur
            return
        for b in range(min(opened + 1, d)):
            if cap is not None and used[b] + s[k] > cap:
                continue
            loads[b] += c[k]
            used[b] += s[k]
            dfs(k + 1, max(opened, b + 1), max(cur, loads[b]))
            loads[b] -= c[k]
            used[b] -= s[k]

    dfs(0, 0, 0.0)
    return best[0]


def heap_lpt(q: np.ndarray, d: int, order: np.ndarray, sizes=None, cap=None) -> np.ndarray:
    """Sequential LPT: each item to the lightest bin (ties: lowest index) where it fits."""
    bins = np.full(q.size, -1)
    loads = [0] * d
    used = [0] * d
    if cap is None:
        heap = [(0, b) for b in range(d)]
        for i in order:
            load, b = heapq.heappop(heap)
            bins[i] = b
            heapq.heappush(heap, (load + int(q[i]), b))
        return bins
    for i in order:
        fits = [b for b in range(d) if used[b] + sizes[i] <= cap]
        b = min(fits, key=lambda x: (loads[x], x))
        bins[i] = b
        loads[b] += int(q[i])
        used[b] += int(sizes[i])
    return bins


def problem(costs, d, sizes=None, cap=None):
    return _Problem.make(np.asarray(costs, float), d, sizes, cap, None, DEFAULT_BUDGET)


def max_load(costs, bins, d) -> float:
    return float(np.bincount(bins, weights=np.asarray(costs, float), minlength=d).max())


costs_st = st.lists(st.integers(1, 1000).map(float), min_size=1, max_size=12)
mixed_st = st.one_of(
    costs_st,
    st.lists(st.floats(0.01, 100.0, allow_nan=False), min_size=1, max_size=12),
    st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0]), min_size=1, max_size=12),
)


# --------------------------------------------------------------------------------------------
# Every item exactly once; determinism; optimality


@settings(max_examples=40, deadline=None)
@given(mixed_st, st.integers(1, 4), st.sampled_from(PACKED))
def test_every_item_assigned_exactly_once(costs, d, alg):
    res = balance(np.array(costs), d, algorithm=alg)
    assert res.bins.shape == (len(costs),)
    assert res.bins.min() >= 0 and res.bins.max() < d
    np.testing.assert_allclose(res.loads, np.bincount(res.bins, weights=costs, minlength=d))
    again = balance(np.array(costs), d, algorithm=alg)
    np.testing.assert_array_equal(res.bins, again.bins)


@settings(max_examples=60, deadline=None)
@given(mixed_st, st.integers(2, 4))
def test_auto_within_one_percent_of_optimum(costs, d):
    opt = optimum(costs, d)
    res = balance(np.array(costs), d)
    assert res.max_load <= opt * 1.01 + 1e-9


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 60).map(float), min_size=2, max_size=10), st.integers(2, 4))
def test_auto_with_owners_is_as_good_and_maps_to_ranks(costs, d):
    owners = np.arange(len(costs)) % d
    res = balance(np.array(costs), d, owners=owners)
    assert res.max_load <= optimum(costs, d) * 1.01 + 1e-9
    assert res.moved_items == int(np.count_nonzero(res.bins != owners))
    assert res.ordinary_loads is not None
    assert res.max_load <= res.ordinary_loads.max() + 1e-9


def test_ordinary_is_kept_when_nothing_beats_it():
    costs = np.array([5.0, 5.0, 5.0, 5.0])
    owners = np.array([0, 1, 2, 3])
    for alg in ("auto", "lpt", "kk", "kk+refine"):
        res = balance(costs, 4, algorithm=alg, owners=owners)
        assert res.algorithm == "ordinary" and res.moved_items == 0
    res = balance(costs, 4, algorithm="lpt", owners=owners[::-1].copy(), keep_ordinary=False)
    assert res.moved_items == 0  # the locality mapping puts every bin on its owner


def test_known_kk_example():
    # 2-way KK on {8,7,6,5,4}: differences 8-7=1, {6,5,4,1} -> ... a 16/14 split.
    p = problem([8, 7, 6, 5, 4], 2)
    bins = karmarkar_karp(p)
    loads = sorted(np.bincount(bins, weights=[8, 7, 6, 5, 4], minlength=2))
    assert loads == [14.0, 16.0]
    assert balance(np.array([8.0, 7, 6, 5, 4]), 2).max_load == 15.0  # exact search finds 15


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4, 7, 10]), min_size=1, max_size=40), st.integers(1, 7))
def test_vectorised_lpt_is_exact_lpt_with_ties(costs, d):
    p = problem(costs, d)
    np.testing.assert_array_equal(lpt(p), heap_lpt(p.q, d, p.order))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=30),
    st.integers(1, 5),
    st.integers(9, 30),
)
def test_vectorised_lpt_is_exact_lpt_with_a_cap(pairs, d, cap):
    costs = [c for c, _ in pairs]
    sizes = np.array([s for _, s in pairs])
    assume(sizes.sum() <= d * cap)
    p = problem(costs, d, sizes, cap)
    try:
        ref = heap_lpt(p.q, d, p.order, sizes, cap)
    except ValueError:  # min() of no feasible bin: the greedy fails
        with pytest.raises(InfeasibleCapError, match="greedy failure"):
            lpt(p)
        return
    np.testing.assert_array_equal(lpt(p), ref)


def test_large_instances_use_the_fast_paths_and_stay_valid():
    rng = np.random.default_rng(3)
    costs = rng.lognormal(0, 1, 6000)
    owners = np.repeat(np.arange(300), 20)
    res = balance(costs, 300, owners=owners)
    assert res.bins.shape == (6000,)
    bound = max(combinatorial_bounds(costs, 300).values())
    assert res.max_load <= 1.05 * bound
    for alg in ("lpt", "kk", "kk+refine"):
        r = balance(costs, 300, algorithm=alg)
        assert r.max_load <= 1.2 * bound


@settings(max_examples=40, deadline=None)
@given(mixed_st, st.integers(2, 5))
def test_refine_never_worsens(costs, d):
    p = problem(costs, d)
    start = np.arange(len(costs)) % d
    before = np.bincount(start, weights=p.q, minlength=d).max()
    after = np.bincount(refine(p, start), weights=p.q, minlength=d).max()
    assert after <= before


def test_refine_with_many_bins_lowers_the_max():
    rng = np.random.default_rng(0)
    costs = rng.uniform(1, 2, 4000)
    p = problem(costs, 200)
    start = np.arange(4000) % 200
    before = np.bincount(start, weights=p.q, minlength=200).max()
    after = np.bincount(refine(p, start), weights=p.q, minlength=200).max()
    assert after < before


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 50).map(float), min_size=1, max_size=25), st.integers(2, 5))
def test_repair_meets_its_target_or_gives_up(costs, d):
    p = problem(costs, d)
    owners = np.zeros(len(costs), dtype=np.int64)
    target = int(np.bincount(lpt(p), weights=p.q, minlength=d).max())
    bins = repair(p, owners, target)
    if bins is not None:
        assert np.bincount(bins, weights=p.q, minlength=d).max() <= target


def test_quantized_sums_are_exact():
    rng = np.random.default_rng(1)
    c = rng.lognormal(0, 2, 100_000)
    q, scale = quantize(c)
    assert q.dtype == np.int64 and q.max() == 2 ** (52 - (100_000).bit_length())
    total = int(q.sum())
    assert float(np.bincount(np.zeros(q.size, dtype=np.int64), weights=q)[0]) == total
    with pytest.raises(ValueError, match="finite"):
        quantize(np.array([1.0, -1.0]))


# --------------------------------------------------------------------------------------------
# Caps


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(1, 20)), min_size=1, max_size=12),
    st.integers(1, 4),
    st.integers(1, 40),
    st.sampled_from(PACKED),
)
def test_cap_respected_or_clear_error(pairs, d, cap, alg):
    costs = np.array([float(c) for c, _ in pairs])
    sizes = np.array([s for _, s in pairs])
    labels = [f"sample-{i}" for i in range(len(pairs))]
    try:
        res = balance(costs, d, algorithm=alg, sizes=sizes, cap=cap, labels=labels)
    except InfeasibleCapError as e:
        msg = str(e)
        if sizes.max() > cap:
            assert e.label == labels[int(np.argmax(sizes))] and e.label in msg
            assert "more than the per-bin cap" in msg
        elif sizes.sum() > d * cap:
            assert "exceeds" in msg
        else:
            # A greedy could not fit it: the message says so and names the item.
            assert "could not fit" in msg and e.label in msg
            # The exact search (also tried by auto on small problems) finds any packing.
            if alg in ("exact", "auto"):
                assert optimum(costs, d, sizes, cap) == float("inf")
        return
    assert np.bincount(res.bins, weights=sizes, minlength=d).max() <= cap
    assert res.sizes is not None and res.sizes.max() <= cap


def test_one_item_larger_than_the_cap_names_it():
    with pytest.raises(InfeasibleCapError, match="'s-7' has size 99, more than the per-bin cap 50"):
        balance(
            np.ones(10), 2, sizes=np.r_[np.ones(7), 99, 1, 1], cap=50, labels=lambda i: f"'s-{i}'"
        )


def _caps_met_by_some_assignment(sizes: np.ndarray, d: int, caps: np.ndarray) -> bool:
    """Brute force over every assignment (small n and d only)."""
    n = sizes.shape[0]
    assign = np.array(list(itertools.product(range(d), repeat=n)))  # (d**n, n)
    onehot = assign[:, :, None] == np.arange(d)[None, None, :]  # (A, n, d)
    used = np.einsum("anb,nk->abk", onehot, sizes)
    return bool(np.any(np.all(used <= caps, axis=(1, 2))))


@pytest.mark.parametrize("alg", PACKED)
def test_a_cap_of_the_second_kind_moves_an_item_off_the_lightest_bin(alg):
    # By cost alone the two small items would share bin 1; their second kind of size fills it.
    sizes = np.array([[1, 0], [1, 10], [1, 10]])
    res = balance(np.array([10.0, 1.0, 1.0]), 2, algorithm=alg, sizes=sizes, cap=[5, 10])
    assert res.sizes.tolist() in ([[2, 10], [1, 10]], [[1, 10], [2, 10]])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.integers(0, 20), st.integers(0, 20)),
        min_size=1,
        max_size=7,
    ),
    st.integers(1, 3),
    st.integers(1, 40),
    st.integers(1, 40),
    st.sampled_from(PACKED),
)
def test_several_caps_are_all_respected_or_the_error_names_the_kind(triples, d, cap_a, cap_b, alg):
    # Whole samples carry tokens of every phase: each bin must stay under every phase's cap.
    costs = np.array([float(c) for c, _, _ in triples])
    sizes = np.array([[a, b] for _, a, b in triples])
    caps = np.array([cap_a, cap_b])
    names = ["vision tokens", "llm tokens"]
    labels = [f"sample-{i}" for i in range(len(triples))]
    try:
        res = balance(
            costs, d, algorithm=alg, sizes=sizes, cap=caps, size_names=names, labels=labels
        )
    except InfeasibleCapError as e:
        msg = str(e)
        assert e.size_name in names and e.cap == caps[names.index(e.size_name)]
        if np.any(sizes > caps):
            over = sizes - caps
            i = int(np.argmax(over.max(axis=1)))
            assert e.label == labels[i] and f"{labels[i]} has {e.size_name}" in msg
            assert "more than the per-bin cap" in msg
        elif np.any(sizes.sum(axis=0) > d * caps):
            assert "exceeds" in msg
        else:
            assert "could not fit" in msg and e.label in msg
            if alg in ("exact", "auto"):  # the exact search finds any packing there is
                assert not _caps_met_by_some_assignment(sizes, d, caps)
        return
    used = np.zeros((d, 2), dtype=np.int64)
    np.add.at(used, res.bins, sizes)
    assert np.all(used <= caps)
    np.testing.assert_array_equal(res.sizes, used)
    # One kind of size as a column is the same problem as the plain (n,) sizes.
    outcomes = []
    for kind_sizes, kind_cap in ((sizes[:, 0], cap_a), (sizes[:, :1], [cap_a])):
        try:
            r = balance(costs, d, algorithm=alg, sizes=kind_sizes, cap=kind_cap, labels=labels)
            outcomes.append((r.bins.tolist(), r.sizes.reshape(-1).tolist()))
        except InfeasibleCapError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]


# --------------------------------------------------------------------------------------------
# Padded cost


def padded_optimum(lengths, d, f, cap=None) -> float:
    best = float("inf")
    for assign in itertools.product(range(d), repeat=len(lengths)):
        worst = 0.0
        for b in range(d):
            group = [lengths[i] for i in range(len(lengths)) if assign[i] == b]
            if group:
                if cap is not None and len(group) * max(group) > cap:
                    worst = float("inf")
                    break
                worst = max(worst, len(group) * f(max(group)))
        best = min(best, worst)
    return best


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 12), min_size=1, max_size=7),
    st.integers(1, 3),
    st.sampled_from([(1.0, 0.0, 0.0), (1.0, 0.3, 2.0), (0.0, 0.0, 1.0)]),
    st.one_of(st.none(), st.integers(12, 40)),
)
def test_padded_exact_equals_brute_force(lengths, d, coef, cap):
    a, b, c = coef
    f = lambda L: a * L + b * L * L + c  # noqa: E731
    opt = padded_optimum(lengths, d, f, cap)
    if opt == float("inf"):
        with pytest.raises(InfeasibleCapError):
            balance_padded(np.array(lengths), d, f, cap=cap)
        return
    res = balance_padded(np.array(lengths), d, f, cap=cap)
    assert res.max_load == pytest.approx(opt, rel=1e-9)
    # The reported loads are those of the returned bins.
    for g in range(d):
        group = np.array(lengths)[res.bins == g]
        expect = len(group) * f(group.max()) if group.size else 0.0
        assert res.loads[g] == pytest.approx(expect)
        if cap is not None and group.size:
            assert len(group) * group.max() <= cap


def test_padded_item_over_cap_is_named():
    with pytest.raises(InfeasibleCapError, match="clip-2 has 50 tokens, more than the cap 40"):
        balance_padded(
            np.array([10, 20, 50]), 2, lambda L: L, cap=40, labels=["clip-0", "clip-1", "clip-2"]
        )


# --------------------------------------------------------------------------------------------
# Lower bounds


@settings(max_examples=80, deadline=None)
@given(mixed_st, st.integers(1, 4))
def test_lower_bounds_never_exceed_the_optimum(costs, d):
    opt = optimum(costs, d)
    for name, value in combinatorial_bounds(np.array(costs), d).items():
        assert value <= opt * (1 + 1e-12) + 1e-12, name


def test_ilp_proves_the_optimum_on_small_instances():
    rng = np.random.default_rng(7)
    for _ in range(3):
        costs = rng.integers(1, 100, 10).astype(float)
        opt = optimum(costs, 3)
        lb = lower_bound(costs, 3, ilp=True, time_limit=10.0)
        assert lb.proven_optimum == pytest.approx(opt)
        assert lb.value <= opt * (1 + 1e-9)
        assert lb.value >= opt * (1 - 1e-5)


# --------------------------------------------------------------------------------------------
# Locality


def best_bijection(weight: np.ndarray) -> float:
    n = weight.shape[0]
    return max(sum(weight[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.data())
def test_hungarian_is_exact(n, data):
    w = np.array(data.draw(st.lists(st.integers(0, 9), min_size=n * n, max_size=n * n)), float)
    w = w.reshape(n, n)
    cols = _hungarian_max(w)
    assert sorted(cols.tolist()) == list(range(n))
    assert w[np.arange(n), cols].sum() == pytest.approx(best_bijection(w))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.data())
def test_single_node_mapping_keeps_the_most_in_place(d, data):
    n = data.draw(st.integers(0, 20))
    bins = np.array(
        data.draw(st.lists(st.integers(0, d - 1), min_size=n, max_size=n)), dtype=np.int64
    )
    owners = np.array(
        data.draw(st.lists(st.integers(0, d - 1), min_size=n, max_size=n)), dtype=np.int64
    )
    res = map_bins_to_ranks(bins, owners, None, d, gpus_per_node=8)
    assert sorted(res.bin_to_rank.tolist()) == list(range(d))
    w = np.zeros((d, d))
    np.add.at(w, (bins, owners), 1.0)
    assert res.in_place == pytest.approx(best_bijection(w))


@pytest.mark.parametrize("exact_max", [0, 64])
def test_node_aware_mapping_is_a_bijection_that_keeps_nodes(exact_max):
    # 4 nodes x 2 ranks; each bin's items all come from one node, spread over its two ranks.
    d, g = 8, 2
    rng = np.random.default_rng(0)
    bins = np.repeat(np.arange(d), 10)
    node_of_bin = rng.permutation(d) // g
    owners = node_of_bin[bins] * g + rng.integers(0, g, bins.size)
    res = map_bins_to_ranks(bins, owners, None, d, gpus_per_node=g, exact_max_ranks=exact_max)
    assert sorted(res.bin_to_rank.tolist()) == list(range(d))
    assert res.in_node == res.total  # every bin lands on its items' node
    assert res.exact == (exact_max >= d)


def test_greedy_assignment_respects_capacities():
    rows = np.array([0, 0, 1, 2, 2, 3])
    cols = np.array([0, 1, 0, 0, 1, 1])
    vals = np.array([5.0, 1.0, 4.0, 3.0, 2.0, 6.0])
    out = _greedy_assign(rows, cols, vals, 4, np.array([2, 2]))
    assert np.bincount(out, minlength=2).tolist() == [2, 2]
    assert out[3] == 1 and out[0] == 0

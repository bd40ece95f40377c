# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The floor on items per bin (``hold_at_least``) and the LLM phase's floor in the plan: every
rank keeps at least the step's microbatch count of samples, so all run as many microbatches."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestration.balance import hold_at_least
from orchestration.cost_model import CostModel
from orchestration.metadata import Item, SampleMeta
from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.phase_plan import plan_iteration

instance_st = st.tuples(
    st.integers(2, 4),  # bins
    st.lists(st.integers(1, 50), min_size=1, max_size=9),  # costs
    st.integers(1, 3),  # floor
    st.randoms(use_true_random=False),
)


def _fewest_moves(bins: np.ndarray, d: int, minimum: int) -> int:
    """Brute force: the fewest items to move so that every bin holds ``minimum``."""
    n = bins.size
    for moved in range(n + 1):
        for chosen in itertools.combinations(range(n), moved):
            for targets in itertools.product(range(d), repeat=moved):
                b = bins.copy()
                b[list(chosen)] = targets
                if np.bincount(b, minlength=d).min() >= minimum:
                    return moved
    raise AssertionError("no assignment meets the floor")


@settings(max_examples=60, deadline=None)
@given(instance_st)
def test_the_floor_is_met_with_the_fewest_moves_from_bins_above_it(instance):
    d, costs, minimum, rng = instance
    costs = np.array(costs, dtype=np.float64)
    bins = np.array([rng.randrange(d) for _ in costs])
    held = hold_at_least(bins, costs, d, minimum)
    if costs.size < minimum * d:
        assert held is None
        return
    counts = np.bincount(held, minlength=d)
    assert counts.min() >= minimum
    moved = np.flatnonzero(held != bins)
    assert moved.size == _fewest_moves(bins, d, minimum)
    before = np.bincount(bins, minlength=d)
    # Only bins above the floor give, only bins below it receive.
    assert all(before[bins[i]] > minimum and before[held[i]] < minimum for i in moved)
    # Deterministic.
    assert np.array_equal(held, hold_at_least(bins, costs, d, minimum))


def test_a_cap_every_move_would_break_gives_none_and_a_looser_one_a_result():
    bins = np.array([0, 0, 0, 1])
    costs = np.array([1.0, 2.0, 3.0, 9.0])
    sizes = np.array([5, 5, 5, 8])
    assert hold_at_least(bins, costs, 2, 2, sizes, cap=12) is None
    held = hold_at_least(bins, costs, 2, 2, sizes, cap=13)
    assert held.tolist() == [1, 0, 0, 1]  # the cheapest item of the donor


def _shape() -> ModelShape:
    enc = TransformerShape(2, 64, 256, 4, input_flops_per_token=2.0 * 48 * 64)
    llm = TransformerShape(4, 64, 256, 4, causal=True, output_flops_per_token=2.0 * 64 * 512)
    return ModelShape(llm=llm, encoders={"vision": enc})


def test_the_llm_phase_leaves_every_rank_the_steps_microbatch_count_of_samples():
    # Rank 0 loads one long sample among short ones: an additive balance gives it the long
    # sample nearly alone, so it would run fewer microbatches than rank 1.
    short = [SampleMeta(f"short{k}", 20, image=(Item((16,), 4),)) for k in range(7)]
    long = SampleMeta("long", 400)
    ranks = [
        [(0, long), *[(1 + k, short[k]) for k in range(3)]],
        [(4 + k, short[3 + k]) for k in range(4)],
    ]
    cost = CostModel.build(_shape())
    free = plan_iteration(ranks, cost).phase("llm")
    assert np.bincount(free.dispatch.dst, minlength=2).min() < 3  # the case is real
    floor = plan_iteration(ranks, cost, min_llm_samples=3).phase("llm")
    counts = np.bincount(floor.dispatch.dst, minlength=2)
    assert counts.min() >= 3 and counts.sum() == 8
    assert floor.loads_after.max() <= floor.loads_before.max()
    # A floor above what the loader gave a rank is lowered to it: the ordinary one meets it.
    high = plan_iteration(ranks, cost, min_llm_samples=6).phase("llm")
    assert np.bincount(high.dispatch.dst, minlength=2).min() >= 4


@pytest.mark.parametrize("minimum", [0, -1])
def test_no_floor_leaves_the_assignment(minimum):
    bins = np.array([0, 0, 1])
    assert hold_at_least(bins, np.ones(3), 2, minimum).tolist() == [0, 0, 1]

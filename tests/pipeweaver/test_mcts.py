# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Phase 1 of the schedule search (MCTS over segment priorities) against exact oracles.

The instances are small (P = 2, vision + LLM, one chunk per rank and module) with analytic
compute times that differ per microbatch, so that the priority order matters; the oracle is
the exact optimum over every priority order (:mod:`pipeweaver.search.exhaustive`), itself
checked against plain enumeration of the orders on a tinier instance.
"""

from __future__ import annotations

import functools

import pytest

from megatron.mllm.arguments import ONE_REPLICA
from megatron.mllm.config_files import flag_argv, run_from_flags, set_flags
from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.interleave import default_priority, greedy_dual_queue
from pipeweaver.ir import Kind, ScheduleError
from pipeweaver.placement import Placement
from pipeweaver.search.exhaustive import brute_force_best, exhaustive_best
from pipeweaver.search.mcts import OrderEvaluator, search_schedule, tree_search
from pipeweaver.search.segments import SegmentGroup, default_order, order_priority
from pipeweaver.semu.batches import MicrobatchMeta, SubBatch
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.timing import ComputeCost

FLAGS = {
    "num-layers": 4,
    "hidden-size": 64,
    "num-attention-heads": 4,
    "seq-length": 256,
    "max-position-embeddings": 256,
    "vocab-size": 512,
    "vision-num-layers": 2,
    "vision-patch-size": 4,
    "audio-num-layers": 0,
    "micro-batch-size": 2,
    "global-batch-size": 16,
    "pipeline-model-parallel-size": 2,
}

# Per microbatch: LLM tokens, and the units of each vision sub (none: no vision group).
FOUR = ([60, 200, 120, 90], [[(150,)], [], [(300,)], []])
"""P=2, 4 microbatches, 2 modules: 232 distinct schedules over 518,400 orders."""

TWO = ([60, 200], [[(150,)], [(40,), (50,)]])
"""2 microbatches: 576 orders, few enough to enumerate one by one."""


@functools.cache
def _semu() -> Semu:
    spec = run_from_flags(flag_argv(set_flags(FLAGS)), ONE_REPLICA).semu
    cluster = ClusterSpec.from_json(
        {"device": "h100-sxm", "num_devices": 2, "devices_per_node": 8,
         "device_overrides": {"intra_node_bandwidth": 1e30, "inter_node_bandwidth": 1e30,
                              "intra_node_latency_s": 0.0, "inter_node_latency_s": 0.0}}
    )  # fmt: skip

    def cost(_placement, a, mb):
        # Time grows with the tokens; chunk 1 is slower (the head), B costs twice F.
        lens, _rows = mb.compute_sequences(a.module, a.sub)
        t = sum(lens) * (1.0 if a.module == "llm" else 0.6) * (1.0 + 0.3 * a.chunk)
        return ComputeCost(t * (2.0 if a.kind is Kind.B else 1.0), 1.0, 0.0)

    return Semu(spec, cluster, compute_cost_fn=cost)


def _instance(case):
    llm, vision = case
    m = len(llm)
    mbs = [
        MicrobatchMeta(
            (llm[i],),
            llm[i],
            {"vision": tuple(SubBatch(u, 10) for u in vision[i])} if vision[i] else {},
        )
        for i in range(m)
    ]
    structure = MicrobatchStructure(m, {"vision": tuple(len(v) for v in vision)})
    placement = Placement.interleaved(2, {"vision": 2, "llm": 4}, {"vision": 1, "llm": 1})
    return placement, structure, mbs


@functools.cache
def _four_optimum():
    placement, structure, mbs = _instance(FOUR)
    ev = OrderEvaluator(placement, structure, mbs, _semu())
    return exhaustive_best(ev), ev(ev.space.default())


def test_default_order_is_the_greedy_default_priority():
    """The greedy default order's keys give exactly default_priority's schedule."""
    for case in (FOUR, TWO):
        placement, structure, mbs = _instance(case)
        ev = OrderEvaluator(placement, structure, mbs, _semu())
        by_order = ev.interleave(order_priority(default_order(placement, structure)))
        plain = greedy_dual_queue(
            placement, structure, ev._phase2["duration"], priority=default_priority
        )
        assert by_order.actions == plain.actions


def test_exhaustive_equals_brute_force_on_two_microbatches():
    """The class enumeration finds the optimum of plain enumeration over all 576 orders."""
    placement, structure, mbs = _instance(TWO)
    ev = OrderEvaluator(placement, structure, mbs, _semu())
    t_brute, order_brute, count = brute_force_best(ev)
    assert count == 576
    ex = exhaustive_best(ev)
    assert ex.step_time_s == t_brute
    assert ev(ev.space.to_indices(ex.order)) == t_brute
    assert ex.classes < count  # many orders share a schedule


@pytest.mark.parametrize("seed", [0, 1])
def test_mcts_finds_the_exhaustive_optimum(seed):
    """P=2, 4 microbatches, 2 modules: MCTS with 700 rollouts finds the exact optimum."""
    ex, greedy = _four_optimum()
    assert ex.step_time_s < greedy  # the order matters here: greedy is not optimal
    placement, structure, mbs = _instance(FOUR)
    res = search_schedule(placement, structure, mbs, _semu(), rollouts=700, seed=seed)
    assert res.step_time_s == ex.step_time_s
    assert res.greedy_step_time_s == greedy
    check(res.schedule)
    assert _semu().simulate_pipeline(res.schedule, mbs).makespan == res.step_time_s


def test_same_seed_same_schedule_and_never_worse_than_greedy():
    placement, structure, mbs = _instance(FOUR)
    runs = [
        search_schedule(placement, structure, mbs, _semu(), rollouts=60, seed=s) for s in (7, 7, 8)
    ]
    assert runs[0].schedule.actions == runs[1].schedule.actions
    assert runs[0].order == runs[1].order and runs[0].rollouts == runs[1].rollouts == 61
    for r in runs:
        assert r.step_time_s <= r.greedy_step_time_s
        check(r.schedule)


def test_zero_budget_keeps_the_greedy_schedule():
    placement, structure, mbs = _instance(FOUR)
    greedy = greedy_dual_queue(
        placement, structure, OrderEvaluator(placement, structure, mbs, _semu())._phase2["duration"]
    )
    for kw in ({"rollouts": 0}, {"rollouts": 10**6, "budget_ms": 0}):
        res = search_schedule(placement, structure, mbs, _semu(), seed=0, **kw)
        assert res.rollouts == 1 and res.schedule.actions == greedy.actions
        assert res.step_time_s == res.greedy_step_time_s


def test_small_tree_is_exhausted_exactly():
    """On 2 microbatches the tree is enumerated completely; the search then stops early."""
    placement, structure, mbs = _instance(TWO)
    ev = OrderEvaluator(placement, structure, mbs, _semu())
    t_brute, _, _ = brute_force_best(ev)
    res = search_schedule(placement, structure, mbs, None, rollouts=10**5, seed=3, evaluator=ev)
    assert res.exhausted and res.rollouts < 10**5
    assert res.step_time_s == t_brute
    worst = search_schedule(
        placement, structure, mbs, None, rollouts=10**5, seed=3, evaluator=ev, maximize=True
    )
    assert worst.exhausted
    assert worst.step_time_s == max(ev(o) for o in ev._cache) >= res.greedy_step_time_s


def test_custom_evaluate_and_refine_hooks():
    """evaluate replaces the score (cached by order); refine runs on every evaluated order."""
    placement, structure, mbs = _instance(TWO)
    target = (SegmentGroup("llm", 1, Kind.F), SegmentGroup("vision", 1, Kind.F))
    calls = []

    def evaluate(order):
        calls.append(order)
        forwards = [g for g in order if g.kind is Kind.F]
        return float(forwards.index(target[0]) + forwards.index(target[1]))

    refined = []

    def refine(schedule):
        refined.append(schedule)
        return schedule

    res = search_schedule(
        placement, structure, mbs, _semu(), rollouts=10**5, seed=0, evaluate=evaluate, refine=refine
    )
    assert res.exhausted and res.step_time_s == 1.0  # the two targets first, in either order
    assert len(calls) == len(set(calls)) == res.evaluations
    assert len(refined) == 1  # only the returned schedule is built when evaluate is given


def test_bad_input_is_rejected():
    placement, structure, mbs = _instance(TWO)
    with pytest.raises(ValueError, match="workers"):
        search_schedule(placement, structure, mbs, _semu(), rollouts=1, workers=2)
    ev = OrderEvaluator(placement, structure, mbs, _semu())
    with pytest.raises(ScheduleError, match="segment group"):
        ev.space.to_indices(ev.space.groups[:-1])
    with pytest.raises(ScheduleError, match="microbatches"):
        OrderEvaluator(placement, structure, mbs[:1], _semu())


def test_rollouts_scored_without_lowering_time_as_the_lowered_schedule():
    """The evaluator scores compute-only orders (the lowering is 40% of a rollout): SEMU must
    time them exactly as the schedule that is kept and run, which is lowered."""
    placement, structure, mbs = _instance(FOUR)
    ev = OrderEvaluator(placement, structure, mbs, _semu())
    seen = []
    tree_search(ev.space, lambda o: (seen.append(o), ev(o))[1], rollouts=40, seed=3)
    assert len(seen) > 20
    for order in seen:
        compute_only, lowered = ev.schedule(order, lowered=False), ev.schedule(order)
        assert not compute_only.has_comms and lowered.has_comms
        assert ev.time_of(compute_only) == pytest.approx(ev.time_of(lowered), rel=1e-12)

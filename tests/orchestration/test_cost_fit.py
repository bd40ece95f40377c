# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Costs fitted to measured times, the exchange model, and the planner's gain-versus-exchange
check (issue 11, items 3 and 4).

Oracles: known coefficients behind synthetic timer values; features counted item by item in
plain Python; the exchange check against every combination of balanced and kept phases,
each planned and priced separately.
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle

import numpy as np
import pytest

from orchestration.cost_feedback import HOPS, REMEASURE_EVERY, CostFeedback, Measured
from orchestration.cost_fit import (
    COEFFICIENTS,
    FEATURES,
    OnlineCostFit,
    phase_features,
    rank_features,
)
from orchestration.cost_model import CostModel
from orchestration.exchange_cost import ExchangeCost, ExchangeFit, PayloadBytes, route_bytes
from orchestration.metadata import PhaseItems, PlanError
from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.phase_plan import plan_iteration
from orchestration.robust_fit import FitConfig, format_seconds
from orchestration.workload import SampleMeta
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec

R = 4
PAYLOAD = PayloadBytes(
    inputs={"vision": 192.0, "audio": 128.0, "llm": 8.0}, outputs={"vision": 256.0, "audio": 256.0}
)
TRUE = np.array([2e-3, 1.5e-4, 9.5e-7, 3e-9, 4e-6])
"""Per call, unit, token, token^2, output token: each makes 10-30% of a phase's time below."""


def _shape() -> ModelShape:
    enc = lambda d: TransformerShape(  # noqa: E731
        2, 64, 256, 4, input_flops_per_token=2.0 * d * 64, output_flops_per_token=2.0 * 64 * 64
    )
    llm = TransformerShape(4, 64, 256, 4, causal=True, output_flops_per_token=2.0 * 64 * 512)
    return ModelShape(llm=llm, encoders={"vision": enc(48), "audio": enc(32)})


FLOPS = CostModel.build(_shape())


def _seconds_model(per_call: float = 2e-4) -> CostModel:
    """The FLOPs model at 1 ns per 1000 FLOPs plus a per-call cost: a model in seconds."""
    return CostModel(
        {
            p: dataclasses.replace(m.scaled(1e-12), unit="seconds", per_call=per_call)
            for p, m in FLOPS.phases.items()
        }
    )


def _metadata(dp: int = R, per_rank: int = 4, seed: int = 0):
    gen = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=seed, token_scale=1 / 32)
    s = gen.samples(dp * per_rank)
    return [[(r * per_rank + k, s[r * per_rank + k]) for k in range(per_rank)] for r in range(dp)]


def _synthetic_items(rng, ranks: int) -> PhaseItems:
    """Encoder units of random counts per rank, each rank with its own typical length (so that
    items, tokens and tokens^2 are not proportional across ranks)."""
    counts = rng.integers(1, 12, ranks)
    owner = np.repeat(np.arange(ranks), counts)
    mean = np.repeat(rng.uniform(16, 600, ranks), counts)
    tokens = np.maximum(1, rng.normal(mean, mean / 3)).round().astype(np.int64)
    out = np.maximum(1, tokens / rng.uniform(2, 8, tokens.size)).round().astype(np.int64)
    pos = np.concatenate([np.arange(c) for c in counts])
    return PhaseItems("vision", owner, pos, np.arange(owner.size), tokens, out, pos * 0)


def _observe(fit, rng, iterations, true, *, noise=0.02, outliers=(), ranks=8, first=1):
    """Feed ``fit`` synthetic vision times of ``true`` coefficients; returns the rows fed."""
    rows = []
    for it in range(first, first + iterations):
        items = _synthetic_items(rng, ranks)
        f = rank_features(items, items.owner, ranks)
        y = f @ true * (1 + noise * rng.standard_normal(ranks))
        if it in outliers:
            y[it % ranks] *= 3.0  # a stalled rank
        fit.observe(it, "vision", f, y)
        rows.append((f, y))
    return rows


# --------------------------------------------------------------------------------------------
# Features


def test_features_count_each_ranks_items_packed_padded_and_ordinary():
    plan = plan_iteration(_metadata(), FLOPS, algorithm="lpt")
    for p in plan.phases:
        for ordinary in (False, True):
            ranks = p.items.owner if ordinary else p.dispatch.dst
            want = np.zeros((R, len(FEATURES)))
            for i, r in enumerate(ranks.tolist()):
                n = float(p.items.tokens[i])
                want[r] += [0, 1, n, n * n, p.items.out_tokens[i]]
            want[:, 0] = want[:, 1] > 0
            np.testing.assert_array_equal(phase_features(p, ordinary=ordinary), want)
        # Padded to each rank's longest item: count sequences of that length.
        padded = dataclasses.replace(FLOPS[p.phase], padded=True)
        got = phase_features(p, padded)
        for r in range(R):
            mine = p.items.tokens[p.dispatch.dst == r]
            L = float(mine.max()) if mine.size else 0.0
            assert got[r, 1:4].tolist() == [mine.size, mine.size * L, mine.size * L * L]
    # The features price a plan as the planner does: loads = features x coefficients.
    sm = _seconds_model()
    fit = OnlineCostFit(sm)
    for p in plan_iteration(_metadata(), sm, algorithm="lpt").phases:
        coef = fit.coefficients(p.phase)
        np.testing.assert_allclose(fit.features(p) @ coef, p.loads_after, rtol=1e-12)
        np.testing.assert_allclose(
            fit.features(p, ordinary=True) @ coef, p.loads_before, rtol=1e-12
        )


# --------------------------------------------------------------------------------------------
# The online fit


def test_fit_recovers_known_coefficients_from_noisy_times_with_outliers():
    """Starting from a FLOPs model (a wrong shape, another unit), 48 iterations of 8 ranks with
    2% noise and 5 stalled ranks (3x) give every coefficient within 5% and every prediction
    within 2%; without noise the stalls move no coefficient by 0.1%."""
    for noise, tol, pred_tol in ((0.02, 0.05, 0.02), (0.0, 1e-3, 1e-3)):
        rng = np.random.default_rng(1)
        fit = OnlineCostFit(FLOPS, FitConfig(window=48, warmup=8))
        rows = _observe(fit, rng, 48, TRUE, noise=noise, outliers={3, 11, 20, 33, 47})
        assert fit.warm("vision") and not fit.ready  # audio and llm were never observed
        coef = fit.coefficients("vision")
        np.testing.assert_allclose(coef, TRUE, rtol=tol)
        x = np.concatenate([f for f, _ in rows])
        np.testing.assert_allclose(x @ coef, x @ TRUE, rtol=pred_tol)
        assert fit.scale("vision") > 0
    text = fit.describe()
    assert text.startswith(
        "cost fit vision: 2 ms/call + 150 us/unit + 950 ns/tok + 3 ns/tok^2 + 4 us/out |"
    )
    assert "audio: warm-up 0/8" in text


def test_updates_are_bounded_and_then_converge_to_the_new_times():
    """When times change (here: every coefficient by 3x, and a term at 0 appears), each
    update moves a coefficient at most 2x down, and up at most 2x from the larger of its value
    and the value that explains 1% of a typical time (so a term at 0 can appear), up to the
    rounding to 6 digits; after the window has turned over the fit holds the new ones."""
    cfg = FitConfig(window=12, warmup=4, max_step=2.0, zero_share=0.01)
    a = TRUE * np.array([1, 1, 1, 1, 0])
    b = TRUE * np.array([3, 3, 1 / 3, 1 / 3, 1])
    rng = np.random.default_rng(2)
    fit = OnlineCostFit(FLOPS, cfg)
    _observe(fit, rng, 20, a, noise=0.005)
    np.testing.assert_allclose(fit.coefficients("vision")[:4], a[:4], rtol=0.05)
    assert fit.coefficients("vision")[4] < 0.1 * TRUE[4]
    window = []
    prev = fit.coefficients("vision")
    moved = np.zeros(len(FEATURES), dtype=bool)
    for it in range(21, 61):
        window += _observe(fit, rng, 1, b, noise=0.005, first=it)
        window = window[-cfg.window :]
        new = fit.coefficients("vision")
        x = np.concatenate([f for f, _ in window])
        typical = np.sqrt(np.mean(np.concatenate([y for _, y in window]) ** 2))
        floor = cfg.zero_share * typical / np.sqrt(np.mean(x**2, axis=0))
        slack = 1e-5  # rounding to 6 significant digits
        assert np.all(new >= prev / 2 * (1 - slack)), (new, prev)
        assert np.all(new <= 2 * np.maximum(prev, floor) * (1 + slack)), (new, prev, floor)
        moved[new != prev] = True
        prev = new
    # Each term within 1% of a typical time (the smallest term is 5% of it), and so are the
    # predictions.
    coef = fit.coefficients("vision")
    term_error = np.abs(coef - b) * np.sqrt(np.mean(x**2, axis=0)) / typical
    assert np.all(term_error < 0.01), term_error
    np.testing.assert_allclose(x @ coef, x @ b, rtol=0.01)
    assert moved.all()


def test_same_observations_give_identical_coefficients_and_plan_digests():
    """Two ranks' fits fed the same gathered values agree bit for bit, and so do their plans;
    values that differ by float noise (1e-13) round to the same coefficients and plan."""
    md = _metadata()
    fits = [OnlineCostFit(_seconds_model(), FitConfig(window=16, warmup=4)) for _ in range(3)]
    xfits = [ExchangeFit(ExchangeCost(1e-4, 1e-9, PAYLOAD), FitConfig(window=16, warmup=4))
             for _ in range(3)]  # fmt: skip
    rng = np.random.default_rng(3)
    true = {"vision": TRUE, "audio": TRUE * 0.5, "llm": TRUE * np.array([1, 1, 2, 1, 0])}
    for it in range(1, 9):
        plan = plan_iteration(md, fits[0].cost_model(), algorithm="lpt")
        for p in plan.phases:
            f = fits[0].features(p)
            y = f @ true[p.phase] * (1 + 0.05 * rng.standard_normal(R))
            for k, fit in enumerate(fits):
                fit.observe(it, p.phase, f.copy(), y * (1 + 1e-13) if k == 2 else y.copy())
        b = rng.uniform(1e4, 1e6, 3)
        s = 1e-4 + b * 2e-9 * (1 + 0.05 * rng.standard_normal(3))
        for k, x in enumerate(xfits):
            x.observe(it, b, s * (1 + 1e-13) if k == 2 else s)
    assert all(f.ready for f in fits) and all(x.ready for x in xfits)
    for phase in fits[0].phases:
        got = [f.coefficients(phase).tobytes() for f in fits]
        assert got[0] == got[1] == got[2]
    assert xfits[0].cost() == xfits[1].cost() == xfits[2].cost()
    digests = {
        plan_iteration(md, f.cost_model(), exchange=x.cost(), algorithm="lpt").digest
        for f, x in zip(fits, xfits)
    }
    assert len(digests) == 1


def test_state_dict_round_trip_continues_exactly():
    cfg = FitConfig(window=10, warmup=3)
    rng = np.random.default_rng(4)
    a = OnlineCostFit(FLOPS, cfg)
    xa = ExchangeFit(ExchangeCost(1e-4, 1e-9, PAYLOAD), cfg)
    _observe(a, rng, 12, TRUE)
    xa.observe(1, [1e5, 2e5], [3e-4, 5e-4])
    b = OnlineCostFit(FLOPS, cfg)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    xb = ExchangeFit(ExchangeCost(1e-4, 1e-9, PAYLOAD), cfg)
    xb.load_state_dict(pickle.loads(pickle.dumps(xa.state_dict())))
    for it in range(13, 20):
        items = _synthetic_items(rng, 8)
        f = rank_features(items, items.owner, 8)
        y = f @ TRUE * (1 + 0.02 * rng.standard_normal(8))
        nb, sec = rng.uniform(1e4, 1e6, 2), rng.uniform(1e-4, 1e-3, 2)
        for fit, x in ((a, xa), (b, xb)):
            fit.observe(it, "vision", f, y)
            x.observe(it, nb, sec)
        assert a.coefficients("vision").tobytes() == b.coefficients("vision").tobytes()
        assert a.describe() == b.describe() and xa.cost() == xb.cost()
    assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="cost fit: cannot restore its state"):
        OnlineCostFit(CostModel({"llm": FLOPS["llm"]}), cfg).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="vision fit: cannot restore"):
        broken = a.state_dict()
        broken["phases"]["vision"]["num_features"] = 3
        OnlineCostFit(FLOPS, cfg).load_state_dict(broken)


def test_pickled_fits_continue_exactly_as_the_planning_worker_gets_them():
    # The fits go to the planning worker and come back pickled every iteration (plan_job),
    # as a packed window: empty, partial (phases without rows) and over a full window.
    cfg = FitConfig(window=6, warmup=3)
    rng = np.random.default_rng(5)
    a = OnlineCostFit(FLOPS, cfg)
    xa = ExchangeFit(ExchangeCost(1e-4, 1e-9, PAYLOAD), cfg)
    b, xb = pickle.loads(pickle.dumps((a, xa)))
    for it in range(1, 15):
        items = _synthetic_items(rng, 8)
        f = rank_features(items, items.owner, 8)
        if it % 4 == 0:
            f[:3] = 0  # ranks without vision items this iteration: rows the window drops
        y = f @ TRUE * (1 + 0.02 * rng.standard_normal(8))
        nb, sec = rng.uniform(1e4, 1e6, 2), rng.uniform(1e-4, 1e-3, 2)
        for fit, x in ((a, xa), (b, xb)):
            fit.observe(it, "vision", f, y)
            x.observe(it, nb, sec)
        b, xb = pickle.loads(pickle.dumps((b, xb), protocol=5))
        ca, cb = a.coefficients("vision"), b.coefficients("vision")
        assert (ca is None) == (it < 3) and (cb is None) == (it < 3)
        assert ca is None or ca.tobytes() == cb.tobytes()
        assert a.state_dict() == b.state_dict() and xa.state_dict() == xb.state_dict()
        assert a.describe() == b.describe() and xa.cost() == xb.cost()


def test_sealed_feedback_travels_as_it_came_and_each_change_travels_too():
    # The step's CostFeedback goes to the planning worker and back every iteration without
    # being opened on the step's side: a copy that nobody changed pickles to what it arrived
    # as, and one that observed more carries its new observation on its next trip.
    rng = np.random.default_rng(11)
    here = CostFeedback(FLOPS, ExchangeCost(1e-3, 1e-9, PAYLOAD), FitConfig(window=8, warmup=2))
    travelling = pickle.loads(pickle.dumps(here))
    phases = len(here.phases)
    for it in range(1, 10):
        items = _synthetic_items(rng, R)
        features = {p: rank_features(items, items.owner, R) for p in here.phases}
        gathered = [
            np.array([it, *rng.integers(10**6, 10**7, phases), round(3e5 + 1e4 * r), -1, -1])
            for r in range(R)
        ]
        for fb in (here, travelling):  # the worker's side: observe, then send back
            fb.observe(Measured(it, {}, {}, features, {HOPS[0]: 1e5 * it}), gathered)
        back = pickle.loads(pickle.dumps(travelling))
        # The step's side: adopt, carry, send again (never opened): the same bytes travel.
        step = CostFeedback(FLOPS, ExchangeCost(1e-3, 1e-9, PAYLOAD), FitConfig(window=8))
        step.adopt(back)
        assert pickle.dumps(step) == pickle.dumps(back)
        travelling = pickle.loads(pickle.dumps(step))
        assert travelling.state_dict() == here.state_dict()
        assert travelling.describe() == here.describe() and travelling.exchanged_at == it
        assert travelling.models(it)[0] == here.models(it)[0]


def test_bad_observations_and_settings_name_what_is_wrong():
    fit = OnlineCostFit(FLOPS, FitConfig(warmup=2))
    f = np.ones((R, len(FEATURES)))
    with pytest.raises(ValueError, match="no phase 'video'"):
        fit.observe(1, "video", f, np.ones(R))
    with pytest.raises(ValueError, match=r"vision fit: expected features"):
        fit.observe(1, "vision", f, np.ones(R + 1))
    with pytest.raises(ValueError, match="audio fit: seconds of iteration 1 must be finite"):
        fit.observe(1, "audio", f, np.array([1.0, np.nan, 1.0, 1.0]))
    fit.observe(5, "llm", f, np.ones(R))
    with pytest.raises(ValueError, match="llm fit: iteration 4 observed after iteration 5"):
        fit.observe(4, "llm", f, np.ones(R))
    with pytest.raises(ValueError, match="cost fit: max_step must be finite and > 1"):
        FitConfig(max_step=1.0)
    with pytest.raises(ValueError, match=r"warmup \(9\) must not exceed window \(8\)"):
        FitConfig(window=8, warmup=9)
    with pytest.raises(ValueError, match="all-to-all fit: 2 byte counts for 1 exchange times"):
        ExchangeFit(ExchangeCost(1e-4, 1e-9, PAYLOAD)).observe(1, [1, 2], [1.0])


def test_exchange_fit_recovers_latency_and_bandwidth():
    rng = np.random.default_rng(5)
    fit = ExchangeFit(ExchangeCost(1e-3, 1e-8, PAYLOAD), FitConfig(window=32, warmup=4))
    assert fit.cost().latency_s == 1e-3 and fit.describe() == "exchange fit: warm-up 0/4"
    for it in range(1, 33):
        b = rng.uniform(0, 4e6, 4)
        s = (2.5e-4 + b / 1.25e9) * (1 + 0.02 * rng.standard_normal(4))
        if it == 7:
            s[0] *= 5  # one stalled exchange
        fit.observe(it, b, s)
    cost = fit.cost()
    assert cost.latency_s == pytest.approx(2.5e-4, rel=0.05)
    assert cost.bandwidth == pytest.approx(1.25e9, rel=0.02)
    assert cost.payload is PAYLOAD
    assert fit.describe().startswith("exchange fit: all-to-all 2")


def test_an_exchange_costs_the_mean_ranks_blocked_time_not_the_shortest():
    # Every rank's time in one hop: the transfer plus the wait for the slowest peer. On a host
    # whose ranks drift apart every synchronisation point collects that wait, so the exchange
    # check prices a hop at what the mean rank spends blocked in it, not at the shortest rank's
    # time (the transfer alone), which priced hops at a quarter of what moving cost the CPU step.
    fb = CostFeedback(FLOPS, ExchangeCost(1e-3, 1e-9, PAYLOAD), FitConfig(window=16, warmup=4))
    phases = len(fb.phases)
    hop = HOPS[0]
    for it in range(1, 17):
        nbytes = 1e5 * (1 + it % 3)
        transfer = 2e-4 + nbytes / 1e9
        waits = np.array([0.0, 1e-3, 2e-3, 3e-3])  # the mean rank waits 1.5 ms
        gathered = [
            np.array([it, *([0] * phases), round((transfer + w) * 1e9), -1, -1], np.int64)
            for w in waits
        ]
        fb.observe(Measured(it, {}, {}, {}, {hop: nbytes}), gathered)
    cost = fb.exchanges.cost()
    assert cost.latency_s == pytest.approx(2e-4 + 1.5e-3, rel=0.02)
    assert cost.bandwidth == pytest.approx(1e9, rel=0.05)
    assert fb.exchanged_at == 16


def test_one_plan_in_every_remeasure_period_skips_the_exchange_check():
    fb = CostFeedback(FLOPS, ExchangeCost(1e-3, 1e-9, PAYLOAD), FitConfig(window=8, warmup=1))
    for phase in fb.phases:  # fitted: the check applies
        fb.costs.observe(1, phase, np.ones((R, 5)), np.full(R, 1e-2))
    assert fb.costs.ready
    fb.exchanged_at = 100
    skipped = [i for i in range(101, 100 + 3 * REMEASURE_EVERY + 2) if fb.models(i)[1] is None]
    # One plan per period: the one after it was made before the first one's exchanges arrive.
    assert skipped == [100 + k * REMEASURE_EVERY for k in (1, 2, 3)]
    fb.exchanged_at = -1  # nothing measured yet: the periods count from iteration 0
    assert fb.models(REMEASURE_EVERY)[1] is None and fb.models(REMEASURE_EVERY - 1)[1] is not None


# --------------------------------------------------------------------------------------------
# auto never loses: the gain-versus-exchange check


def _text_only(dp: int = R, per_rank: int = 4):
    rng = np.random.default_rng(6)
    return [
        [(r * per_rank + k, SampleMeta(f"t{r}.{k}", int(rng.integers(8, 400))))
         for k in range(per_rank)]
        for r in range(dp)
    ]  # fmt: skip


def test_a_phase_keeps_the_ordinary_assignment_exactly_when_moving_costs_more():
    """Text only (so the LLM phase is the only one that can move): balanced when its gain is
    above latency x margin, kept (nothing moves, the collective can be skipped) when below."""
    md, sm = _text_only(), _seconds_model()
    base = plan_iteration(md, sm, algorithm="lpt")
    llm = base.phase("llm")
    assert llm.gain > 0 and llm.dispatch.moved_items > 0 and llm.decision == "balanced"
    assert all(p.exchange_cost is None for p in base.phases) and base.describe_decisions() == ""
    g = llm.gain
    cases = ((g / 1.01, 1.0, "balanced"), (g * 1.01, 1.0, "kept"), (g / 1.5, 2.0, "kept"))
    for latency, margin, want in cases:
        ex = ExchangeCost(latency, 0.0, PAYLOAD, margin=margin)
        plan = plan_iteration(md, sm, algorithm="lpt", exchange=ex)
        p = plan.phase("llm")
        assert p.decision == want and p.exchange_cost == pytest.approx(latency, rel=1e-12)
        assert p.gain == g
        if want == "balanced":
            np.testing.assert_array_equal(p.dispatch.dst, llm.dispatch.dst)
            np.testing.assert_array_equal(p.loads_after, llm.loads_after)
        else:
            assert p.dispatch.moves_nothing and not llm.dispatch.moves_nothing
            np.testing.assert_array_equal(p.dispatch.dst, p.items.owner)
            np.testing.assert_array_equal(p.loads_after, p.loads_before)
        assert f"llm {want} (gain " in plan.describe_decisions()


SPB = 1e-9
"""Seconds per byte of the exchanges below (1 GB/s)."""

HEAVY_VISION = PayloadBytes(
    inputs={"vision": 600.0, "audio": 16.0, "llm": 8.0}, outputs={"vision": 16.0, "audio": 16.0}
)
"""Payload sizes under which, at some latencies, vision does not pay and audio does."""


def _combination_total(md, sm, latency, balanced=(), exchange=None, spb=SPB):
    """Predicted step of one combination, planned and priced on its own: every phase's max
    load, plus each exchange that moves something (encoder outputs forward and backward)."""
    if exchange is None:
        plan = plan_iteration(md, sm, algorithm="lpt", phases=balanced)
    else:
        plan = plan_iteration(md, sm, algorithm="lpt", exchange=exchange)
    total = sum(float(p.loads_after.max()) for p in plan.phases)
    # The step's three packed hops: a latency each when anything in them moves.
    first = sum(route_bytes(p.dispatch, HEAVY_VISION.inputs[p.phase]) for p in plan.phases)
    second = sum(route_bytes(r, HEAVY_VISION.outputs[e]) for e, r in plan.to_llm.items())
    total += (latency + spb * first) if first else 0.0
    total += 2 * (latency + spb * second) if second else 0.0
    return total, plan


def test_auto_picks_the_cheapest_combination_of_balanced_and_kept_phases():
    """Against all 8 combinations of the three phases planned separately: the check's plan
    is the cheapest (so never worse than not balancing), its routes are that combination's,
    and it depends on the exchange's price: free exchanges balance all, dear ones keep all, and
    a slow network keeps only the heavy vision payload home."""
    md, sm = _metadata(), _seconds_model()
    phases = ("vision", "audio", "llm")
    seen = set()
    for latency, spb in ((0.0, SPB), (2e-5, SPB), (1e-1, SPB), (0.0, 3 * SPB), (0.0, 30 * SPB)):
        combos = {
            bal: _combination_total(md, sm, latency, bal, spb=spb)[0]
            for k in range(4)
            for bal in itertools.combinations(phases, k)
        }
        ex = ExchangeCost(latency, spb, HEAVY_VISION)
        got, plan = _combination_total(md, sm, latency, exchange=ex, spb=spb)
        best = min(combos.values())
        assert got == pytest.approx(best, rel=1e-12)
        assert got <= combos[()] * (1 + 1e-12)
        chosen = tuple(p.phase for p in plan.phases if p.decision == "balanced")
        assert combos[chosen] == pytest.approx(best, rel=1e-12)
        for p in plan.phases:
            if p.decision == "kept":
                np.testing.assert_array_equal(p.dispatch.dst, p.items.owner)
            else:
                assert p.gain > p.exchange_cost
        seen.add(chosen)
    assert seen == {("vision", "audio", "llm"), ("audio", "llm"), ()}, seen


def test_the_check_needs_seconds_and_sizes_and_its_decisions_are_in_the_digest():
    md, sm = _metadata(), _seconds_model()
    with pytest.raises(PlanError, match="compares seconds, but the costs are in flops"):
        plan_iteration(md, FLOPS, exchange=ExchangeCost(0.0, 0.0, PAYLOAD))
    with pytest.raises(PlanError, match=r"payload bytes outputs\['audio'\]"):
        sizes = PayloadBytes(inputs=PAYLOAD.inputs, outputs={"vision": 1.0})
        plan_iteration(md, sm, exchange=ExchangeCost(0.0, 0.0, sizes))
    none = plan_iteration(md, sm, algorithm="lpt")
    free = plan_iteration(md, sm, algorithm="lpt", exchange=ExchangeCost(0.0, 0.0, PAYLOAD))
    dear = plan_iteration(md, sm, algorithm="lpt", exchange=ExchangeCost(1.0, 0.0, PAYLOAD))
    for a, b in zip(none.phases, free.phases):
        np.testing.assert_array_equal(a.dispatch.dst, b.dispatch.dst)
        assert b.decision == ("balanced" if b.gain > 0 else "kept")
    assert all(p.decision == "kept" for p in dear.phases)
    assert all(r.moves_nothing for r in dear.to_llm.values())
    assert len({none.digest, free.digest, dear.digest}) == 3
    # The per-call cost is part of the planned loads (once per rank holding anything).
    flat = plan_iteration(md, _seconds_model(per_call=0.0), algorithm="lpt")
    for a, b in zip(flat.phases, none.phases):
        held = np.bincount(a.dispatch.dst, minlength=R) > 0
        np.testing.assert_allclose(b.loads_after, a.loads_after + 2e-4 * held, rtol=1e-12)
    assert COEFFICIENTS[0] == "per_call"


def test_when_no_balance_could_pay_for_one_latency_the_balancer_does_not_run():
    # Even a perfect balance of every phase gains less than one hop's latency: every phase
    # keeps its ordinary assignment without running the balancer (the plan costs ~nothing),
    # which is what pricing every combination would have chosen.
    md, sm = _metadata(), _seconds_model()
    bound = sum(
        float(p.loads_before.max())
        - max(float(p.costs.sum()) / R, float(p.costs.max()))
        - sm[p.phase].per_call
        for p in plan_iteration(md, sm, algorithm="lpt").phases
    )
    dear = plan_iteration(md, sm, algorithm="auto", exchange=ExchangeCost(2 * bound, SPB, PAYLOAD))
    assert all(p.decision == "kept" and p.algorithm == "ordinary" for p in dear.phases)
    for p in dear.phases:
        np.testing.assert_array_equal(p.dispatch.dst, p.items.owner)
    # The log line says why: each phase's share of the bound against the latency.
    assert sum(p.gain for p in dear.phases) == pytest.approx(bound)
    for p in dear.phases:
        assert f"{p.phase} kept (gain at most {format_seconds(p.gain)} <= cost " \
               f"{format_seconds(2 * bound)})" in dear.describe_decisions()  # fmt: skip
    cheap = plan_iteration(md, sm, algorithm="auto", exchange=ExchangeCost(bound / 4, 0.0, PAYLOAD))
    assert any(p.algorithm != "ordinary" for p in cheap.phases)

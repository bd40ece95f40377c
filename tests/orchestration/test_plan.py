# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Tests of the plans: gathered metadata, per-phase plans, exchanges, whole-sample mode,
microbatches and the balance report tool.

Exchanges are checked by simulating the all-to-all in plain Python: every rank packs its send
buffer with the plan's indices and counts, the buffers are split and delivered, and receivers
place what arrives with the plan's receive indices.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron.mllm.cli.balance_report import main as balance_report_main
from orchestration.balance import InfeasibleCapError, balance
from orchestration.cost_model import CostModel
from orchestration.metadata import (
    GatheredMetadata,
    PlanError,
    check_digests,
    decode_strings,
    encode_rank_metadata,
    encode_strings,
    phase_items,
    sample_encoder_tokens,
)
from orchestration.microbatches import _fill_empty, form_microbatches
from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.phase_plan import plan_iteration
from orchestration.routing import Route, row_index
from orchestration.sample_plan import plan_whole_samples
from orchestration.workload import Item, SampleMeta, WorkloadError
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec


def _shape() -> ModelShape:
    enc = lambda d: TransformerShape(  # noqa: E731
        2, 64, 256, 4, input_flops_per_token=2.0 * d * 64, output_flops_per_token=2.0 * 64 * 64
    )
    llm = TransformerShape(4, 64, 256, 4, causal=True, output_flops_per_token=2.0 * 64 * 512)
    return ModelShape(llm=llm, encoders={"vision": enc(48), "audio": enc(32)})


COST = CostModel.build(_shape())

item_st = st.builds(
    lambda units, llm: Item(units=tuple(units), llm_tokens=llm),
    st.lists(st.integers(1, 64), min_size=1, max_size=3),
    st.integers(1, 32),
)
sample_st = st.builds(
    lambda text, image, audio, video: (text, tuple(image), tuple(audio), tuple(video)),
    st.integers(0, 60),
    st.lists(item_st, max_size=3),
    st.lists(item_st, max_size=2),
    st.lists(item_st, max_size=1),
)


@st.composite
def rank_samples_st(draw, max_ranks: int = 4, max_per_rank: int = 4):
    ranks = draw(st.integers(1, max_ranks))
    out, index = [], 0
    for _ in range(ranks):
        samples = []
        for _ in range(draw(st.integers(0, max_per_rank))):
            text, image, audio, video = draw(sample_st)
            meta = SampleMeta(f"s{index}", text, image=image, audio=audio, video=video)
            samples.append((index, meta))
            index += 1
        out.append(samples)
    return out


def _generated(dp: int, per_rank: int, spec: str = "omni-three-modality", scale: float = 1 / 32):
    gen = WorkloadGenerator(WorkloadSpec.load(spec), seed=0, token_scale=scale)
    samples = gen.samples(dp * per_rank)
    return [
        [(r * per_rank + k, samples[r * per_rank + k]) for k in range(per_rank)] for r in range(dp)
    ]


# --------------------------------------------------------------------------------------------
# All-to-all simulation


def all_to_all(ex: Route, src_lists: list[list]) -> list[list]:
    """Deliver every rank's list through ``ex``; checks counts on both sides."""
    R = ex.num_ranks
    chunks = [[[] for _ in range(R)] for _ in range(R)]
    for r in range(R):
        assert len(src_lists[r]) == ex.num_src_items(r)
        buf = [src_lists[r][i] for i in ex.send_index(r)]
        counts = ex.send_counts(r)
        assert counts.sum() == len(buf)
        starts = np.r_[0, np.cumsum(counts)]
        for dst in range(R):
            chunks[r][dst] = buf[starts[dst] : starts[dst + 1]]
    out = []
    for r in range(R):
        recv = ex.recv_counts(r)
        buf = []
        for src in range(R):
            assert len(chunks[src][r]) == recv[src]
            buf += chunks[src][r]
        placed = [None] * ex.num_dst_items(r)
        for k, pos in enumerate(ex.recv_index(r)):
            assert placed[pos] is None
            placed[pos] = buf[k]
        assert all(p is not None for p in placed) or not placed
        out.append(placed)
    return out


def _src_lists(items, R):
    """Each rank's local list of global item ids, in its source order."""
    lists = [[] for _ in range(R)]
    for i in np.argsort(items.src_pos, kind="stable"):
        lists[items.owner[i]].append(int(i))
    return lists


# --------------------------------------------------------------------------------------------
# Gathered metadata


@settings(max_examples=30, deadline=None)
@given(rank_samples_st())
def test_metadata_round_trip(ranks):
    md = GatheredMetadata.from_rank_samples(ranks)
    flat = [s for samples in ranks for s in samples]
    assert md.num_ranks == len(ranks) and md.num_samples == len(flat)
    assert md.sample_stream.tolist() == [i for i, _ in flat]
    assert md.sample_llm.tolist() == [m.llm_tokens for _, m in flat]
    for phase in ("vision", "audio"):
        items = phase_items(md, phase)
        expected = [u for _, m in flat for u in m.encoder_units(phase)]
        assert items.tokens.tolist() == expected
        for s in range(md.num_samples):
            mine = items.unit_in_sample[items.sample == s]
            assert mine.tolist() == list(range(mine.size))
    llm = phase_items(md, "llm")
    assert llm.owner.tolist() == [r for r, samples in enumerate(ranks) for _ in samples]


def test_malformed_metadata_is_a_clear_error():
    good = encode_rank_metadata([(0, SampleMeta("a", 5, image=(Item((4,), 2),)))])
    with pytest.raises(PlanError, match="DP rank 1: bad header"):
        GatheredMetadata.from_flat([good, np.array([99, 0, 0, 0])])
    with pytest.raises(PlanError, match="DP rank 0: 10 ints do not match 1 samples"):
        GatheredMetadata.from_flat([good[:-1]])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=8), st.lists(st.integers(-5, 5), max_size=3))
def test_sample_ids_ride_on_the_metadata_words_exactly(ids, after):
    # Any ids (empty, non-ASCII, NUL inside) come back as they were, and the decoder says where
    # its words end, so more words may follow them.
    words = np.concatenate([encode_strings(ids), np.array(after, dtype=np.int64)])
    got, end = decode_strings(words)
    assert got == ids
    assert words[end:].tolist() == after


# --------------------------------------------------------------------------------------------
# Per-phase plans


@settings(max_examples=25, deadline=None)
@given(rank_samples_st(), st.sampled_from(["auto", "lpt", "kk", "none"]))
def test_plans_are_identical_across_simulated_ranks(ranks, algorithm):
    # Each simulated rank rebuilds the metadata from its own copy of what the all-gather
    # delivered (deep copies, JSON round trips, other integer widths): identical plans.
    plans = [plan_iteration(copy.deepcopy(ranks), COST, algorithm=algorithm)]
    via_json = [
        [(i, SampleMeta.from_json(json.loads(json.dumps(m.to_json())), "x")) for i, m in r]
        for r in ranks
    ]
    plans.append(plan_iteration(via_json, COST, algorithm=algorithm))
    flat = [encode_rank_metadata(r).astype(np.int32) for r in ranks]
    plans.append(plan_iteration(GatheredMetadata.from_flat(flat), COST, algorithm=algorithm))
    check_digests([p.digest for p in plans])
    for p in plans[1:]:
        for a, b in zip(plans[0].phases, p.phases):
            np.testing.assert_array_equal(a.dispatch.dst, b.dispatch.dst)
            np.testing.assert_array_equal(a.dispatch.dst_pos, b.dispatch.dst_pos)


@settings(max_examples=25, deadline=None)
@given(rank_samples_st())
def test_every_item_assigned_once_and_routing_restores_order(ranks):
    plan = plan_iteration(ranks, COST)
    R = plan.num_ranks
    llm = plan.phase("llm")
    llm_lists = all_to_all(llm.dispatch, _src_lists(llm.items, R))
    for p in plan.phases:
        items, ex = p.items, p.dispatch
        assert ex.size == items.size
        src = _src_lists(items, R)
        dst = all_to_all(ex, src)
        # Every item arrives exactly once, at the rank the plan names, in canonical order.
        assert sorted(i for lst in dst for i in lst) == list(range(items.size))
        for r in range(R):
            assert dst[r] == sorted(dst[r])
            assert all(ex.dst[i] == r for i in dst[r])
        # The transposed exchange brings everything back to its original place.
        assert all_to_all(ex.transpose(), dst) == src
        np.testing.assert_allclose(p.loads_after, np.bincount(ex.dst, weights=p.costs, minlength=R))
        if p.phase == "llm":
            continue
        # Encoder outputs reach the LLM-phase rank of their sample, grouped per sample in the
        # LLM rank's sample order, units in order.
        at_llm = all_to_all(plan.to_llm[p.phase], dst)
        for r in range(R):
            expected = [u for s in llm_lists[r] for u in np.flatnonzero(items.sample == s)]
            assert at_llm[r] == expected
        assert all_to_all(plan.to_llm[p.phase].transpose(), at_llm) == dst


def test_counts_and_rows_agree_with_matrices():
    plan = plan_iteration(_generated(4, 6), COST)
    for p in plan.phases:
        ex = p.dispatch
        m, rows = ex.counts_matrix(), ex.rows_matrix()
        for r in range(4):
            assert m[r].tolist() == ex.send_counts(r).tolist()
            assert m[:, r].tolist() == ex.recv_counts(r).tolist()
            assert rows[r].tolist() == ex.send_rows(r).tolist()
            assert rows[:, r].tolist() == ex.recv_rows(r).tolist()
        assert m.sum() == ex.size and (m.sum() - np.trace(m)) == ex.moved_items


def test_row_index_packs_variable_length_items():
    rows = np.array([3, 1, 2])
    payload = np.array([10, 11, 12, 20, 30, 31])  # item 0: 10-12, item 1: 20, item 2: 30-31
    assert payload[row_index(np.array([2, 0]), rows)].tolist() == [30, 31, 10, 11, 12]
    assert row_index(np.array([], dtype=np.int64), rows).size == 0


def test_zero_items_of_a_modality_still_give_every_rank_an_exchange():
    ranks = [[(0, SampleMeta("t0", 30))], [(1, SampleMeta("t1", 300)), (2, SampleMeta("t2", 5))]]
    plan = plan_iteration(ranks, COST)
    for phase in ("vision", "audio"):
        p = plan.phase(phase)
        assert p.items.size == 0 and p.dispatch.size == 0
        for r in range(2):
            assert p.dispatch.send_counts(r).tolist() == [0, 0]
            assert p.dispatch.recv_counts(r).tolist() == [0, 0]
            assert p.dispatch.send_index(r).size == 0
        assert plan.to_llm[phase].size == 0
    assert plan.phase("llm").dispatch.size == 3


def test_balancing_improves_every_phase_of_a_real_batch():
    plan = plan_iteration(_generated(8, 8), COST)
    for p in plan.phases:
        assert p.imbalance_after <= p.imbalance_before + 1e-12
        assert p.loads_after.max() >= p.lower_bound * (1 - 1e-9)
    assert plan.phase("llm").imbalance_after < plan.phase("llm").imbalance_before


def test_digest_changes_with_the_metadata_and_mismatch_is_reported():
    ranks = _generated(2, 4)
    a = plan_iteration(ranks, COST)
    changed = copy.deepcopy(ranks)
    idx, meta = changed[1][2]
    changed[1][2] = (idx, SampleMeta(meta.sample_id, meta.text_tokens + 1, meta.image, meta.audio))
    b = plan_iteration(changed, COST)
    assert a.metadata_digest != b.metadata_digest and a.digest != b.digest
    with pytest.raises(PlanError, match=r"ranks \[1\]"):
        check_digests([a.digest, b.digest])
    check_digests([a.digest, a.digest, a.digest])


def test_cap_too_small_names_the_sample():
    unit = SampleMeta("big-photo", 3, image=(Item((500,), 10),))
    ranks = [[(0, SampleMeta("a", 3, image=(Item((20,), 5),)))], [(1, unit)]]
    with pytest.raises(InfeasibleCapError, match="vision unit 0 of sample 'big-photo'"):
        plan_iteration(ranks, COST, caps={"vision": 100})
    plan = plan_iteration(ranks, COST, caps={"vision": 600})
    assert plan.phase("vision").dispatch.size == 2


def test_data_with_a_phase_the_model_lacks_is_a_clear_error():
    text_only = CostModel.build(ModelShape(llm=_shape().llm))
    with pytest.raises(WorkloadError, match=r"has (image|audio) items but the model has no"):
        plan_iteration(_generated(2, 4), text_only)
    with pytest.raises(
        WorkloadError, match=r"'omni-three-modality-0-0' \(DP rank 0, .*-num-layers"
    ):
        plan_whole_samples(_generated(2, 4), text_only)


def test_padded_phase_uses_the_exact_padded_algorithm():
    padded = CostModel.build(_shape(), padded={"audio": None})
    plan = plan_iteration(_generated(4, 8), padded)
    audio = plan.phase("audio")
    assert audio.algorithm in ("padded-exact", "ordinary")
    assert audio.loads_after.max() <= audio.loads_before.max() + 1e-6


# --------------------------------------------------------------------------------------------
# Whole-sample mode (PP > 1)


@settings(max_examples=20, deadline=None)
@given(rank_samples_st())
def test_whole_sample_plan(ranks):
    plan = plan_whole_samples(ranks, COST)
    again = plan_whole_samples(copy.deepcopy(ranks), COST)
    assert plan.digest == again.digest
    items, ex = plan.items, plan.dispatch
    src = _src_lists(items, plan.num_groups)
    dst = all_to_all(ex, src)
    assert sorted(i for lst in dst for i in lst) == list(range(items.size))
    assert all_to_all(ex.transpose(), dst) == src
    assert plan.loads_after.max() <= plan.loads_before.max() + 1e-6
    total = sum(plan.phase_loads(p) for p in plan.phase_costs)
    np.testing.assert_allclose(total, plan.loads_after, rtol=1e-9, atol=1e-6)


def test_whole_sample_plan_with_a_static_stage_layout():
    ranks = _generated(4, 8)
    shares = {"vision": [1.0, 0.0], "audio": [1.0, 0.0], "llm": [0.5, 0.5]}
    plan = plan_whole_samples(ranks, COST, stage_shares=shares)
    assert plan.algorithm in ("vector-lpt", "ordinary")
    assert plan.loads_after.max() <= plan.loads_before.max() + 1e-6
    with pytest.raises(PlanError, match="same number of stages"):
        plan_whole_samples(
            ranks, COST, stage_shares={"vision": [1.0], "audio": [1.0, 0], "llm": [1.0]}
        )


def _group_tokens(plan, md) -> dict[str, np.ndarray]:
    """Per phase, each group's summed tokens under ``plan``."""
    tokens = {p: sample_encoder_tokens(md, p) for p in ("vision", "audio")}
    tokens["llm"] = md.sample_llm
    return {
        p: np.bincount(plan.dispatch.dst, weights=t, minlength=plan.num_groups)
        for p, t in tokens.items()
    }


@pytest.mark.parametrize("shares", [None, {"vision": [1, 0], "audio": [1, 0], "llm": [0.5, 0.5]}])
def test_whole_sample_plans_honour_every_phase_cap(shares):
    # PP > 1: the caps of --post-balance-token-caps bound each DP group's batch in every phase.
    ranks = _generated(4, 8)
    md = GatheredMetadata.from_rank_samples(ranks)
    free = _group_tokens(plan_whole_samples(ranks, COST, stage_shares=shares), md)
    # Below what the uncapped plan gives the fullest group, in two phases at once.
    caps = {"audio": int(free["audio"].max()) - 1, "llm": int(free["llm"].max()) - 5}
    plan = plan_whole_samples(ranks, COST, caps=caps, stage_shares=shares)
    got = _group_tokens(plan, md)
    for phase, cap in caps.items():
        assert got[phase].max() <= cap < free[phase].max(), phase


def test_whole_sample_caps_that_cannot_be_met_name_the_phase_and_the_sizes():
    ranks = _generated(4, 8)
    md = GatheredMetadata.from_rank_samples(ranks)
    vision = sample_encoder_tokens(md, "vision")
    big = int(np.argmax(vision))
    with pytest.raises(InfeasibleCapError) as e:
        plan_whole_samples(ranks, COST, caps={"vision": int(vision[big]) - 1, "llm": 10**6})
    assert e.value.phase == "vision" and e.value.cap == vision[big] - 1
    assert str(e.value).startswith(
        f"{md.sample_label(big)} has vision tokens {vision[big]}, more than the per-bin cap "
        f"{vision[big] - 1}"
    )
    total = int(md.sample_llm.sum())
    with pytest.raises(InfeasibleCapError, match=f"total llm tokens {total} exceeds 4 bins") as e:
        plan_whole_samples(ranks, COST, caps={"llm": total // 4 - 1})
    assert e.value.phase == "llm"


# --------------------------------------------------------------------------------------------
# Microbatches


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 100), min_size=1, max_size=16),
    st.integers(1, 6),
    st.one_of(st.none(), st.integers(100, 300)),
)
def test_microbatches(tokens, wanted, limit):
    tokens = np.array(tokens)
    costs = tokens + tokens**2 / 50.0
    mb = form_microbatches(costs, tokens, wanted, limit)
    again = form_microbatches(costs, tokens, wanted, limit)
    assert mb.microbatches == again.microbatches
    flat = sorted(i for m in mb.microbatches for i in m)
    assert flat == list(range(tokens.size))
    assert all(len(m) > 0 for m in mb.microbatches)
    assert mb.num_microbatches >= min(wanted, tokens.size)
    if limit is not None:
        assert mb.tokens.max() <= limit
        assert mb.num_microbatches >= -(-int(tokens.sum()) // limit)


def test_one_microbatch_is_the_balancers_answer_for_one_bin():
    # One microbatch per rank (micro batch = the rank's samples) skips the balancer; its answer
    # must be the balancer's for one bin, and bad costs must still be named by it.
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 30))
        costs, tokens = rng.random(n) * 1e3, rng.integers(1, 50, n)
        limit = None if rng.random() < 0.3 else int(tokens.sum()) + int(rng.integers(0, 9))
        mb = form_microbatches(costs, tokens, 1, limit)
        bins = balance(costs, 1, sizes=None if limit is None else tokens, cap=limit).bins
        assert mb.microbatches == (tuple(np.flatnonzero(bins == 0).tolist()),)
        assert mb.loads.tolist() == [float(costs[list(range(n))].sum())]
        assert mb.tokens.tolist() == [int(tokens.sum())] and mb.tokens.dtype == np.int64
    with pytest.raises(ValueError, match="costs must be finite"):
        form_microbatches(np.array([1.0, np.nan]), np.array([1, 2]), 1, None)


def test_one_sample_per_microbatch_is_the_balancers_answer_for_as_many_bins():
    # As many microbatches as samples (the 84B model's micro batch 1) also skips the balancer:
    # its answer, once every microbatch holds a sample, is one sample each, in sample order.
    rng = np.random.default_rng(4)
    for _ in range(50):
        n = int(rng.integers(2, 40))
        costs, tokens = rng.random(n) * 1e3, rng.integers(1, 50, n)
        limit = None if rng.random() < 0.3 else int(tokens.max()) + int(rng.integers(0, 9))
        wanted = n + int(rng.integers(0, 3))
        mb = form_microbatches(costs, tokens, wanted, limit)
        bins = _fill_empty(
            balance(costs, n, sizes=tokens if limit else None, cap=limit).bins, costs, n
        )
        groups = sorted((np.flatnonzero(bins == b).tolist() for b in range(n)), key=lambda g: g[0])
        assert mb.microbatches == tuple(tuple(g) for g in groups)
        assert mb.loads.tolist() == costs.tolist() and mb.tokens.tolist() == tokens.tolist()
        assert mb.tokens.dtype == np.int64 and mb.requested == wanted
    with pytest.raises(ValueError, match="costs must be finite"):
        form_microbatches(np.array([1.0, np.inf]), np.array([1, 2]), 2, None)


def test_microbatches_grow_when_the_limit_requires_and_name_a_too_long_sample():
    tokens = np.array([90, 90, 90, 90])
    mb = form_microbatches(tokens * 1.0, tokens, 1, 100)
    assert mb.num_microbatches == 4 and mb.requested == 1
    with pytest.raises(
        InfeasibleCapError, match="sample-b has 190 tokens, more than the packing limit 100"
    ):
        form_microbatches(np.ones(2), np.array([10, 190]), 1, 100, labels=["sample-a", "sample-b"])


# --------------------------------------------------------------------------------------------
# The tool


def test_balance_report_json(capsys):
    # In process: the tool is main() of its console script (a subprocess pays ~15 s of imports).
    argv = ["omni-three-modality", "--dp", "4", "--samples-per-rank", "4", "--ilp-seconds", "0.2",
            "--json"]  # fmt: skip
    code = balance_report_main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["dp"] == 4 and out["samples_per_rank"] == 4
    assert set(out["phases"]) == {"vision", "audio", "llm"}
    for phase in out["phases"].values():
        assert set(phase["algorithms"]) == {"none", "sample-lpt", "lpt", "kk", "kk+refine", "auto"}
        for row in phase["algorithms"].values():
            assert set(row) == {
                "max_over_mean_before",
                "max_over_mean_after",
                "ratio_to_lower_bound",
                "plan_ms",
                "moved_fraction",
            }
            assert row["ratio_to_lower_bound"] >= 1 - 1e-9
            assert 0 <= row["moved_fraction"] <= 1
        auto = phase["algorithms"]["auto"]
        assert (
            auto["max_over_mean_after"]
            <= phase["algorithms"]["none"]["max_over_mean_after"] + 1e-12
        )


def test_balance_report_bad_input_is_one_error_line(capsys):
    assert balance_report_main(["no-such-spec", "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error: workload spec not found")


def test_gathered_metadata_rebuilds_every_sample():
    gen = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=3, token_scale=0.03125)
    ranks = [[(k, gen.sample(k)) for k in range(r * 7, r * 7 + 7)] for r in range(3)]
    md = GatheredMetadata.from_rank_samples(ranks)
    flat = [meta for rank in ranks for _, meta in rank]
    for s, meta in enumerate(flat):
        rebuilt = md.sample_meta(s)
        assert rebuilt == SampleMeta(
            meta.sample_id, meta.text_tokens, meta.image, meta.audio, meta.video
        )

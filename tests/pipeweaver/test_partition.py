# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The modality-aware partitioner (DIP 3.1) and the online sub-microbatch cut (DIP 3.2).

Oracles: DIP's rule worked by hand on small calibrations (the arithmetic is in the comments),
brute force over every contiguous split, and the placement's own checks.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from orchestration.calibration import Calibration, LayerTimeModel
from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.packing import (
    balanced_contiguous_split,
    encoder_sub_groups,
    microbatch_indices,
    near_equal_sub_groups,
    sub_microbatch_count,
    sub_microbatch_groups,
)
from orchestration.workload import Item, SampleMeta
from orchestration.workload_spec import SampleStream
from pipeweaver.ir import ScheduleError
from pipeweaver.placement import Placement, split_layers
from pipeweaver.search.partition import (
    CalibratedCosts,
    EncoderLoad,
    FlopCosts,
    WorkloadShape,
    choose_sub_microbatch,
    chunks_rule,
    iteration_layer_costs,
    plan_partition,
    workload_shape,
)


def _splits(n: int, k: int):
    """Every cut of n elements into k non-empty contiguous groups."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield list(zip(bounds[:-1], bounds[1:]))


def _brute(weights, k):
    """(smallest largest sum, smallest sum of squares among those) over every split."""
    best = None
    for split in _splits(len(weights), k):
        sums = [sum(weights[a:b]) for a, b in split]
        key = (max(sums), sum(s * s for s in sums))
        best = key if best is None or key < best else best
    return best


def _key(weights, split):
    sums = [sum(weights[a:b]) for a, b in split]
    return max(sums), sum(s * s for s in sums)


def test_the_split_by_cost_equals_brute_force_over_every_contiguous_split():
    rng = random.Random(12)
    for _ in range(300):
        n = rng.randint(1, 8)
        k = rng.randint(1, n)
        weights = [rng.randint(0, 9) for _ in range(n)]
        split = balanced_contiguous_split(weights, k)
        # Contiguous, non-empty, covering every element once.
        assert [i for a, b in split for i in range(a, b)] == list(range(n))
        assert len(split) == k and all(b > a for a, b in split)
        assert _key(weights, split) == _brute(weights, k), (weights, k, split)


def test_equal_costs_split_as_the_even_layer_split():
    for n in range(1, 12):
        for k in range(1, n + 1):
            assert balanced_contiguous_split([3] * n, k) == split_layers(n, k)


def test_a_split_needs_as_many_elements_as_groups():
    with pytest.raises(ValueError, match="cannot cut 2 elements into 3"):
        balanced_contiguous_split([1, 1], 3)


def test_the_near_equal_sub_split_equals_brute_force():
    rng = random.Random(3)
    for _ in range(300):
        units = [rng.randint(1, 6) for _ in range(rng.randint(1, 7))]
        b = rng.randint(1, 12)
        items = [(u, 10 * u, u) for u in units]
        groups = near_equal_sub_groups(items, b)
        count = min(math.ceil(sum(units) / b), len(units))
        assert len(groups) == count
        assert [i for a, c in groups for i in range(a, c)] == list(range(len(units)))
        assert _key(units, groups) == _brute(units, count)


def test_the_online_cut_is_ceil_n_over_b_near_equal_subs():
    # 10 single-unit images, B = 4: ceil(10 / 4) = 3 subs, near-equal 4 + 3 + 3 (a token cap
    # of 4 units would give 4 + 4 + 2).
    items = [(1, 16, 4)] * 10
    assert sub_microbatch_count(10, 4) == 3
    assert near_equal_sub_groups(items, 4) == [(0, 4), (4, 7), (7, 10)]
    assert encoder_sub_groups(items, None, 4) == [(0, 4), (4, 7), (7, 10)]
    assert sub_microbatch_groups(items, 64) == [(0, 4), (4, 8), (8, 10)]
    assert encoder_sub_groups(items, 64, None) == [(0, 4), (4, 8), (8, 10)]
    # Items stay whole: a 5-tile image and three single ones, B = 2 -> ceil(8 / 2) = 4 subs.
    assert near_equal_sub_groups([(5, 5, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)], 2) == [
        (0, 1), (1, 2), (2, 3), (3, 4)
    ]  # fmt: skip
    assert near_equal_sub_groups([], 3) == []
    with pytest.raises(ValueError, match="at least 1 unit"):
        sub_microbatch_count(4, 0)


def _table(const, linear, **edges):
    return LayerTimeModel(const_s=const, linear_s=linear, quadratic_s=0.0, backward_ratio=1.0,
                          **edges)  # fmt: skip


def test_b_is_the_smallest_size_within_95_percent_of_the_best_throughput():
    # One vision layer on b units of 10 tokens: forward 2 ms + 1 ms per unit, backward the
    # same, so 2 (2 + b) ms and throughput b / (2 (2 + b)) units per ms, rising with b.
    # Over b = 1..10 the best is b = 10: 10 / 24 = 0.41667; 95% of it is 0.39583.
    # b = 7: 7 / 18 = 0.38889 < 0.39583; b = 8: 8 / 20 = 0.4 >= 0.39583 -> B = 8.
    costs = CalibratedCosts(Calibration("test", {"vision": _table(2e-3, 1e-4)}))
    choice = choose_sub_microbatch(costs, "vision", EncoderLoad(10, 1.0, 10))
    assert (choice.units, choice.best_units, choice.tried) == (8, 10, 10)
    assert choice.throughput == pytest.approx(0.4)
    assert choice.best_throughput == pytest.approx(10 / 24)
    # Keeping 99% needs b >= 9.5: B = 10; keeping 50%: 1 / 6 >= 0.20833? no; 2 / 8 = 0.25 -> 2.
    assert choose_sub_microbatch(costs, "vision", EncoderLoad(10, 1.0, 10), 0.99).units == 10
    assert choose_sub_microbatch(costs, "vision", EncoderLoad(10, 1.0, 10), 0.5).units == 2


def test_k_is_floor_of_t_over_the_fastest_t():
    # T: llm 40, audio 42, vision 130 -> llm is T_1; audio floor(42 / 40) = 1, vision
    # floor(130 / 40) = 3; an exact multiple (120 / 40 = 3) is 3, not 2.
    assert chunks_rule({"vision": 130.0, "audio": 42.0, "llm": 40.0}) == {
        "vision": 3, "audio": 1, "llm": 1
    }  # fmt: skip
    assert chunks_rule({"vision": 0.3, "llm": 0.1}) == {"vision": 3, "llm": 1}


def _calibration():
    return Calibration(
        "test",
        {
            # Per layer: 2 ms + 0.1 ms per token forward, backward the same; input 0.1 ms per
            # token forward (and backward), no head.
            "vision": _table(2e-3, 1e-4, input_s_per_token=1e-4, head_s_per_token=0.0),
            # Per layer: 1 ms + 0.1 ms per token forward, backward the same; head 0.2 ms per
            # token forward (and backward), no input cost.
            "llm": _table(1e-3, 1e-4, input_s_per_token=0.0, head_s_per_token=2e-4),
        },
    )


def test_the_partitioner_reproduces_dips_rule_on_a_hand_computed_model():
    workload = WorkloadShape({"vision": EncoderLoad(10, 1.0, 10)}, (100,))
    plan = plan_partition(
        {"vision": 12, "audio": 0, "llm": 4}, 2, CalibratedCosts(_calibration()), workload
    )
    # B_vision = 8 (the previous test's arithmetic): one layer on 8 units of 10 tokens costs
    # 2 (2 + 8) = 20 ms; the input layer on 80 tokens 2 x 8 = 16 ms.
    # T_vision = 12 x 20 + 16 = 256 ms.
    # LLM on one microbatch of 100 tokens: a layer 2 (1 + 10) = 22 ms, the head 2 x 20 = 40 ms.
    # T_llm = 4 x 22 + 40 = 128 ms = T_1 -> K_llm = 1, K_vision = floor(256 / 128) = 2.
    assert plan.sub_microbatch_units == {"vision": 8}
    assert plan.sub_microbatch_tokens("vision") == 80
    assert plan.latency == pytest.approx({"vision": 256.0, "llm": 128.0})
    assert plan.chunks_per_stage == {"vision": 2, "llm": 1}
    # Vision, 2 x 2 = 4 chunks over layer costs [36, 20 x 11]: a first chunk of 2 layers (56)
    # leaves 10 layers of 20 for 3 chunks (one of 4: 80); of 3 layers (76) leaves 9, 3 each
    # (60): the largest chunk is 76, and no split does better.
    assert plan.splits["vision"] == ((0, 3), (3, 6), (6, 9), (9, 12))
    assert plan.chunk_costs["vision"] == pytest.approx((76.0, 60.0, 60.0, 60.0))
    # LLM, 2 chunks over [22, 22, 22, 62]: by count [0, 2) [2, 4) costs 44 and 84; by cost
    # [0, 3) [3, 4) costs 66 and 62.
    assert plan.splits["llm"] == ((0, 3), (3, 4))
    placement = plan.placement()
    assert [placement.rank_of("vision", c) for c in range(4)] == [0, 1, 0, 1]
    assert placement.layer_range("llm", 1) == (3, 4) and placement.rank_of("llm", 1) == 1
    text = "\n".join(plan.explain())
    assert "B = 8 units" in text and "96.0%" in text and "floor(T / T_1) = 2" in text
    assert "llm layers by cost: [0,3) [3,4)" in text


def test_given_values_are_kept_and_k_is_capped_to_a_layer_per_chunk():
    workload = WorkloadShape({"vision": EncoderLoad(10, 1.0, 10)}, (100,))
    costs = CalibratedCosts(_calibration())
    layers = {"vision": 12, "llm": 4}
    # B given as 2: a vision layer 2 (2 + 2) = 8 ms, input 2 x 2 = 4 ms: T = 12 x 8 + 4 = 100,
    # below T_llm = 128: vision is T_1 (K 1) and llm floor(128 / 100) = 1.
    plan = plan_partition(layers, 2, costs, workload, sub_microbatch_units={"vision": 2})
    assert plan.sub_microbatch_units == {"vision": 2} and not plan.sub_choices
    assert plan.latency["vision"] == pytest.approx(100.0)
    assert plan.chunks_per_stage == {"vision": 1, "llm": 1}
    # Six ranks leave room for 12 // 6 = 2 vision chunks per rank at most (the rule asks 2),
    # and the LLM's 4 layers cannot span 6 ranks.
    with pytest.raises(ScheduleError, match="llm module has 4 layers, fewer than the 6"):
        plan_partition(layers, 6, costs, workload)
    # An LLM microbatch of 10 tokens: a layer 2 (1 + 1) = 4 ms, the head 2 x 2 = 4 ms, so
    # T_llm = 2 x 4 + 4 = 12; T_vision = 4 x 20 + 16 = 96 asks floor(96 / 12) = 8 chunks per
    # rank, but 4 layers over 2 ranks hold 2 at most.
    short = WorkloadShape({"vision": EncoderLoad(10, 1.0, 10)}, (10,))
    capped = plan_partition({"vision": 4, "llm": 2}, 2, costs, short)
    assert capped.latency == pytest.approx({"vision": 96.0, "llm": 12.0})
    assert capped.chunks_per_stage == {"vision": 2, "llm": 1}
    assert capped.splits["vision"] == ((0, 1), (1, 2), (2, 3), (3, 4))
    assert "vision K = 2 (T = 96 ms, floor(T / T_1) = 8, capped to a layer per chunk)" in "\n".join(
        capped.explain()
    )
    k = plan_partition({"vision": 12, "llm": 4}, 2, costs, workload, chunks_per_stage={"llm": 2})
    assert k.chunks_per_stage == {"vision": 2, "llm": 2} and "chunks:llm" not in k.auto
    with pytest.raises(ScheduleError, match="cannot fill 2 x 3 chunks"):
        plan_partition(layers, 2, costs, workload, chunks_per_stage={"llm": 3})
    even = plan_partition(layers, 2, costs, workload, split_by_cost=False)
    assert even.splits["llm"] == ((0, 2), (2, 4))


def test_flop_costs_have_no_fixed_part_so_one_unit_keeps_the_best_throughput():
    enc = TransformerShape(2, 64, 256, 4, input_flops_per_token=100.0)
    shape = ModelShape(TransformerShape(4, 64, 256, 4, causal=True), {"vision": enc})
    workload = WorkloadShape({"vision": EncoderLoad(32, 1.0, 9)}, (200, 56))
    plan = plan_partition({"vision": 2, "llm": 4}, 2, FlopCosts(shape), workload)
    assert plan.sub_microbatch_units == {"vision": 1} and plan.cost_unit == "GFLOP"
    # T in FLOPs: each part is 3 x its forward FLOPs.
    flops = 3 * (enc.forward_flops([32]) + 32 * 100.0) * 1e-9
    assert plan.latency["vision"] == pytest.approx(flops)


def test_the_workload_summary_reads_units_rows_and_the_typical_microbatch():
    def sample(i, text, *images):
        return SampleMeta(f"s{i}", text, image=tuple(images))

    img = Item((16, 16), 8)  # two tiles of 16 tokens, 8 LLM rows
    mbs = [[sample(0, 10, img), sample(1, 30)], [sample(2, 50, img, Item((4,), 4))], [sample(3, 5)]]
    shape = workload_shape(mbs, ["vision"])
    # Units 16, 16, 16, 16, 4: median 16; rows 8 + 8 + 4 = 20 over 5 units; per microbatch
    # 2, 3 and 0 units (the most 3, the median of those with any 2).
    assert shape.encoders["vision"] == EncoderLoad(16, 4.0, 3, 2)
    # LLM tokens per microbatch: 10 + 8 + 30 = 48, 50 + 12 = 62, 5: the median one is the first.
    assert shape.llm_seq_lens == (18, 30) and shape.num_microbatches == 3


class _CallCosts:
    """A cost model that is easy to sum by hand: a layer costs 1 per call plus its tokens
    squared (not linear, so a typical microbatch would not stand for all of them), the input
    layer 100 per call, the head 1000 per call plus its rows."""

    unit = "ms"

    def layer(self, module, seq_lens):
        return 1 + sum(seq_lens) ** 2

    def input(self, module, seq_lens):
        return 100

    def head(self, module, seq_lens, rows):
        return 1000 + rows


def test_layer_costs_sum_every_microbatch_and_skip_an_encoder_it_does_not_run():
    def sample(i, text, *images):
        return SampleMeta(f"s{i}", text, image=tuple(images))

    mbs = [
        [sample(0, 2, Item((3,), 4)), sample(1, 5)],
        [sample(2, 1)],
        [sample(3, 0, Item((1, 2), 6))],
    ]
    costs = iteration_layer_costs(_CallCosts(), {"vision": 2, "audio": 1, "llm": 3}, mbs)
    # vision runs in microbatches 1 (units 3, rows 4) and 3 (units 1 + 2, rows 6), not 2.
    layer = (1 + 3**2) + (1 + 3**2)
    assert costs["vision"] == [layer + 2 * 100, layer + 2 * 1000 + 4 + 6]
    # No audio anywhere: its layer costs nothing; the LLM runs every microbatch on its samples'
    # LLM tokens (text plus the items' rows): 6 and 5; 1; 6.
    assert costs["audio"] == [0.0]
    llm = (1 + 11**2) + (1 + 1**2) + (1 + 6**2)
    assert costs["llm"] == [llm + 3 * 100, llm, llm + 3 * 1000]
    assert "video" not in costs  # a module without layers has no entry
    # The stages of balanced cost: vision's layers cost 220 and 2,030, the LLM's 461, 161 and
    # 3,161, so the smallest largest stage is the LLM's last layer alone (3,161 against 2,872).
    placement = Placement.balanced_stages(2, costs)
    assert placement.chunks_on(1) == [("llm", 1)]
    assert placement.layer_range("llm", 1) == (2, 3)


def test_a_placement_from_explicit_splits_puts_chunk_j_on_rank_j_mod_p():
    placement = Placement.from_splits(2, {"vision": [(0, 1), (1, 4)], "llm": [(0, 3), (3, 4)]})
    assert placement.chunks_on(0) == [("vision", 0), ("llm", 0)]
    assert placement.layer_range("vision", 1) == (1, 4)
    assert Placement.from_splits(2, {"llm": split_layers(4, 4)}) == Placement.interleaved(
        2, {"llm": 4}, {"llm": 2}
    )
    with pytest.raises(ScheduleError, match="contiguous from layer 0"):
        Placement.from_splits(2, {"llm": [(0, 2), (3, 4)]})


VARIABLE = """\
{"id": "a", "text_tokens": 20, "image": [{"units": [16, 16], "llm_tokens": 8}]}
{"id": "b", "text_tokens": 9, "image": [24, 8, 12, {"units": [40], "llm_tokens": 10}, 6]}
{"id": "c", "text_tokens": 5, "image": [64, 16, 16], "audio": [{"units": [47, 47], "llm_tokens": 20}]}
{"id": "d", "text_tokens": 30, "audio": [40, 40, 40]}
"""


def test_semu_places_and_cuts_as_the_plan_says(tmp_path):
    from megatron.mllm.cli.args import quiet_config_files
    from megatron.mllm.partitioning import partition_plan, sub_microbatch_units
    from pipeweaver.semu.hardware import ClusterSpec
    from pipeweaver.semu.scenario import build_step

    configs = quiet_config_files()
    flags = ["--pipeline-model-parallel-size 2", "--pipeline-schedule dynamic",
             "--llm-chunks-per-stage auto", "--encoder-sub-microbatch-size 2"]  # fmt: skip
    (tmp_path / "variable.jsonl").write_text(VARIABLE)
    flags += [f"--workload {tmp_path / 'variable.jsonl'}", "--workload-token-scale 1"]
    loaded = configs.load_run_config("cpu-main", flags, world_size=2)
    plan = partition_plan(loaded.run, loaded.model, "scripts/configs/calibration-cpu.json")
    units = sub_microbatch_units(loaded.run, plan)
    assert units == dict(plan.sub_microbatch_units) == {"vision": 2, "audio": 2}
    assert "measured" in plan.source and plan.split_by_cost
    cluster = ClusterSpec.load(configs.find_config("cpu-2ranks"))
    schedules, mbs, _ = build_step(loaded.semu, cluster, schedule="dynamic", pad=False,
                                   partition=plan)  # fmt: skip
    assert schedules[0].placement == plan.placement()
    run = loaded.run
    stream = SampleStream(run.workload.workload, run.workload.workload_seed,
                          run.workload.workload_token_scale)  # fmt: skip
    cut = False
    for mb, indices in zip(mbs[0], microbatch_indices(0, 0, 1, run.micro_batch_size, 8)):
        for enc, subs in mb.encoders.items():
            items = [len(it.units) for k in indices for it in stream.meta(k).encoder_items(enc)]
            # ceil(N / B) near-equal subs (fewer only when there are fewer items), the largest
            # as small as any contiguous cut makes it.
            count = min(math.ceil(sum(items) / units[enc]), len(items))
            assert len(subs) == count
            assert max(len(s.units) for s in subs) == _brute(items, count)[0]
            cut = cut or count > 1
    assert cut  # some microbatch was cut

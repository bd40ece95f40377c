# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Packing, pooling, synthetic payloads and Megatron's data order (no processes needed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron.mllm.batch import build_microbatch, pooling_pairs, sample_layout
from megatron.mllm.data import SyntheticTask
from orchestration.packing import microbatch_indices, padding_runs, sub_microbatch_groups
from orchestration.workload import Item, SampleMeta

TASK = SyntheticTask(vocab_size=200, num_classes=5, input_dims={"vision": 6, "audio": 3}, seed=7)


def _sample(sid="s", text=10, images=(), audio=()):
    return SampleMeta(
        sid,
        text,
        image=tuple(Item(tuple(u), llm) for u, llm in images),
        audio=tuple(Item(tuple(u), llm) for u, llm in audio),
    )


items = st.tuples(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.integers(1, 12))
samples = st.builds(
    lambda t, im, au: _sample("h", t, im, au),
    st.integers(0, 30),
    st.lists(items, max_size=3),
    st.lists(items, max_size=2),
)


@given(samples)
@settings(max_examples=60, deadline=None)
def test_layout_covers_every_position_once(meta):
    spans, runs = sample_layout(meta)
    covered = np.zeros(meta.llm_tokens, dtype=int)
    for start, length in runs:
        covered[start : start + length] += 1
    for span in spans:
        covered[span.start : span.start + span.length] += 1
        assert span.length == meta.items(span.modality)[span.index].llm_tokens
    assert (covered == 1).all()
    assert sum(length for _, length in runs) == meta.text_tokens
    assert [s.start for s in spans] == sorted(s.start for s in spans)


@given(st.integers(1, 200), st.integers(1, 200))
def test_pooling_pairs_merge_or_repeat(enc, llm):
    rows, toks = pooling_pairs(enc, llm)
    assert set(rows.tolist()) == set(range(llm)), "every LLM token gets at least one input"
    assert toks.min() >= 0 and toks.max() < enc
    if llm <= enc:
        # a merge: each encoder token is read exactly once, runs are contiguous and ordered
        assert sorted(toks.tolist()) == list(range(enc))
        assert (np.diff(toks) == 1).all()
        counts = np.bincount(rows)
        assert counts.max() - counts.min() <= 1
    else:
        assert len(rows) == llm


def test_padding_runs():
    assert padding_runs(100, None, 64) == []
    assert padding_runs(100, 100, 64) == []
    assert padding_runs(10, 138, 64) == [64, 64]
    assert padding_runs(10, 139, 64) == [64, 64, 1]


def _build(metas, pad_to=None, max_pad_run=None):
    pairs = [(m, TASK.payload(m, i)) for i, m in enumerate(metas)]
    return pairs, build_microbatch(
        pairs, ["vision", "audio"], pad_to=pad_to, max_pad_run=max_pad_run
    )


def test_microbatch_labels_mask_and_splice():
    metas = [
        _sample("a", 9, images=[([4, 4], 2)], audio=[([6], 3)]),
        _sample("b", 5),
        _sample("c", 4, images=[([8], 2), ([3], 1)]),
    ]
    pairs, mb = _build(metas)
    lang = mb.language
    assert lang.seq_lens == [m.llm_tokens for m in metas]
    tokens = lang.tokens.numpy()
    text = np.ones(lang.length, dtype=bool)
    for enc, pos in lang.splice_positions.items():
        text[pos.numpy()] = False
    assert mb.encoders["vision"].num_rows == len(lang.splice_positions["vision"]) == 2 + 2 + 1
    assert mb.encoders["audio"].num_rows == len(lang.splice_positions["audio"]) == 3
    assert mb.encoders["vision"].unit_lens == [4, 4, 8, 3]
    assert mb.encoders["vision"].features.shape == (19, 6)
    # The loss is on every position whose next token is text of the same sample, nowhere else.
    starts = np.cumsum([0] + lang.seq_lens)
    for s in range(len(metas)):
        for p in range(starts[s], starts[s + 1]):
            nxt_is_text = p + 1 < starts[s + 1] and text[p + 1]
            assert lang.loss_mask[p].item() == float(nxt_is_text)
            if nxt_is_text:
                assert lang.labels[p].item() == tokens[p + 1]
    assert mb.num_loss_tokens == int(lang.loss_mask.sum())


def test_microbatch_padding_is_masked_and_bounded():
    metas = [_sample("a", 7, images=[([5], 2)]), _sample("b", 3)]
    _, mb = _build(metas, pad_to=40, max_pad_run=16)
    lang = mb.language
    assert lang.length == 40
    assert lang.seq_lens == [9, 3, 16, 12]
    assert lang.loss_mask[12:].sum() == 0
    assert int(lang.position_ids.max()) < 16
    with pytest.raises(ValueError, match=r"samples \['a', 'b'\] pack to 12 LLM tokens"):
        _build(metas, pad_to=11)


def test_microbatch_errors_name_the_sample():
    meta = _sample("pic", 3, images=[([4], 2)])
    payload = TASK.payload(meta, 0)
    with pytest.raises(
        ValueError, match="sample 'pic' has image items but the model has no vision"
    ):
        build_microbatch([(meta, payload)], ["audio"])
    wrong = _sample("pic", 4, images=[([4], 2)])
    with pytest.raises(ValueError, match="sample 'pic': payload has 5 tokens, metadata says 6"):
        build_microbatch([(wrong, payload)], ["vision"])


def test_synthetic_text_names_the_item_class_and_is_deterministic():
    meta = _sample("x", 12, images=[([3], 2)], audio=[([4], 2)])
    p1, p2 = TASK.payload(meta, 42), TASK.payload(meta, 42)
    assert np.array_equal(p1.tokens, p2.tokens)
    assert all(np.array_equal(a, b) for a, b in zip(p1.units["vision"], p2.units["vision"]))
    assert not np.array_equal(TASK.payload(meta, 43).units["vision"][0], p1.units["vision"][0])
    spans, runs = sample_layout(meta)
    vision_classes = {TASK.class_token("vision", c) for c in range(5)}
    audio_classes = {TASK.class_token("audio", c) for c in range(5)}
    assert p1.tokens[runs[1][0]] in vision_classes
    assert p1.tokens[runs[2][0]] in audio_classes
    for start, length in runs:
        for p in range(start + 2, start + length):
            assert p1.tokens[p] == TASK.next_text_token(int(p1.tokens[p - 1]))
    assert [u.shape for u in p1.units["vision"]] == [(3, 6)]
    assert [u.shape for u in p1.units["audio"]] == [(4, 3)]
    assert all(p1.tokens[s.start : s.start + s.length].sum() == 0 for s in spans)


def test_synthetic_task_rejects_a_vocab_too_small():
    with pytest.raises(ValueError, match="--vocab-size 10 is too small"):
        SyntheticTask(vocab_size=10, num_classes=5, input_dims={}, seed=0)


@pytest.mark.parametrize("dp,mbs,m", [(1, 1, 4), (2, 2, 3), (4, 1, 2), (3, 2, 1)])
def test_megatron_order_covers_the_global_batch_once(dp, mbs, m):
    for it in (0, 5):
        seen = [
            k for rank in range(dp) for mb in microbatch_indices(it, rank, dp, mbs, m) for k in mb
        ]
        gbs = dp * mbs * m
        assert sorted(seen) == list(range(it * gbs, (it + 1) * gbs))
    # Megatron's sampler: rank r takes slice r of every (mbs * dp)-sample chunk.
    assert microbatch_indices(1, 1, 2, 2, 3) == [[14, 15], [18, 19], [22, 23]]


@given(
    st.lists(samples, min_size=1, max_size=4),
    st.sampled_from([None, 1, 6, 15, 40]),
    st.sampled_from([None, {"vision": 1, "audio": 2}, {"vision": 3}]),
)
@settings(max_examples=40, deadline=None)
def test_semu_sees_the_subs_the_runtime_builds(metas, sub_tokens, sub_units):
    """SEMU's microbatch metadata has the trainer's sub-microbatches: units and LLM rows."""
    from types import SimpleNamespace

    from megatron.mllm.pipeline import build_pipeline_microbatch
    from pipeweaver.semu.batches import pack_microbatch

    metas = [dataclasses.replace(m, sample_id=f"s{i}") for i, m in enumerate(metas)]
    encoders = {"vision": SimpleNamespace(hidden_size=8), "audio": SimpleNamespace(hidden_size=8)}
    mllm = SimpleNamespace(encoders=encoders, language=SimpleNamespace(hidden_size=8))
    pairs = [(m, TASK.payload(m, i, with_features=False)) for i, m in enumerate(metas)]
    trainer = build_pipeline_microbatch(pairs, mllm, "cpu", False, sub_tokens, sub_units)
    semu = pack_microbatch(metas, list(encoders), sub_tokens=sub_tokens, sub_units=sub_units)
    for enc in encoders:
        assert semu.num_subs(enc) == trainer.num_subs(enc)
        for s, sub in enumerate(semu.encoders.get(enc, ())):
            got = trainer.sub_input(enc, s)
            assert list(sub.units) == list(got.unit_lens) and sub.rows == got.num_rows
    assert list(semu.llm_seq_lens) == [m.llm_tokens for m in metas]


@given(st.lists(st.integers(1, 50), max_size=12), st.sampled_from([None, 0, 1, 20, 64, 1000]))
def test_sub_microbatch_groups_keep_items_whole_and_under_the_cap(tokens, cap):
    groups = sub_microbatch_groups([(1, n, 1) for n in tokens], cap)
    # Consecutive, covering every item once, in order.
    assert [i for lo, hi in groups for i in range(lo, hi)] == list(range(len(tokens)))
    assert all(hi > lo for lo, hi in groups)
    if not cap:
        assert len(groups) == (1 if tokens else 0)
        return
    for k, (lo, hi) in enumerate(groups):
        size = sum(tokens[lo:hi])
        # Over the cap only as a single item; and greedy: the next item would not have fit.
        assert size <= cap or hi - lo == 1
        if k + 1 < len(groups):
            assert size + tokens[hi] > cap

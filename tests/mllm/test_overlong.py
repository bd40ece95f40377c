# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``--overlong-samples``: hand-computed decisions, and the loader's batches at any DP size."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from megatron.mllm.batch import build_microbatch, sample_layout
from megatron.mllm.data import BatchLoader, SequenceTooLongError, SyntheticTask
from megatron.mllm.overlong import fit_batch, truncated_meta, truncated_text_ids
from orchestration.metadata import GatheredMetadata
from orchestration.workload import Item, SampleMeta, write_jsonl
from orchestration.workload_spec import SampleStream

LIMIT = 20


def _img(llm: int, units: int = 1) -> tuple[Item, ...]:
    return (Item((4 * llm // units,) * units, llm),)


# (sample, what truncate keeps of its text; None: dropped by drop, and kept whole otherwise)
FITTING = SampleMeta("fits", 10, image=_img(8))  # 18 tokens
LONG_TEXT = SampleMeta("long-text", 30, image=_img(8))  # 38: truncate keeps 12 text tokens
ONLY_TEXT = SampleMeta("only-text", 25)  # 25: truncate keeps 20
TWO_ITEMS = SampleMeta("two-items", 9, image=_img(6), audio=(Item((40,), 10),))  # 25: keeps 4
EXACT = SampleMeta("exact", 12, image=_img(8))  # 20: fits exactly


def _gathered(*ranks):
    return GatheredMetadata.from_rank_samples(
        [[(10 * r + p, m) for p, m in enumerate(samples)] for r, samples in enumerate(ranks)]
    )


def test_truncate_cuts_text_only_and_drop_skips_hand_computed():
    md = _gathered([FITTING, LONG_TEXT], [ONLY_TEXT, TWO_ITEMS, EXACT])
    cut = fit_batch(md, LIMIT, "truncate")
    assert cut.kept_text.tolist() == [10, 12, 20, 4, 12]
    assert (cut.truncated, cut.dropped) == (3, 0)
    assert cut.metadata.sample_llm.tolist() == [18, 20, 20, 20, 20]
    # Items are untouched: the same item and unit table as before.
    assert cut.metadata.item_llm.tolist() == md.item_llm.tolist()
    assert cut.metadata.unit_tokens.tolist() == md.unit_tokens.tolist()
    assert cut.metadata.sample_ids == md.sample_ids
    skip = fit_batch(md, LIMIT, "drop")
    assert skip.kept_text.tolist() == [10, -1, -1, -1, 12]
    assert (skip.truncated, skip.dropped) == (0, 3)
    assert skip.metadata.sample_ids == ("fits", "exact")
    assert skip.metadata.sample_offsets.tolist() == [0, 1, 2]
    assert skip.metadata.sample_stream.tolist() == [0, 12]
    # A rank's own microbatches follow the same decisions (rank 1: [only-text, two-items],
    # [exact]; its first microbatch is left empty by drop).
    own = [[(10, ONLY_TEXT), (11, TWO_ITEMS)], [(12, EXACT)]]
    assert skip.own(own, 1) == [[], [(12, EXACT)]]
    (a, b), (c,) = cut.own(own, 1)
    assert (a[1].text_tokens, b[1].text_tokens, c[1]) == (20, 4, EXACT)
    assert b[1].image == TWO_ITEMS.image and b[1].audio == TWO_ITEMS.audio
    # Nothing over the limit: the metadata itself, no counts.
    fine = fit_batch(_gathered([FITTING, EXACT]), LIMIT, "drop")
    assert (fine.truncated, fine.dropped, fine.kept_text.tolist()) == (0, 0, [10, 12])


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_an_item_alone_too_long_is_an_error_naming_sample_and_item(policy):
    # 19 image tokens + the 2 text tokens that stay = 21 > 20, under either policy.
    lone = SampleMeta("lone", 3, audio=(Item((8,), 2),), image=_img(19, units=3))
    md = _gathered([FITTING], [EXACT, lone])
    with pytest.raises(SequenceTooLongError) as e:
        fit_batch(md, LIMIT, policy)
    assert str(e.value) == (
        "--overlong-samples: sample 'lone' (stream index 11, loaded by data-parallel rank 1, 24 "
        "LLM tokens): its image 0 alone takes 19 LLM tokens (3 encoder units), with its 2 text "
        "tokens that cannot be cut more than --seq-length 20: raise --seq-length, or lower the "
        "image or audio resolution"
    )
    # One text token only: that one stays, so 19 + 1 fits alone and 20 + 1 does not.
    assert fit_batch(_gathered([SampleMeta("t1", 1, image=_img(19))]), LIMIT, policy)
    with pytest.raises(SequenceTooLongError, match="'t1b'.* image 0 alone takes 20"):
        fit_batch(_gathered([SampleMeta("t1b", 1, image=_img(20))]), LIMIT, policy)


def test_truncate_cannot_fit_items_that_only_together_are_too_long():
    # 10 + 9 item tokens fit alone with 2 text tokens; together they leave room for 1.
    both = SampleMeta("both", 5, image=_img(10), audio=(Item((36,), 9),))
    with pytest.raises(SequenceTooLongError, match="'both'.*items take 19 LLM tokens.*drop"):
        fit_batch(_gathered([both]), LIMIT, "truncate")
    assert fit_batch(_gathered([both]), LIMIT, "drop").dropped == 1


def test_truncated_text_ids_keep_the_prefix_and_the_end_token():
    ids = (1, 50, 51, 52, 53, 2)
    assert truncated_text_ids(ids, 4) == (1, 50, 51, 2)
    assert truncated_text_ids(ids, 2) == (1, 2)
    assert truncated_text_ids(ids, 6) == ids
    with pytest.raises(ValueError):
        truncated_text_ids(ids, 1)


def test_an_empty_microbatch_packs_to_one_masked_token():
    packed = build_microbatch([], ["vision"])
    assert packed.language.seq_lens == [1] and packed.num_loss_tokens == 0
    assert not packed.encoders


class _Group:
    """A DP group of threads: each rank's ``gather_batches`` meets the others' in memory."""

    def __init__(self, world):
        self.world, self.parts, self.barrier = world, [None] * world, threading.Barrier(world)

    def dispatcher(self, rank):
        group = self

        class _Dispatcher:
            def __init__(self):
                self.rank, self.world = rank, group.world

            def gather_batches(self, batches, control=None):
                group.parts[rank] = [list(b) for b in batches]
                group.barrier.wait()
                out = [
                    GatheredMetadata.from_rank_samples(
                        [group.parts[r][b] for r in range(self.world)]
                    )
                    for b in range(len(batches))
                ]
                group.barrier.wait()
                return out, [np.zeros(0, np.int64)] * self.world

        return _Dispatcher()


def _run(stream, world, policy, lookahead, iterations=3, mbs=1, gbs=8):
    """Every rank's loaded batches: (per iteration, {stream index: (meta, tokens)}, counts)."""
    group = _Group(world)
    task = SyntheticTask(vocab_size=64, num_classes=2, input_dims={"vision": 3, "audio": 3}, seed=1)
    out = [None] * world

    def rank_main(rank):
        loader = BatchLoader(
            stream, task, group.dispatcher(rank), mbs, gbs // (mbs * world), LIMIT, True,
            ("vision", "audio"), lookahead=lookahead, train_iters=iterations,
            overlong_samples=policy,
        )  # fmt: skip
        out[rank] = [loader.load(i) for i in range(iterations)]

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    per_iteration = []
    for i in range(iterations):
        batches = [out[r][i] for r in range(world)]
        assert len({(b.truncated_samples, b.dropped_samples) for b in batches}) == 1
        for b in batches:  # every rank's microbatches, empty or not, as Megatron loads them
            assert len(b.microbatches) == gbs // (mbs * world)
            assert b.metadata.sample_ids == batches[0].metadata.sample_ids
        loaded = {s.index: (s.meta, s.payload.tokens.tolist()) for b in batches for s in b.samples}
        assert sorted(loaded) == sorted(batches[0].metadata.sample_stream.tolist())
        counts = (batches[0].truncated_samples, batches[0].dropped_samples)
        per_iteration.append((loaded, counts))
    return per_iteration


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    path = tmp_path_factory.mktemp("overlong") / "samples.jsonl"
    samples = [FITTING, LONG_TEXT, ONLY_TEXT, TWO_ITEMS, EXACT]
    samples += [SampleMeta(f"t{n}", n, image=_img(4)) for n in (3, 17, 16, 40, 9, 22)]
    with open(path, "w") as f:
        write_jsonl(samples, f)
    return SampleStream(path)


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_decisions_and_counts_do_not_depend_on_dp_size_or_lookahead(stream, policy):
    reference = _run(stream, 1, policy, lookahead=False)
    # Stream indices 0-23 cycle the 11 samples; 1, 2, 3, 6, 8 and 10 are over-long: iteration
    # 0 holds 1, 2, 3, 6; iteration 1 (8-10, 0-4) 8, 10, 1, 2, 3; iteration 2 (5-10, 0, 1) 6, 8,
    # 10, 1.
    assert [sum(c) for _, c in reference] == [4, 5, 4]
    for loaded, counts in reference:
        assert all(meta.llm_tokens <= LIMIT for meta, _ in loaded.values())
        if policy == "truncate":
            assert counts[1] == 0 and len(loaded) == 8
            for k, (meta, tokens) in loaded.items():
                whole = stream.meta(k)
                assert meta.text_tokens <= whole.text_tokens and meta.image == whole.image
                # The payload is laid out from the cut metadata: items whole, text around them.
                spans, _ = sample_layout(meta)
                assert len(tokens) == meta.llm_tokens
                assert all(not any(tokens[s.start : s.start + s.length]) for s in spans)
        else:
            assert counts[0] == 0 and len(loaded) == 8 - counts[1]
    for world, lookahead in ((2, False), (2, True), (4, True)):
        assert _run(stream, world, policy, lookahead) == reference


def test_truncating_a_laid_out_document_cuts_its_runs_from_the_end():
    # "T T T [img] T T [aud] T T": 7 text tokens; keeping 4 keeps the first 3 and the last.
    doc = SampleMeta("d", 7, image=(Item((4,), 1),), audio=(Item((4,), 1),), text_runs=(3, 2, 2))
    assert truncated_meta(doc, 4).text_runs == (3, 0, 1)
    assert truncated_meta(doc, 6).text_runs == (3, 2, 1)
    assert truncated_meta(doc, 2).text_runs == (1, 0, 1)
    assert truncated_meta(doc, 7) is doc
    ids = tuple(range(10, 17))
    assert truncated_text_ids(ids, 4) == (10, 11, 12, 16)

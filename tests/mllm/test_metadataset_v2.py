# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Energon metadataset v2 keys beyond ``blend``: an entry's ``split_part``, and
``blend_epochized`` (exact repetitions per epoch, stateless order)."""

from __future__ import annotations

import os
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pytest

from megatron.mllm.arguments import ConfigError
from megatron.mllm.cli import scan_dataset
from megatron.mllm.data_blend import BlendedStream, blend_of
from megatron.mllm.data_energon import EnergonStream, open_dataset, stream_from_run
from megatron.mllm.data_epochized import EpochizedStream, samples_per_epoch
from megatron.mllm.data_state import (
    resume_problem,
    saved_state,
    shard_index_fingerprint,
    stream_source,
)
from megatron.mllm.demo_data import (
    DemoSpec,
    document_samples,
    document_texts,
    write_energon_dataset,
)
from megatron.mllm.preprocess import AudioFeatures, ImageTiling
from megatron.mllm.tokenizer import load_tokenizer, train_tokenizer
from orchestration.workload import WorkloadError, read_jsonl

SPEC = dict(max_image_side=32, max_audio_seconds=0.4)
HEAD = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``parts``: 8 samples in 4 shards, ``train`` the first two shards and ``val`` the last
    two; ``small``: 6 samples, ``train`` only; a tokenizer of their texts."""
    root = tmp_path_factory.mktemp("mdsv2")
    parts = document_samples(DemoSpec(num_documents=8, seed=21, **SPEC))
    small = document_samples(DemoSpec(num_documents=6, seed=22, **SPEC))
    write_energon_dataset(str(root / "parts"), parts, 4, (("train", 0.5), ("val", 0.5)))
    write_energon_dataset(str(root / "small"), small, 1)
    tok = str(root / "tokenizer")
    train_tokenizer(document_texts(parts + small), tok, 384)
    return root, tok, load_tokenizer("HuggingFaceTokenizer", tok)


def _stream(path, tk, split_part="train", label=""):
    return EnergonStream(str(path), tk, ImageTiling(16, 4, 4), AudioFeatures(16, 0.3), seed=3,
                         label=label, split_part=split_part)  # fmt: skip


def _yaml(root, name, body, head=HEAD):
    path = str(root / name)
    with open(path, "w") as f:
        f.write(head + body)
    return path


def _ids(stream):
    return [stream.read(i).name for i in range(len(stream))]


def test_an_entry_reads_the_split_part_it_names(data, tmp_path, capsys):
    root, tok, tk = data
    parts = str(root / "parts")
    train, val = _ids(_stream(parts, tk)), _ids(_stream(parts, tk, "val"))
    assert {i.split("/")[0] for i in train} == {"shard-000000.tar", "shard-000001.tar"}
    assert {i.split("/")[0] for i in val} == {"shard-000002.tar", "shard-000003.tar"}
    mix = _yaml(root, "mix.yaml", "    blend:\n      - path: parts\n        split_part: val\n"
                "      - path: small\n        weight: 2\n")  # fmt: skip
    blend = blend_of([mix])
    assert not blend.epochized
    assert list(blend) == [
        (1.0, parts, "parts", "val"),
        (2.0, str(root / "small"), "small", "train"),
    ]
    # Two parts of one dataset are two datasets; one part twice is named twice.
    both = _yaml(root, "both.yaml", "    blend:\n      - path: parts\n"
                 "      - path: parts\n        split_part: val\n")  # fmt: skip
    assert [e.split_part for e in blend_of([both])] == ["train", "val"]
    twice = _yaml(root, "twice.yaml", "    blend:\n      - path: parts\n        split_part: val\n"
                  "      - {path: parts, split_part: val}\n")  # fmt: skip
    with pytest.raises(ConfigError, match="dataset .*parts is named twice"):
        blend_of([twice])
    # On a nested YAML it picks that YAML's split, which its own entries inherit (as Energon).
    _yaml(root, "inner.yaml", "    path: small\n  val:\n    blend:\n      - path: parts\n")
    outer = _yaml(root, "outer.yaml", "    blend:\n      - path: inner.yaml\n        split_part: val\n"
                  "      - path: inner.yaml\n")  # fmt: skip
    assert [(e.label, e.split_part) for e in blend_of([outer])] == [
        ("parts", "val"), ("small", "train")
    ]  # fmt: skip
    # The trainer's stream and the scanner read the same part's samples.
    run = SimpleNamespace(
        data=SimpleNamespace(data_path=mix, data_blend=(), num_workers=0, prompt_format="caption",
                             tokenizer_type="HuggingFaceTokenizer", tokenizer_model=tok),
        multimodal=SimpleNamespace(image_preprocess="tile", vision_patch_size=4, image_tile_size=16,
                                   image_max_tiles=4, min_pixels=3136, max_pixels=50176,
                                   audio_feature_dim=16),
        vocab_size=384, seed=3, distributed_timeout=timedelta(minutes=10),
    )  # fmt: skip
    stream = stream_from_run(run)
    assert isinstance(stream, BlendedStream) and stream.streams[0].split_part == "val"
    drawn = {stream.meta(k).sample_id for k in range(40)}
    assert {i for i in drawn if i.startswith("parts/")} == {f"parts/{i}" for i in val}
    out = tmp_path / "mix.jsonl"
    assert scan_dataset.main([mix, "--tokenizer-model", tok, "--output", str(out)]) == 0
    ids = [m.sample_id for m in read_jsonl(out)]
    assert [i for i in ids if i.startswith("parts/")] == [f"parts/{i}" for i in val]
    capsys.readouterr()
    # An unknown part: one line naming the YAML, the entry and the parts the dataset has.
    bad = _yaml(root, "bad.yaml", "    blend:\n      - path: small\n"
                "      - path: parts\n        split_part: test\n")  # fmt: skip
    assert scan_dataset.main([bad, "--tokenizer-model", tok]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --data-path {bad}: splits.train.blend[1]: dataset parts has no split part "
        "'test' (its .nv-meta/split.yaml has train, val)\n"
    )
    with pytest.raises(
        ConfigError, match=r"nested\.yaml -> .*inner\.yaml: no 'splits: test:' entry"
    ):
        blend_of([_yaml(root, "nested.yaml", "    path: inner.yaml\n    split_part: test\n")])
    with pytest.raises(ConfigError, match=r"small: the dataset has no split part 'val' \(its "
                       r"\.nv-meta/split\.yaml has train\)"):  # fmt: skip
        open_dataset(str(root / "small"), "val")
    with pytest.raises(ConfigError, match=r"splits\.train: 'split_part' must be a split part's"):
        blend_of([_yaml(root, "num.yaml", "    path: parts\n    split_part: 3\n")])


def test_a_resume_on_another_split_part_is_refused(data):
    root, _, tk = data
    parts = str(root / "parts")
    train, val = _stream(parts, tk), _stream(parts, tk, "val")
    assert train.identity() == (parts, 4, shard_index_fingerprint(parts), 3)  # as before parts
    assert val.identity()[0] == f"{parts} [split part val]" and val.identity()[1] == 4
    assert val.identity()[2] != train.identity()[2]
    run = SimpleNamespace(data=object(), global_batch_size=4)
    saved = saved_state(stream_source(run, train), 5)
    assert resume_problem(saved, stream_source(run, train), "C") is None
    problem = resume_problem(saved, stream_source(run, val), "C")
    assert problem.startswith(
        f"--data-path {parts} [split part val]: not the dataset C was trained on: it was {parts} "
        "with 4 samples"
    ), problem
    # Within a blend too: the blend's fingerprint covers each dataset's.
    small = _stream(root / "small", tk)
    assert (BlendedStream([small, val], (1.0, 1.0), 3).identity()[2]
            != BlendedStream([small, train], (1.0, 1.0), 3).identity()[2])  # fmt: skip


class _Permuted:
    """A dataset's stream ordered as :class:`EnergonStream` orders one (its index ``j`` is
    sample ``perm[j mod n]`` of its epoch ``j // n``), without data: ``meta(j)`` is the sample."""

    dataset_index = EnergonStream.dataset_index

    def __init__(self, n, seed):
        self.n, self.seed, self._orders, self.read_epochs = n, seed, {}, []

    def __len__(self):
        return self.n

    def meta(self, j):
        self.read_epochs.append(j // self.n)
        return self.dataset_index(j)

    def close(self):
        pass


def test_blend_epochized_holds_each_sample_its_repetitions_per_epoch():
    sizes, reps, seed = (7, 50, 13), (1, 2.3, 0.5), 5
    takes = [samples_per_epoch(r, n) for r, n in zip(reps, sizes)]
    assert takes == [7, 115, 6]  # 2.3 x 50 is 115 (the float 2.3 x 50 is 114.99999999999999)
    blend = EpochizedStream([_Permuted(n, seed) for n in sizes], reps, seed)
    assert len(blend) == sum(takes)
    L = len(blend)
    epochs = []
    for e in range(3):
        got = [(blend.source(k)[0], blend.meta(k)) for k in range(e * L, (e + 1) * L)]
        counts = [Counter(s for d, s in got if d == dd) for dd in range(3)]
        assert [sum(c.values()) for c in counts] == takes
        assert counts[0] == Counter(range(7))  # once each
        # 2.3: every sample twice, 15 of them a third time (the first of one more pass).
        assert sorted(counts[1].values()) == [2] * 35 + [3] * 15 and len(counts[1]) == 50
        assert sorted(counts[2].values()) == [1] * 6  # 6 distinct of 13
        epochs.append([d for d, _ in got])
        # Shuffled, not one dataset after another.
        assert epochs[-1] != sorted(epochs[-1])
    assert epochs[0] != epochs[1] != epochs[2]
    # Each dataset's own stream reads its passes in turn: its epochs never go back.
    for s in blend.streams:
        assert s.read_epochs == sorted(s.read_epochs)
    # A pure function of (seed, k): another instance, read backwards or from a resume point.
    again = EpochizedStream([_Permuted(n, seed) for n in sizes], reps, seed)
    ks = list(range(3 * L))
    assert [again.source(k) for k in ks[::-1]][::-1] == [blend.source(k) for k in ks]
    assert [again.meta(k) for k in range(2 * L + 9, 2 * L + 30)] == [
        blend.meta(k) for k in range(2 * L + 9, 2 * L + 30)
    ]
    other = EpochizedStream([_Permuted(n, seed) for n in sizes], reps, seed + 1)
    assert [other.source(k) for k in range(L)] != [blend.source(k) for k in range(L)]
    # One dataset repeated once is that dataset's own stream.
    alone = EpochizedStream([_Permuted(9, seed)], (1,), seed)
    assert [alone.meta(k) for k in range(27)] == [_Permuted(9, seed).meta(k) for k in range(27)]
    with pytest.raises(WorkloadError, match="repetitions 0.01 take none of them per epoch"):
        EpochizedStream([_Permuted(9, seed), _Permuted(7, seed)], (1, 0.01), seed)


def test_blend_epochized_yaml_streams_and_errors(data, capsys):
    root, tok, tk = data
    parts, small = str(root / "parts"), str(root / "small")
    mix = _yaml(root, "epochs.yaml", "    blend_epochized:\n      - repetitions: 2\n"
                "        path: small\n      - path: parts\n        split_part: val\n")  # fmt: skip
    blend = blend_of([mix])
    assert blend.epochized
    assert list(blend) == [(2.0, small, "small", "train"), (1.0, parts, "parts", "val")]
    # Nested repetitions multiply (a lone path keeps its entry's).
    _yaml(root, "sub.yaml", "    blend_epochized:\n      - {path: small, repetitions: 1.5}\n")
    _yaml(root, "one.yaml", "    path: parts\n")
    nest = _yaml(root, "nest.yaml", "    blend_epochized:\n      - {path: sub.yaml, repetitions: 2}\n"
                 "      - {path: one.yaml, repetitions: 0.5}\n")  # fmt: skip
    assert [(e.label, e.weight) for e in blend_of([nest])] == [("small", 3.0), ("parts", 0.5)]
    lone = _yaml(root, "lone.yaml", "    path: sub.yaml\n")
    assert blend_of([lone]).epochized and [e.weight for e in blend_of([lone])] == [1.5]
    # The trainer's stream: each sample of small twice per epoch, val's once.
    streams = [_stream(small, tk, label="small"), _stream(parts, tk, "val", label="parts")]
    stream = EpochizedStream(streams, (2.0, 1.0), seed=3)
    assert len(stream) == 16
    ids = Counter(stream.meta(k).sample_id for k in range(16, 32))
    assert ids == Counter({**{f"small/{i}": 2 for i in _ids(_stream(small, tk))},
                           **{f"parts/{i}": 1 for i in _ids(_stream(parts, tk, "val"))}})  # fmt: skip
    metas = [(k, stream.meta(k)) for k in range(3)]
    for (k, meta), payload in zip(metas, stream.payloads(metas, with_features=False)):
        assert len(payload.tokens) == meta.llm_tokens
    stream.meta(5)
    d, j = stream.source(5)
    media = stream.encoded_media(5)
    assert sorted(x for v in media.values() for x in v) == sorted(
        b for _, b in streams[d]._raw[j].media
    )
    stream.discard(5)
    assert j not in streams[d]._raw
    # A checkpoint records it: marked apart from a weighted blend, its repetitions counted.
    ident = stream.identity()
    assert ident[0] == f"epochized 2x {small} 1x {parts} [split part val]" and ident[1:2] == (16,)
    assert EpochizedStream(streams, (2.0, 1.0), seed=3).identity() == ident
    assert EpochizedStream(streams, (1.0, 1.0), seed=3).identity()[2] != ident[2]
    assert BlendedStream(streams, (2.0, 1.0), seed=3).identity()[2] != ident[2]
    stream.close()
    # Errors: one line naming the YAML chain and the entry.
    bad = {
        "    blend_epochized:\n      - {path: small, repetitions: 0}\n":
            "epochs.yaml: splits.train.blend_epochized[0]: 'repetitions' must be a number > 0, "
            "got 0",
        "    blend_epochized:\n      - {path: small, repetitions: -1.5}\n":
            "blend_epochized[0]: 'repetitions' must be a number > 0, got -1.5",
        "    blend_epochized:\n      - {path: small, repetitions: two}\n":
            "blend_epochized[0]: 'repetitions' must be a number > 0, got 'two'",
        "    blend_epochized:\n      - {path: small, repetitions: true}\n":
            "blend_epochized[0]: 'repetitions' must be a number > 0, got True",
        "    blend_epochized:\n      - {path: small}\n      - {repetitions: 2}\n":
            "splits.train.blend_epochized[1] needs a 'path' (a string)",
        "    blend_epochized:\n      - {path: small, weight: 2}\n":
            "blend_epochized[0]: unknown keys ['weight'] (known: path, repetitions, split_part, "
            "subflavors)",
        "    blend_epochized: []\n": "'splits.train.blend_epochized' must be a non-empty list",
        "    subset: {range: [0, 4]}\n    blend_epochized:\n      - {path: small}\n":
            "splits.train: unknown keys ['subset'] beside 'blend_epochized'",
        "    blend:\n      - {path: small}\n    blend_epochized:\n      - {path: parts}\n":
            "splits.train has both 'blend' and 'blend_epochized'",
        "    blend_epochized:\n      - {path: weighted.yaml}\n":
            "epochs.yaml: splits.train.blend_epochized[0]: weighted.yaml is a 'blend' inside a "
            "'blend_epochized'",
        "    blend:\n      - {path: sub.yaml}\n":
            "splits.train.blend[0]: sub.yaml is a 'blend_epochized' inside a 'blend'",
    }  # fmt: skip
    _yaml(root, "weighted.yaml", "    blend:\n      - path: small\n")
    for body, message in bad.items():
        _yaml(root, "epochs.yaml", body)
        assert scan_dataset.main([mix, "--tokenizer-model", tok]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --data-path {mix}") and message in err, (body, err)
        assert err.count("\n") == 1
    # Nested: the chain of YAMLs is named.
    _yaml(root, "sub.yaml", "    blend_epochized:\n      - {path: small, repetitions: .nan}\n")
    with pytest.raises(
        ConfigError,
        match=r"lone\.yaml -> .*sub\.yaml: splits\.train\."
        r"blend_epochized\[0\]: 'repetitions' must be a number > 0, got nan",
    ):
        blend_of([lone])

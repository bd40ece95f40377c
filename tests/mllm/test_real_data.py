# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Real data through Energon: metadata from headers, the scan tool, bad data, and training."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from launch import REPO, check, torchrun

from megatron.mllm.batch import sample_layout
from megatron.mllm.cli import scan_dataset
from megatron.mllm.data_energon import DataError, EnergonStream
from megatron.mllm.demo_data import (
    TOKENIZER_DIR,
    DemoSpec,
    demo_samples,
    document_samples,
    write_blend,
    write_energon_dataset,
)
from megatron.mllm.preprocess import AudioFeatures, ImageTiling
from megatron.mllm.tokenizer import load_tokenizer, train_tokenizer
from orchestration.packing import microbatch_indices
from orchestration.workload import SampleMeta

SPEC = DemoSpec(num_samples=40, num_shards=3, max_image_side=48, max_audio_seconds=0.8)
TILE, PATCH, MAX_TILES, MELS = 16, 4, 4, 16
WINDOW_SECONDS = 0.5  # short windows, so that some clips span two units


def _build(directory, samples, num_shards=2):
    write_energon_dataset(str(directory), samples, num_shards)
    return str(directory)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The test dataset (mixed image-text and audio-text) and its tokenizer."""
    root = tmp_path_factory.mktemp("energon")
    samples = demo_samples(SPEC)
    path = _build(root / "good", samples, SPEC.num_shards)
    captions = [json.loads(s["json"])["caption"] for s in samples]
    train_tokenizer(captions, os.path.join(path, TOKENIZER_DIR), SPEC.vocab_size)
    return path, samples, root


def _stream(path, window=WINDOW_SECONDS, tokenizer_of=None):
    tok_dir = os.path.join(tokenizer_of or path, TOKENIZER_DIR)
    tokenizer = load_tokenizer("HuggingFaceTokenizer", tok_dir)
    return EnergonStream(
        path, tokenizer, ImageTiling(TILE, PATCH, MAX_TILES), AudioFeatures(MELS, window), seed=3
    )


def test_metadata_from_headers_is_the_preprocessed_payload(dataset):
    path, samples, _ = dataset
    stream = _stream(path)
    assert len(stream) == len(samples)
    kinds = set()
    for i in range(len(stream)):
        raw = stream.read(i)
        meta = stream.sample_meta(raw)
        payload = stream.decode(raw, meta, with_features=True)
        ((encoder, units),) = payload.units.items()
        modality = "image" if encoder == "vision" else "audio"
        item = meta.items(modality)[0]
        kinds.add((modality, len(item.units) > 1))
        # Units and their tokens, exactly as the header said; features of the encoder's width.
        assert [u.shape[0] for u in units] == list(item.units), raw.name
        width = 3 * PATCH * PATCH if encoder == "vision" else MELS
        dtype = np.uint8 if encoder == "vision" else np.float32  # pixels move as bytes
        assert all(u.shape[1] == width and u.dtype == dtype for u in units)
        assert all(np.isfinite(u).all() for u in units)
        # Text where the packer reads text, in order; placeholders at the item.
        spans, runs = sample_layout(meta)
        text = np.concatenate([payload.tokens[a : a + n] for a, n in runs])
        assert text.tolist() == list(raw.text_ids)
        span = spans[0]
        assert not payload.tokens[span.start : span.start + span.length].any()
        assert meta.llm_tokens == payload.tokens.shape[0]
    # The data exercised one- and multi-unit items of both modalities.
    assert kinds == {("image", False), ("image", True), ("audio", False), ("audio", True)}


def test_scan_dataset_writes_the_trainers_metadata(dataset, tmp_path, capsys):
    path, _, _ = dataset
    out = tmp_path / "meta.jsonl"
    status = scan_dataset.main([
        path, "--output", str(out), "--image-tile-size", str(TILE), "--vision-patch-size",
        str(PATCH), "--image-max-tiles", str(MAX_TILES), "--audio-feature-dim", str(MELS),
    ])  # fmt: skip
    assert status == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    stream = _stream(path, window=30.0)
    expected = [stream.sample_meta(stream.read(i)) for i in range(len(stream))]
    assert [SampleMeta.from_json(x, "line") for x in lines] == expected
    printed = capsys.readouterr().out
    assert f"{len(expected)} samples read from JSONL" in printed
    assert "image+text" in printed and "audio+text" in printed


def _bad_samples(samples, what):
    bad = [dict(s) for s in samples[:8]]
    image = next(i for i, s in enumerate(bad) if "png" in s)
    if what == "image-header":
        bad[image]["png"] = b"this is not a png"
    elif what == "image-pixels":  # a valid header, its pixels cut off
        bad[image]["png"] = bad[image]["png"][:60]
    elif what == "missing-json":
        del bad[image]["json"]
    elif what == "missing-media":
        del bad[image]["png"]
    elif what == "unknown-type":
        bad[image]["json"] = json.dumps({"type": "video_caption", "caption": "x"}).encode()
    return bad, bad[image]["__key__"]


@pytest.mark.parametrize(
    "what,message",
    [
        ("image-header", "cannot read the image header"),
        ("missing-json", "missing field 'json'"),
        ("missing-media", "a caption sample needs one of the fields png, jpg, jpeg, webp"),
        (
            "unknown-type",
            "sample type 'video_caption' cannot be read (known: caption, "
            "audio_caption, vqa, interleaved)",
        ),
    ],
)
def test_bad_samples_give_one_error_line_naming_shard_and_key(dataset, what, message, capsys):
    path, samples, root = dataset
    bad, key = _bad_samples(samples, what)
    bad_path = _build(root / what, bad, num_shards=1)
    tok = os.path.join(path, TOKENIZER_DIR)
    assert scan_dataset.main([bad_path, "--tokenizer-model", tok]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: sample shard-000000.tar/{key}: {message}"), err
    assert err.count("\n") == 1


def test_a_truncated_image_fails_when_decoded_naming_it(dataset):
    path, samples, root = dataset
    bad, key = _bad_samples(samples, "image-pixels")
    stream = _stream(_build(root / "pixels", bad, num_shards=1), tokenizer_of=path)
    index = next(i for i in range(len(stream)) if stream.read(i).name.endswith(key))
    raw = stream.read(index)
    meta = stream.sample_meta(raw)
    with pytest.raises(DataError, match=f"sample shard-000000.tar/{key}: cannot decode the image"):
        stream.decode(raw, meta, with_features=True)


def samples_of(dataset):
    return dataset[1]


def test_empty_dataset_and_missing_tokenizer_are_errors(dataset, tmp_path, capsys):
    path, _, root = dataset
    # Energon prepares no empty shard: a dataset whose split lists no shard is empty.
    empty = _build(root / "empty", samples_of(dataset)[:1], num_shards=1)
    with open(os.path.join(empty, ".nv-meta", "split.yaml"), "w") as f:
        f.write("split_parts:\n  train: []\nexclude: []\n")
    tok = os.path.join(path, TOKENIZER_DIR)
    assert scan_dataset.main([empty, "--tokenizer-model", tok]) == 2
    assert capsys.readouterr().err.startswith(f"error: --data-path {empty}: the dataset is empty")
    missing = str(tmp_path / "no-tokenizer")
    assert scan_dataset.main([path, "--tokenizer-model", missing]) == 2
    assert capsys.readouterr().err == f"error: --tokenizer-model {missing}: no such directory\n"
    assert scan_dataset.main([str(tmp_path), "--tokenizer-model", tok]) == 2
    assert "is not an Energon dataset" in capsys.readouterr().err


TRAIN = [
    "--distributed-backend", "gloo", "--transformer-impl", "local",
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "128", "--max-position-embeddings", "128",
    "--vision-num-layers", "1", "--vision-patch-size", str(PATCH), "--audio-num-layers", "1",
    "--audio-feature-dim", str(MELS), "--image-tile-size", str(TILE),
    "--image-max-tiles", str(MAX_TILES), "--tokenizer-type", "HuggingFaceTokenizer",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "5", "--num-workers", "2",
]  # fmt: skip


def _chat_reply_targets(root, labels, tok) -> dict[str, int]:
    """Per sample id of the datasets ``root/LABEL`` read in the chat format, the tokens after
    each ``<|assistant|>`` up to and including the ``<|end|>`` that closes its turn."""
    tokenizer = load_tokenizer("HuggingFaceTokenizer", tok)
    assistant, end = tokenizer.token_id("<|assistant|>"), tokenizer.token_id("<|end|>")
    out = {}
    for label in labels:
        stream = EnergonStream(str(root / label), tokenizer, ImageTiling(TILE, PATCH, MAX_TILES),
                               AudioFeatures(MELS, WINDOW_SECONDS), seed=3, prompt_format="chat",
                               label=label)  # fmt: skip
        for i in range(len(stream)):
            raw, count, inside = stream.read(i), 0, False
            for t in raw.text_ids:
                count += inside
                inside = t == assistant or (inside and t != end)
            out[raw.name] = count
        stream.close()
    return out


@pytest.mark.multiproc
def test_two_ranks_train_on_their_own_samples_each_used_once(dataset):
    path, samples, root = dataset
    tok = os.path.join(path, TOKENIZER_DIR)
    out = root / "runs"
    out.mkdir()
    iters = 3
    args = [str(out), *TRAIN, "--data-path", path, "--tokenizer-model", tok,
            "--train-iters", str(iters), "--post-balance", "auto"]  # fmt: skip
    for what in ("image-header", "image-pixels"):
        bad, _ = _bad_samples(samples, what)
        bad_path = _build(root / f"train-{what}", bad, num_shards=1)
        args += ["---", what, *TRAIN, "--data-path", bad_path, "--tokenizer-model", tok,
                 "--train-iters", "1", "--post-balance", "auto"]  # fmt: skip
    # A mixture in one run: the captions blended with VQA samples and interleaved documents.
    docs = DemoSpec(num_documents=24, max_image_side=48, max_audio_seconds=0.8)
    _build(root / "docs", document_samples(docs), num_shards=1)
    write_blend(str(root / "mix.yaml"), [("good", 2.0), ("docs", 1.0)])
    args += ["---", "mixed", *TRAIN, "--data-path", str(root / "mix.yaml"),
             "--tokenizer-model", tok, "--train-iters", "4", "--post-balance", "auto",
             "--prompt-format", "chat"]  # fmt: skip
    check(torchrun(2, REPO / "tests" / "mllm" / "data_worker.py", args, timeout=240))
    records = [json.loads((out / f"train-rank{r}.json").read_text()) for r in (0, 1)]
    stream = _stream(path, window=30.0)
    metas = {m.sample_id: m for m in (stream.sample_meta(stream.read(i)) for i in range(40))}
    for it in range(iters):
        # Megatron's order: rank r loads exactly its sampler indices, and the gathered batch is
        # every rank's samples once.
        owns = [rec["iterations"][it]["own"] for rec in records]
        for rank, own in enumerate(owns):
            want = [k for mb in microbatch_indices(it, rank, 2, 2, 2) for k in mb]
            assert [k for k, _ in own] == want
        ids = records[0]["iterations"][it]["ids"]
        assert ids == records[1]["iterations"][it]["ids"]
        assert sorted(ids) == sorted(i for own in owns for _, i in own)
        assert len(set(ids)) == 8
        # Every sample's text is scored exactly once after balancing: the loss counts the
        # next-token targets of the batch's samples (all text positions but the first).
        rec = records[1]["iterations"][it]
        assert rec["loss_tokens"] == sum(metas[i].text_tokens - 1 for i in ids)
        assert np.isfinite(rec["loss_sum"])
    # Each rank read only its own samples, each once (headers and payload from one read).
    for rank, rec in enumerate(records):
        own = [i for x in rec["iterations"] for _, i in x["own"]]
        assert len(rec["reads"]) == len(own) == 4 * iters
        assert sorted(stream.read(i).name for i in rec["reads"]) == sorted(own)
    # Bad data stops both ranks with the same error, naming the sample; no hang.
    for what, message in (("image-header", "cannot read the image header"),
                          ("image-pixels", "cannot decode the image")):  # fmt: skip
        errors = [json.loads((out / f"{what}-rank{r}.json").read_text()) for r in (0, 1)]
        assert errors[0] == errors[1] and errors[0][0] == "WorkloadError", errors
        assert message in errors[0][1] and "shard-000000.tar/" in errors[0][1]
    # The mixed run trains on samples of both datasets, the ranks agreeing on every batch.
    mixed = [json.loads((out / f"mixed-rank{r}.json").read_text()) for r in (0, 1)]
    assert isinstance(mixed[0], dict), mixed[0]  # a record: it trained
    runs = [[(it["ids"], it["loss"]) for it in m["iterations"]] for m in mixed]
    assert runs[0] == runs[1]
    losses, ids = [loss for _, loss in runs[0]], [i for batch, _ in runs[0] for i in batch]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert {i.split("/")[0] for i in ids} == {"good", "docs"}
    # Chat scores the assistant's turns only: each iteration counts the reply tokens and their
    # closing <|end|> of its samples (a document without role entries is a user's turn: none).
    replies = _chat_reply_targets(root, ("good", "docs"), tok)
    for it in mixed[1]["iterations"]:
        assert it["loss_tokens"] == sum(replies[i] for i in it["ids"]), it["ids"]

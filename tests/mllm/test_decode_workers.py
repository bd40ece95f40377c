# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``--num-workers N``: real data's media decoded in worker processes, as in the main one."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from megatron.mllm.data_blend import BlendedStream
from megatron.mllm.data_energon import DataError, EnergonStream
from megatron.mllm.decode_pool import HEAVY_MODULES, DecodePool, DecodePoolError
from megatron.mllm.demo_data import (
    TOKENIZER_DIR,
    DemoSpec,
    demo_samples,
    document_samples,
    document_texts,
    write_energon_dataset,
)
from megatron.mllm.image_dynamic import DynamicResolution
from megatron.mllm.preprocess import AudioFeatures, ImageTiling
from megatron.mllm.tokenizer import load_tokenizer, train_tokenizer
from orchestration.packing import microbatch_indices

SPEC = DemoSpec(num_samples=24, num_shards=2, max_image_side=48, max_audio_seconds=0.8)
DOCS = DemoSpec(num_documents=12, max_image_side=40, max_audio_seconds=0.6)
TILING = ImageTiling(16, 4, 4)
AUDIO = AudioFeatures(16, 0.5)  # short windows: some clips span two units


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Captions (images and audio), documents (several items each), a tokenizer of both."""
    root = tmp_path_factory.mktemp("workers")
    captions, docs = demo_samples(SPEC), document_samples(DOCS)
    write_energon_dataset(str(root / "captions"), captions, SPEC.num_shards)
    write_energon_dataset(str(root / "docs"), docs, 1)
    texts = [json.loads(s["json"])["caption"] for s in captions] + document_texts(docs)
    train_tokenizer(texts, str(root / TOKENIZER_DIR), 384)
    return root, load_tokenizer("HuggingFaceTokenizer", str(root / TOKENIZER_DIR))


def _stream(path, tokenizer, workers=0, tiling=TILING, **kw):
    return EnergonStream(str(path), tokenizer, tiling, AUDIO, seed=3, num_workers=workers, **kw)


def _batches(stream, iters=3, mbs=2, num_mb=2):
    """Two DP ranks' payloads of ``iters`` iterations, as the loader asks for them."""
    out = []
    for it in range(iters):
        for rank in (0, 1):
            pairs = [(k, stream.meta(k)) for mb in microbatch_indices(it, rank, 2, mbs, num_mb)
                     for k in mb]  # fmt: skip
            out += stream.payloads(pairs, with_features=True)
    return out


def _assert_identical(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.tokens.dtype == w.tokens.dtype and np.array_equal(g.tokens, w.tokens)
        assert list(g.units) == list(w.units)
        for enc in w.units:
            assert len(g.units[enc]) == len(w.units[enc])
            for a, b in zip(g.units[enc], w.units[enc]):
                # Bit-identical: same dtype, shape and bytes (NaN-safe, unlike ==).
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("tiling", [TILING, DynamicResolution(4, 16 * 16, 48 * 48)],
                         ids=["tile", "dynamic"])  # fmt: skip
def test_two_workers_give_the_main_process_payloads_bit_for_bit(data, tiling):
    root, tok = data
    local = _stream(root / "captions", tok, 0, tiling)
    pooled = _stream(root / "captions", tok, 2, tiling)
    try:
        want, got = _batches(local), _batches(pooled)
        encoders = {e for p in want for e in p.units}
        assert encoders == {"vision", "audio"}  # both modalities went through the workers
        _assert_identical(got, want)
    finally:
        local.close()
        pooled.close()


def test_a_blend_decodes_every_dataset_on_its_one_pool(data):
    root, tok = data

    def blend(workers):
        streams = [_stream(root / n, tok, label=n) for n in ("captions", "docs")]
        return BlendedStream(streams, (2.0, 1.0), seed=5, num_workers=workers)

    local, pooled = blend(0), blend(2)
    try:
        want, got = _batches(local, iters=2), _batches(pooled, iters=2)
        assert {p.tokens.shape[0] for p in want}  # read something of both datasets
        _assert_identical(got, want)
    finally:
        local.close()
        pooled.close()


def test_an_undecodable_image_in_a_worker_names_the_sample_as_in_process(data, tmp_path):
    root, tok = data
    bad = [dict(s) for s in demo_samples(SPEC)[:6]]
    image = next(i for i, s in enumerate(bad) if "png" in s)
    bad[image]["png"] = bad[image]["png"][:60]  # a valid header, its pixels cut off
    write_energon_dataset(str(tmp_path / "bad"), bad, 1)
    messages = []
    for workers in (0, 1):
        stream = _stream(tmp_path / "bad", tok, workers)
        try:
            pairs = [(k, stream.meta(k)) for k in range(len(stream))]
            with pytest.raises(DataError) as e:
                stream.payloads(pairs)
            messages.append(str(e.value))
        finally:
            stream.close()
    key = bad[image]["__key__"]
    assert messages[0].startswith(f"sample shard-000000.tar/{key}: cannot decode the image")
    assert messages[1] == messages[0] and "\n" not in messages[0]


def test_a_worker_imports_neither_torch_nor_megatron_core(data):
    root, tok = data
    stream = _stream(root / "captions", tok, 1)
    try:
        stream.payloads([(k, stream.meta(k)) for k in range(4)])  # it has decoded images, audio
        (modules,) = stream._pool.modules()
        assert "PIL.Image" in modules and "megatron.mllm.preprocess" in modules
        heavy = [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)]
        assert heavy == []
    finally:
        stream.close()


def _jobs(data, n=6):
    root, tok = data
    stream = _stream(root / "captions", tok)
    raws = [stream.read(i) for i in range(n)]
    return [(stream.preprocessor(m), media) for r in raws for m, media in r.media], [
        r.name for r in raws for _ in r.media
    ]


def test_a_killed_worker_is_one_error_naming_the_stream_and_rank_not_a_hang(data, monkeypatch):
    jobs, names = _jobs(data)
    monkeypatch.setenv("RANK", "3")
    pool = DecodePool(2, "--data-path demo", timeout_s=60)
    try:
        assert pool.wait_ready() < 60
        assert len(pool.map(jobs, names)) == len(jobs)
        os.kill(pool.pids[1], signal.SIGKILL)
        start = time.perf_counter()
        with pytest.raises(DecodePoolError, match=r"--data-path demo on rank 3: decode worker "
                           rf"pid {pool.pids[1]} died \(killed by signal 9\)"):  # fmt: skip
            pool.map(jobs, names)
        assert time.perf_counter() - start < 10
        with pytest.raises(DecodePoolError, match="died"):  # broken for good, and says so
            pool.map(jobs, names)
    finally:
        pool.close()
    assert all(p is not None for p in _exit_codes(pool))  # no orphans: all reaped


def test_a_stuck_worker_times_out_naming_the_bound(data):
    jobs, names = _jobs(data)
    pool = DecodePool(1, "--data-path demo", timeout_s=1.0)
    try:
        pool.wait_ready()
        os.kill(pool.pids[0], signal.SIGSTOP)
        with pytest.raises(DecodePoolError, match=r"gave no answer in 1 s while decoding sample "
                           r".*--distributed-timeout-minutes"):  # fmt: skip
            pool.map(jobs, names)
    finally:
        pool.close()  # kills the stopped worker
    assert all(p is not None for p in _exit_codes(pool))


def test_close_stops_the_workers(data):
    root, tok = data
    stream = _stream(root / "captions", tok, 2)
    pool = stream._pool
    assert 0 < stream.workers_ready() < 60  # the start-up: launch until both are ready
    assert _stream(root / "captions", tok).workers_ready() is None
    stream.close()
    stream.close()  # idempotent
    assert all(p is not None for p in _exit_codes(pool))


def _exit_codes(pool):
    return [w.process.poll() for w in pool._workers]

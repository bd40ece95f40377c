# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Real data and ``--overlong-samples truncate``; dynamic resolution through the scan tool."""

from __future__ import annotations

import json
import os

import numpy as np
from test_real_data import MELS, PATCH, TOKENIZER_DIR, _stream, dataset  # noqa: F401 (fixture)

from megatron.mllm.batch import sample_layout
from megatron.mllm.cli import scan_dataset
from megatron.mllm.data_energon import EnergonStream
from megatron.mllm.image_dynamic import DynamicResolution
from megatron.mllm.overlong import fit_batch
from megatron.mllm.preprocess import AudioFeatures
from megatron.mllm.tokenizer import load_tokenizer
from orchestration.metadata import GatheredMetadata
from orchestration.workload import SampleMeta


def test_truncate_keeps_the_text_ids_prefix_and_the_placeholders(dataset):  # noqa: F811
    path, _, _ = dataset
    stream = _stream(path)
    raws = [stream.read(i) for i in range(12)]
    metas = [stream.sample_meta(raw) for raw in raws]
    # The limit cuts most samples' captions but leaves every item and <s> </s> room.
    limit = max(m.llm_tokens - m.text_tokens for m in metas) + 4
    ranks = [list(enumerate(metas[:6])), list(enumerate(metas[6:]))]
    fitted = fit_batch(GatheredMetadata.from_rank_samples(ranks), limit, "truncate")
    assert fitted.truncated >= 4  # (5 of these 12)
    own = [meta for r in (0, 1) for _, meta in fitted.own([ranks[r]], r)[0]]
    cut = 0
    for raw, meta, short in zip(raws, metas, own):
        assert short.llm_tokens <= limit and short.image == meta.image and short.audio == meta.audio
        kept = short.text_tokens
        payload = stream.decode(raw, short, with_features=False)
        spans, runs = sample_layout(short)
        text = np.concatenate([payload.tokens[a : a + n] for a, n in runs]).tolist()
        ids = list(raw.text_ids)
        if kept < len(ids):
            cut += 1
            assert text == ids[: kept - 1] + ids[-1:]  # the prefix, then </s>
        else:
            assert text == ids
        (span,) = spans
        assert span.length == meta.items(span.modality)[0].llm_tokens
        assert not payload.tokens[span.start : span.start + span.length].any()
        assert payload.tokens.shape[0] == short.llm_tokens
    assert cut == fitted.truncated


def test_dynamic_resolution_scan_matches_the_decoded_payload(
    dataset, tmp_path, capsys
):  # noqa: F811
    path, _, _ = dataset
    prep = DynamicResolution(PATCH, 16 * 16, 48 * 48)
    tokenizer = load_tokenizer("HuggingFaceTokenizer", os.path.join(path, TOKENIZER_DIR))
    stream = EnergonStream(path, tokenizer, prep, AudioFeatures(MELS), seed=3)
    images = 0
    for i in range(len(stream)):
        raw = stream.read(i)
        meta = stream.sample_meta(raw)
        if [m for m, _ in raw.media] == ["image"]:
            images += 1
            payload = stream.decode(raw, meta, with_features=True)
            assert [u.shape[0] for u in payload.units["vision"]] == list(meta.image[0].units)
    assert images > 5
    out = tmp_path / "meta.jsonl"
    flags = ["--image-preprocess", "dynamic", "--vision-patch-size", str(PATCH),
             "--audio-feature-dim", str(MELS)]  # fmt: skip
    assert scan_dataset.main([path, "--output", str(out), *flags, "--min-pixels", "256",
                              "--max-pixels", str(48 * 48)]) == 0  # fmt: skip
    scanned = [SampleMeta.from_json(json.loads(x), "line") for x in out.read_text().splitlines()]
    expected = [
        EnergonStream(path, tokenizer, prep, AudioFeatures(MELS), seed=0).sample_meta(
            stream.read(i)
        )
        for i in range(len(stream))
    ]
    assert scanned == expected
    capsys.readouterr()
    assert scan_dataset.main([path, *flags, "--min-pixels", "900", "--max-pixels", "800"]) == 2
    assert capsys.readouterr().err == "error: --min-pixels 900 is more than --max-pixels 800\n"

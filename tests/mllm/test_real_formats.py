# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Real data's sample types, prompt formats, text layouts and blends of datasets."""

from __future__ import annotations

import io
import json
import os
import re

import numpy as np
import pytest
import torch

from megatron.mllm.arguments import ConfigError
from megatron.mllm.batch import ChatTurns, build_microbatch, sample_layout
from megatron.mllm.cli import scan_dataset
from megatron.mllm.data_blend import BLOCK, BlendedStream, blend_choices, blend_of
from megatron.mllm.data_energon import EnergonStream
from megatron.mllm.demo_data import (
    TOKENIZER_DIR,
    DemoSpec,
    document_samples,
    document_texts,
    write_blend,
    write_energon_dataset,
)
from megatron.mllm.preprocess import AudioFeatures, ImageTiling
from megatron.mllm.tokenizer import load_tokenizer, train_tokenizer
from orchestration.metadata import GatheredMetadata, PlanError, encode_rank_metadata
from orchestration.workload import Item, SampleMeta, WorkloadError, read_jsonl, write_jsonl

SPEC = DemoSpec(num_documents=24, max_image_side=40, max_audio_seconds=0.6)
TILE, PATCH, MAX_TILES, MELS = 16, 4, 4, 16


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """A dataset of VQA samples and interleaved documents, and a tokenizer of its texts."""
    root = tmp_path_factory.mktemp("formats")
    samples = document_samples(SPEC)
    path = str(root / "docs")
    write_energon_dataset(path, samples, 2)
    tok_dir = os.path.join(path, TOKENIZER_DIR)
    train_tokenizer(document_texts(samples), tok_dir, SPEC.vocab_size)
    return (
        path,
        {s["__key__"]: s for s in samples},
        root,
        load_tokenizer("HuggingFaceTokenizer", tok_dir),
    )


def _stream(path, tokenizer, prompt_format="caption", label=""):
    tiling = ImageTiling(TILE, PATCH, MAX_TILES)
    return EnergonStream(path, tokenizer, tiling, AudioFeatures(MELS, 0.3), seed=3,
                         prompt_format=prompt_format, label=label)  # fmt: skip


def _expected_tokens(info, meta, tk, chat):
    """The sample's token ids written out from its JSON alone (0 at every item position)."""
    items = iter(meta.document_items())

    def item():
        return [0] * next(items)[2].llm_tokens

    def text(s):  # a question's <image> is where the image goes
        head, _, tail = s.partition("<image>")
        return tk.encode(head) + (item() + tk.encode(tail) if "<image>" in s else [])

    bos, eos, user, assistant, end = (
        tk.token_id(t) for t in ("<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>")
    )
    if info["type"] == "interleaved":
        body = [
            x for e in info["sequence"] for x in (tk.encode(e) if isinstance(e, str) else item())
        ]
        return [bos, *([user] if chat else []), *body, *([end] if chat else []), eos]
    question = info["context"]
    first = [] if "<image>" in question else item()
    if chat:
        return [bos, user, *first, *text(question), end, assistant, *tk.encode(info["answer"]),
                end, eos]  # fmt: skip
    return [bos, *first, *text(question), *tk.encode(" " + info["answer"]), eos]


@pytest.mark.parametrize("prompt_format", ["caption", "chat"])
def test_items_sit_at_their_document_positions_and_headers_give_the_payload(
    documents, prompt_format
):
    path, samples, _, tk = documents
    stream = _stream(path, tk, prompt_format)
    kinds = set()
    for i in range(len(stream)):
        raw = stream.read(i)
        meta = stream.sample_meta(raw)
        payload = stream.decode(raw, meta, with_features=True)
        info = json.loads(samples[raw.name.rsplit("/", 1)[1]]["json"])
        # Every token of the sequence: text from the document, placeholders at the items.
        assert payload.tokens.tolist() == _expected_tokens(info, meta, tk, prompt_format == "chat")
        assert meta.llm_tokens == payload.tokens.shape[0]
        # Each item's units, exactly as the headers said, in document order per encoder.
        for encoder, modality in (("vision", "image"), ("audio", "audio")):
            want = [u for item in meta.items(modality) for u in item.units]
            assert [f.shape[0] for f in payload.units.get(encoder, [])] == want, raw.name
        spans, _ = sample_layout(meta)
        assert [s.modality for s in spans] == [m for m, _ in raw.media]
        kinds.add((info["type"], meta.item_order is not None, "<image>" in info.get("context", "")))
    # VQA with and without a placed image; documents in and out of modality order.
    assert kinds >= {("vqa", False, False), ("vqa", False, True), ("interleaved", True, False),
                     ("interleaved", False, False)}  # fmt: skip


def test_a_placeholder_in_a_caption_places_its_item(documents, tmp_path):
    path, samples, _, tk = documents
    image = next(s for s in samples.values() if "png" in s)["png"]
    caption = {
        "__key__": "cap",
        "png": image,
        "json": json.dumps({"type": "caption", "caption": "look <image> here"}).encode(),
    }
    plain = {"__key__": "plain", "png": image,
             "json": json.dumps({"type": "caption", "caption": "look here"}).encode()}  # fmt: skip
    write_energon_dataset(str(tmp_path / "cap"), [caption, plain], 1)
    stream = _stream(str(tmp_path / "cap"), tk)
    by_key = {stream.read(i).name: stream.read(i) for i in range(2)}
    placed = by_key["shard-000000.tar/cap"]
    meta = stream.sample_meta(placed)
    tokens = stream.decode(placed, meta, False).tokens.tolist()
    n = meta.image[0].llm_tokens
    head = [tk.token_id("<s>"), *tk.encode("look ")]
    assert tokens == head + [0] * n + tk.encode(" here") + [tk.token_id("</s>")]
    # Without a placeholder the caption format keeps its even split (no text layout).
    assert stream.sample_meta(by_key["shard-000000.tar/plain"]).text_runs is None


ENCODERS = ["vision", "audio"]

MULTI_TURN = [
    # Turns by role entries: a user's question on an image, the assistant's answer, a second
    # exchange on a clip; an item in the assistant's turn is not a target either.
    [{"role": "user"}, "what is ", {"media": "img0.png"}, "?", {"role": "assistant"},
     "the digit one", {"role": "user"}, "and ", {"media": "clip1"}, {"role": "assistant"},
     "a tone", {"media": "img2.png"}, " for two"],
    # Text before the first role entry is the user's.
    ["look ", {"media": "img0.png"}, {"role": "assistant"}, "a digit"],
]  # fmt: skip


def _chat_document(sequence, meta, tk):
    """A chat document's tokens, and per position whether it is a target of the loss (a text
    token of an assistant's turn or the <|end|> closing it), written out from its sequence."""
    items = iter(meta.document_items())
    tokens, scored, role = [tk.token_id("<s>")], [False], None
    for e in sequence:
        if isinstance(e, dict) and "role" in e:
            if role is not None:
                tokens.append(tk.token_id("<|end|>"))
                scored.append(role == "assistant")
            role = e["role"]
            tokens.append(tk.token_id(f"<|{role}|>"))
            scored.append(False)
            continue
        if role is None:
            role = "user"
            tokens.append(tk.token_id("<|user|>"))
            scored.append(False)
        ids = tk.encode(e) if isinstance(e, str) else [0] * next(items)[2].llm_tokens
        tokens += ids
        scored += [role == "assistant" and isinstance(e, str)] * len(ids)
    tokens += [tk.token_id("<|end|>"), tk.token_id("</s>")]
    scored += [role == "assistant", False]
    return tokens, scored


def _scored(info, meta, tk):
    """Per position of a chat sample (:func:`_expected_tokens`), whether the loss scores it."""
    if info["type"] == "interleaved":  # one user turn without role entries: nothing
        return _chat_document(info["sequence"], meta, tk)[1]
    n, reply = meta.llm_tokens, len(tk.encode(info["answer"])) + 1  # the answer and its <|end|>
    return [False] * (n - reply - 1) + [True] * reply + [False]


def _masks(scored_per_sample, tokens_per_sample, pad):
    """The loss mask and labels of samples packed in order: the target of position i is token
    i + 1 of the same sample, where that one is scored; then ``pad`` unscored positions."""
    mask, labels = [], []
    for scored, tokens in zip(scored_per_sample, tokens_per_sample):
        mask += [float(x) for x in scored[1:]] + [0.0]
        labels += [t if x else 0 for t, x in zip(tokens[1:], scored[1:])] + [0]
    return mask + [0.0] * pad, labels + [0] * pad


def _text_mask(meta):
    """The mask without chat turns: 1 where the next position is a text token."""
    is_text = np.ones(meta.llm_tokens, dtype=bool)
    for span in sample_layout(meta)[0]:
        is_text[span.start : span.start + span.length] = False
    return [float(x) for x in is_text[1:]] + [0.0]


@pytest.mark.parametrize("prompt_format", ["caption", "chat"])
def test_chat_scores_only_the_assistant_turns_captions_every_text_token(documents, prompt_format):
    path, samples, _, tk = documents
    stream = _stream(path, tk, prompt_format)
    pairs, infos = [], []
    for i in range(len(stream)):
        raw = stream.read(i)
        meta = stream.sample_meta(raw)
        pairs.append((meta, stream.decode(raw, meta, with_features=False)))
        infos.append(json.loads(samples[raw.name.rsplit("/", 1)[1]]["json"]))
    total = sum(meta.llm_tokens for meta, _ in pairs)
    turns = stream.chat_turns
    packed = build_microbatch(pairs, ENCODERS, pad_to=total + 5, with_features=False,
                              chat_turns=turns).language  # fmt: skip
    # Without chat turns (the caption format's None; chat with None): every next text token,
    # as the packer always masked.
    old = [x for meta, _ in pairs for x in _text_mask(meta)] + [0.0] * 5
    plain = build_microbatch(pairs, ENCODERS, pad_to=total + 5, with_features=False).language
    assert plain.loss_mask.tolist() == old
    if prompt_format == "caption":
        assert turns is None
        assert torch.equal(packed.loss_mask, plain.loss_mask)
        assert torch.equal(packed.labels, plain.labels)
        return
    assert turns == ChatTurns(*(tk.token_id(t) for t in ("<|user|>", "<|assistant|>", "<|end|>")))
    scored = [_scored(info, meta, tk) for info, (meta, _) in zip(infos, pairs)]
    mask, labels = _masks(scored, [p.tokens.tolist() for _, p in pairs], 5)
    assert packed.loss_mask.tolist() == mask
    assert packed.labels.tolist() == labels
    # VQA answers are scored; documents without role entries are a user's turn: not scored.
    assert {info["type"] for info, s in zip(infos, scored) if any(s)} == {"vqa"}


def test_role_entries_make_the_turns_of_a_chat_document(documents, tmp_path):
    path, samples, _, tk = documents
    image = next(s for s in samples.values() if "png" in s)["png"]
    clip = next(k for s in samples.values() for k in s if k.startswith("clip"))
    audio = next(s[clip] for s in samples.values() if clip in s)
    clip_part = "clip1." + clip.rsplit(".", 1)[1]
    sequences = [[dict(media=clip_part) if e == {"media": "clip1"} else e for e in seq]
                 for seq in MULTI_TURN]  # fmt: skip
    docs = [
        {"__key__": f"doc{j}", "img0.png": image, "img2.png": image, clip_part: audio,
         "json": json.dumps({"type": "interleaved", "sequence": seq}).encode()}
        for j, seq in enumerate(sequences)
    ]  # fmt: skip
    write_energon_dataset(str(tmp_path / "turns"), docs, 1)
    for prompt_format in ("chat", "caption"):
        stream = _stream(str(tmp_path / "turns"), tk, prompt_format)
        by_key = {}
        for i in range(len(stream)):
            raw = stream.read(i)
            meta = stream.sample_meta(raw)
            by_key[raw.name.rsplit("/", 1)[1]] = (meta, stream.decode(raw, meta, False))
        pairs = [by_key[f"doc{j}"] for j in range(len(sequences))]
        packed = build_microbatch(pairs, ENCODERS, with_features=False,
                                  chat_turns=stream.chat_turns).language  # fmt: skip
        if prompt_format == "caption":  # role entries hold no text; every text token scored
            for seq, (meta, payload) in zip(sequences, pairs):
                items = iter(meta.document_items())
                body = [x for e in seq if "role" not in e
                        for x in (tk.encode(e) if isinstance(e, str)
                                  else [0] * next(items)[2].llm_tokens)]  # fmt: skip
                assert payload.tokens.tolist() == [tk.token_id("<s>"), *body, tk.token_id("</s>")]
            assert packed.loss_mask.tolist() == [x for m, _ in pairs for x in _text_mask(m)]
            continue
        written = [_chat_document(seq, meta, tk) for seq, (meta, _) in zip(sequences, pairs)]
        assert [p.tokens.tolist() for _, p in pairs] == [t for t, _ in written]
        mask, labels = _masks([s for _, s in written], [t for t, _ in written], 0)
        assert packed.loss_mask.tolist() == mask
        assert packed.labels.tolist() == labels
        # Two replies and their <|end|>s in the first document, one in the second.
        end = tk.token_id("<|end|>")
        assert sum(1 for t, x in zip(packed.labels.tolist(), mask) if x and t == end) == 3


BAD = {
    "missing-part": ({"type": "interleaved", "sequence": ["a", {"media": "img9.png"}]},
                     "'sequence'[1] names a missing field 'img9.png'"),
    "bad-entry": ({"type": "interleaved", "sequence": ["a", 7]},
                  "'sequence'[1] must be a text string or {\"media\": PART}, got 7"),
    "not-media": ({"type": "interleaved", "sequence": [{"media": "notes.txt"}]},
                  "'sequence'[0] names part 'notes.txt', which is not an image"),
    "placeholder": ({"type": "interleaved", "sequence": ["see <image>"]},
                    "its text holds the placeholder <image>; an interleaved document"),
    "bad-role": ({"type": "interleaved", "sequence": [{"role": "system"}, "a"]},
                 "'sequence'[0] has role \"system\"; a role is user or assistant"),
    "no-answer": ({"type": "vqa", "context": "what?"}, "missing field 'answer' (a string)"),
    "two-images": ({"type": "vqa", "context": "<image> or <image>?", "answer": "x"},
                   "its text holds the placeholders <image>, <image>; its one image"),
}  # fmt: skip


@pytest.mark.parametrize("what", sorted(BAD))
def test_a_malformed_document_or_vqa_sample_is_one_error_line(documents, what, capsys):
    path, samples, root, _ = documents
    info, message = BAD[what]
    image = next(s for s in samples.values() if "png" in s)["png"]
    bad = {"__key__": "bad", "json": json.dumps(info).encode(), "png": image, "img0.png": image}
    bad_path = str(root / f"bad-{what}")
    write_energon_dataset(bad_path, [bad], 1)
    tok = os.path.join(path, TOKENIZER_DIR)
    assert scan_dataset.main([bad_path, "--tokenizer-model", tok]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: sample shard-000000.tar/bad: {message}"), err
    assert err.count("\n") == 1


def _splitmix(x):
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def _draw(seed, weights, k):
    """The dataset stream index ``k`` draws, with Python integers and fractions."""
    u = (_splitmix(_splitmix(seed) ^ k) >> 11) / (1 << 53)
    total, acc = sum(weights), 0.0
    for d, w in enumerate(weights):
        acc += w
        if u < acc / total:
            return d
    return len(weights) - 1


class _Counting:
    """Stands in for a dataset's stream: records which of its indices were asked for."""

    def __init__(self):
        self.asked = []

    def __len__(self):
        return 10

    def meta(self, j):
        self.asked.append(j)
        return j


def test_a_blend_draws_by_weight_from_seed_and_index():
    weights, n = (2.0, 1.0, 0.5), 700
    draws = [_draw(11, weights, k) for k in range(n)]
    assert blend_choices(11, weights, np.arange(n)).tolist() == draws
    # Counts near the weights' shares (within 4 binomial standard deviations).
    for d, w in enumerate(weights):
        p = w / sum(weights)
        assert abs(draws.count(d) - n * p) <= 4 * (n * p * (1 - p)) ** 0.5
    # Each index is its dataset's next own index; asked in any order, or across a block edge.
    streams = [_Counting() for _ in weights]
    blend = BlendedStream(streams, weights, seed=11)
    order = list(range(n))[::-1] + [BLOCK + 5, BLOCK - 1]
    got = {k: (blend.source(k), blend.meta(k)) for k in order}
    for k in range(n):
        d = draws[k]
        assert got[k] == ((d, draws[:k].count(d)), draws[:k].count(d))
    edge = blend_choices(11, weights, np.arange(BLOCK + 6))
    for k in (BLOCK - 1, BLOCK + 5):
        d = int(edge[k])
        assert got[k][0] == (d, int(np.count_nonzero(edge[:k] == d)))
    assert blend_choices(12, weights, np.arange(n)).tolist() != draws


def test_data_path_blends_and_metadataset_yaml(documents, tmp_path, capsys):
    path, _, root, tk = documents
    other = str(root / "docs2")
    write_energon_dataset(other, document_samples(DemoSpec(num_documents=6, seed=9)), 1)
    t = "train"
    assert list(blend_of(["3", path, "1", other])) == [(3.0, path, path, t), (1.0, other, other, t)]
    assert list(blend_of([path, other])) == [(1.0, path, path, t), (1.0, other, other, t)]
    with pytest.raises(ConfigError, match="give weights and paths in pairs"):
        blend_of(["3", path, other])
    with pytest.raises(ConfigError, match=f"the weight of {other} must be > 0"):
        blend_of(["1", path, "0", other])
    yaml_path = str(root / "mix.yaml")
    write_blend(yaml_path, [("docs", 2.0), ("docs2", 1.0)])
    assert list(blend_of([yaml_path])) == [(2.0, path, "docs", t), (1.0, other, "docs2", t)]
    # A nested metadataset is drawn with its entry's weight, shared by its own datasets in
    # proportion to theirs; its datasets are named from the outer YAML's directory.
    third = str(root / "sub" / "docs3")
    write_energon_dataset(third, document_samples(DemoSpec(num_documents=4, seed=5)), 1)
    write_blend(str(root / "sub" / "inner.yaml"), [("docs3", 3.0), ("../docs2", 1.0)])
    write_blend(str(root / "outer.yaml"), [("docs", 1.0), ("sub/inner.yaml", 2.0)])
    assert list(blend_of([str(root / "outer.yaml")])) == [
        (1.0, path, "docs", t), (1.5, third, "sub/docs3", t), (0.5, other, "docs2", t)
    ]  # fmt: skip
    write_blend(str(root / "twice.yaml"), [("docs2", 1.0), ("sub/inner.yaml", 1.0)])
    with pytest.raises(ConfigError, match="dataset .*docs2 is named twice"):
        blend_of([str(root / "twice.yaml")])
    write_blend(str(root / "sub" / "loop.yaml"), [("docs3", 1.0), ("../cycle.yaml", 1.0)])
    write_blend(str(root / "cycle.yaml"), [("docs", 1.0), ("sub/loop.yaml", 1.0)])
    with pytest.raises(ConfigError, match=r"cycle\.yaml -> .*loop\.yaml: splits\.train\.blend"
                       r"\[1\]: \.\./cycle\.yaml includes itself"):  # fmt: skip
        blend_of([str(root / "cycle.yaml")])
    write_blend(str(root / "missing.yaml"), [("docs", 1.0), ("sub/none.yaml", 1.0)])
    with pytest.raises(ConfigError, match=r"metadataset sub/none\.yaml .* is not a file"):
        blend_of([str(root / "missing.yaml")])
    # A checkpoint records the blend: another weight or dataset draws another order.
    streams = [_stream(path, tk, label="docs"), _stream(other, tk, label="docs2")]
    ident = BlendedStream(streams, (2.0, 1.0), seed=3).identity()
    assert ident[1] == 30 and ident[3] == 3 and ident[0] == f"2 {path} 1 {other}"
    assert BlendedStream(streams, (2.0, 1.0), seed=3).identity() == ident
    assert BlendedStream(streams, (1.0, 1.0), seed=3).identity()[2] != ident[2]
    assert BlendedStream(streams[::-1], (1.0, 2.0), seed=3).identity()[2] != ident[2]
    # The files of each item, and a dropped sample's bytes forgotten, through the blend.
    blend = BlendedStream(streams, (2.0, 1.0), seed=3)
    for k in range(6):
        meta, (d, j) = blend.meta(k), blend.source(k)
        raw = streams[d]._raw[j]
        media = blend.encoded_media(k)
        assert {m: len(v) for m, v in media.items()} == {
            m: len(meta.items(m)) for m in ("image", "audio") if meta.items(m)
        }
        assert sorted(x for v in media.values() for x in v) == sorted(b for _, b in raw.media)
        blend.discard(k)
        assert j not in streams[d]._raw
    # Scanning the YAML reads both datasets, ids naming each.
    out = tmp_path / "mix.jsonl"
    tok = os.path.join(path, TOKENIZER_DIR)
    assert scan_dataset.main([yaml_path, "--tokenizer-model", tok, "--output", str(out)]) == 0
    ids = [m.sample_id for m in read_jsonl(out)]
    assert len(ids) == 30 and ids[0].startswith("docs/shard-") and ids[-1].startswith("docs2/")
    capsys.readouterr()
    bad = {
        "__class__: Metadataset\n": "not an Energon metadataset (needs __class__: MetadatasetV2",
        "__class__: MetadatasetV2\nsplits:\n  train:\n    blend: []\n": "must be a non-empty list",
        "__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - path: nowhere\n":
            "splits.train.blend[0]: dataset nowhere",
        "__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - path: docs\n"
        "        weight: -1\n": "splits.train.blend[0]: 'weight' must be a number > 0",
        "__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - path: docs\n"
        "        shuffle: 3\n": "unknown keys ['shuffle']",
        "splits: [": "cannot read the metadataset YAML",
    }  # fmt: skip
    for text, message in bad.items():
        with open(yaml_path, "w") as f:
            f.write(text)
        assert scan_dataset.main([yaml_path, "--tokenizer-model", tok]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --data-path {yaml_path}: ") and message in err, err
        assert err.count("\n") == 1


DOC = SampleMeta(
    "d0", 12, image=(Item((64,), 16), Item((16, 16), 8)), audio=(Item((30,), 8),),
    text_runs=(3, 5, 0, 4), item_order=("image", "audio", "image"),
)  # fmt: skip
PLAIN = SampleMeta("p0", 7, image=(Item((4,), 2),), audio=(Item((8,), 2),))


def test_text_layouts_round_trip_through_jsonl_and_the_metadata_gather():
    buf = io.StringIO()
    placed = SampleMeta("c0", 6, audio=(Item((9,), 3),), text_runs=(2, 4))
    write_jsonl([DOC, PLAIN, placed], buf)
    lines = buf.getvalue().splitlines()
    assert json.loads(lines[0])["text_runs"] == [3, 5, 0, 4] and "text_runs" not in lines[1]
    assert [SampleMeta.from_json(json.loads(x), "l") for x in lines] == [DOC, PLAIN, placed]
    # The layout in the sequence: text runs of the given lengths around items in document order.
    spans, runs = sample_layout(DOC)
    assert [(s.modality, s.index, s.start) for s in spans] == [
        ("image", 0, 3), ("audio", 0, 24), ("image", 1, 32)
    ]  # fmt: skip
    assert runs == [(0, 3), (19, 5), (32, 0), (40, 4)]
    # The all-gather's wire format, with int32 arrays too: the same samples and digest.
    ranks = [[(0, DOC), (1, PLAIN)], [(2, PLAIN), (3, placed), (4, DOC)]]
    md = GatheredMetadata.from_rank_samples(ranks)
    flat = [encode_rank_metadata(r).astype(np.int32) for r in ranks]
    again = GatheredMetadata.from_flat(flat, sample_ids=md.sample_ids)
    assert [again.sample_meta(s) for s in range(5)] == [DOC, PLAIN, PLAIN, placed, DOC]
    assert again.digest() == md.digest()
    # Without layouts there is no tail: the encoding and digest of layout-free samples.
    assert encode_rank_metadata([(0, PLAIN)]).size == 4 + 2 + 4 * 2 + 2
    moved = SampleMeta("d0", 12, image=DOC.image, audio=DOC.audio, text_runs=(3, 5, 1, 3),
                       item_order=DOC.item_order)  # fmt: skip
    assert (
        GatheredMetadata.from_rank_samples([[(0, moved)]]).digest()
        != GatheredMetadata.from_rank_samples([[(0, DOC)]]).digest()
    )
    cut = encode_rank_metadata([(0, DOC)])[:-1]
    with pytest.raises(PlanError, match="DP rank 0: malformed text-layout tail"):
        GatheredMetadata.from_flat([cut])


@pytest.mark.parametrize(
    "runs,order,message",
    [
        ((3, 5), None, "'text_runs' has 2 runs for 3 items"),
        ((3, 5, 0, 5), None, "'text_runs' sum to 13, 'text_tokens' is 12"),
        ((3, 5, 0, 4), ("image",) * 3, "'item_order' ['image', 'image', 'image'] does not list"),
    ],
)
def test_a_bad_text_layout_names_the_line(tmp_path, runs, order, message):
    obj = DOC.to_json() | {"text_runs": list(runs)}
    if order:
        obj["item_order"] = list(order)
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(obj) + "\n")
    with pytest.raises(WorkloadError, match=re.escape(f"{path}:1 (sample 'd0'): {message}")):
        read_jsonl(path)

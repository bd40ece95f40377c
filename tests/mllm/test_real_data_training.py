# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Training on a real Energon dataset: every layout learns what one process learns, every
sample is trained once, the logged counts are the scanned metadata's, and a resume mid-epoch
is exact (and refused on another dataset or seed).

Two launches in all: 2 gloo ranks train DP=2 without and with post-balancing and PP=2 with the
dynamic pipeline, resume the balanced run and try two refused resumes; one process trains the
DP=1 reference. The dataset holds 200 mixed image-text and audio-text samples and an iteration
24 of them, so the 10 iterations cross the epoch boundary inside iteration 9 (stream indices
192..215) and the resume from iteration 5 starts mid-epoch (index 120).
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import numpy as np
import pytest
from launch import REPO, check, torchrun

from megatron.mllm.cli import scan_dataset
from megatron.mllm.data_state import (
    ENERGON,
    WORKLOAD,
    StreamSource,
    resume_problem,
    saved_state,
    shard_index_fingerprint,
)
from megatron.mllm.demo_data import TOKENIZER_DIR, DemoSpec, demo_samples, write_energon_dataset
from megatron.mllm.tokenizer import train_tokenizer
from orchestration.packing import microbatch_indices
from orchestration.workload import SampleMeta

SPEC = DemoSpec(num_samples=200, num_shards=3, max_image_side=48, max_audio_seconds=0.8)
TILE, PATCH, MAX_TILES, MELS = 16, 4, 4, 16
SEED, GBS, ITERS, RESUME_AT = 5, 24, 10, 5
WORKER = REPO / "tests" / "mllm" / "data_worker.py"

TRAIN = [
    "--distributed-backend", "gloo", "--transformer-impl", "local",
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "128", "--max-position-embeddings", "128",
    "--vision-num-layers", "2", "--vision-patch-size", str(PATCH), "--audio-num-layers", "2",
    "--audio-feature-dim", str(MELS), "--image-tile-size", str(TILE),
    "--image-max-tiles", str(MAX_TILES), "--tokenizer-type", "HuggingFaceTokenizer",
    "--micro-batch-size", "2", "--global-batch-size", str(GBS), "--lr", "1e-3",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--num-workers", "2",
    "--train-iters", str(ITERS),
]  # fmt: skip
# Costs from the FLOPs model throughout (no fit to measured times): every run plans alike, so
# the resumed run is compared bit for bit over all its iterations.
BALANCED = ["--post-balance", "auto", "--cost-fit-warmup", "64"]
CONFIGS = {
    "dp2-none": ["--post-balance", "none"],
    "dp2-auto": BALANCED,
    "pp2-dynamic": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic",
                    "--schedule-search-budget-ms", "0"],  # fmt: skip
}
"""The 2-rank layouts compared with the DP=1 reference."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The dataset, its tokenizer, and a copy whose split leaves out its last shard."""
    root = tmp_path_factory.mktemp("energon")
    samples = demo_samples(SPEC)
    path = str(root / "data")
    write_energon_dataset(path, samples, SPEC.num_shards)
    captions = [json.loads(s["json"])["caption"] for s in samples]
    train_tokenizer(captions, os.path.join(path, TOKENIZER_DIR), SPEC.vocab_size)
    fewer = str(root / "fewer")
    shutil.copytree(path, fewer)
    with open(os.path.join(fewer, ".nv-meta", "split.yaml"), "w") as f:
        f.write("split_parts:\n  train:\n  - shard-000000.tar\n  - shard-000001.tar\nexclude: []\n")
    return path, fewer, root


def _flags(path, name, out):
    tok = os.path.join(path, TOKENIZER_DIR)
    return [*TRAIN, "--data-path", path, "--tokenizer-model", tok, "--seed", str(SEED),
            "--metrics-jsonl", str(out / f"{name}.jsonl")]  # fmt: skip


@pytest.fixture(scope="module")
def runs(dataset):
    """Every run's records (name -> per-rank records) and metrics (name -> per-iteration)."""
    path, fewer, root = dataset
    out = root / "runs"
    out.mkdir()
    ckpt = str(out / "ckpt")
    configs = {name: [*_flags(path, name, out), *flags] for name, flags in CONFIGS.items()}
    configs["dp2-auto"] += ["--save", ckpt, "--save-interval", str(RESUME_AT)]
    load = ["--load", ckpt, "--ckpt-step", str(RESUME_AT)]
    configs["dp2-auto-resumed"] = [*_flags(path, "dp2-auto-resumed", out), *BALANCED, *load]
    configs["other-dataset"] = [*_flags(fewer, "other-dataset", out), *BALANCED, *load]
    configs["other-seed"] = [*_flags(path, "other-seed", out), *BALANCED, *load, "--seed", "6"]
    argv = [str(out)]
    for name, flags in configs.items():
        argv += [name, *flags, "---"]
    check(torchrun(2, WORKER, argv[:-1], timeout=300))
    check(torchrun(1, WORKER, [str(out), "dp1", *_flags(path, "dp1", out)], timeout=200))
    records = {
        name: [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(world)]
        for name, world in [*((n, 2) for n in configs), ("dp1", 1)]
    }
    metrics = {}
    for name in [*CONFIGS, "dp2-auto-resumed", "dp1"]:
        lines = (out / f"{name}.jsonl").read_text().splitlines()
        metrics[name] = {m["iteration"]: m for m in map(json.loads, lines)}
    return records, metrics, out


@pytest.fixture(scope="module")
def scanned(dataset, tmp_path_factory):
    """``tools/scan_dataset.py``'s metadata of the dataset, in dataset order."""
    path = dataset[0]
    out = tmp_path_factory.mktemp("scan") / "meta.jsonl"
    status = scan_dataset.main([
        path, "--output", str(out), "--image-tile-size", str(TILE), "--vision-patch-size",
        str(PATCH), "--image-max-tiles", str(MAX_TILES), "--audio-feature-dim", str(MELS),
    ])  # fmt: skip
    assert status == 0
    return [SampleMeta.from_json(json.loads(x), "line") for x in out.read_text().splitlines()]


def _stream_ids(scanned, iteration):
    """The sample ids of an iteration's global batch, from the documented order: stream index
    ``k`` is dataset sample ``perm_e[k mod N]`` of epoch ``e = k // N``, ``perm_e`` drawn from
    ``(seed, e)``."""
    n = len(scanned)
    ks = range(iteration * GBS, (iteration + 1) * GBS)
    perms = {e: np.random.default_rng([SEED, e]).permutation(n) for e in {k // n for k in ks}}
    return [scanned[int(perms[k // n][k % n])].sample_id for k in ks]


@pytest.mark.multiproc
def test_every_layout_learns_what_one_process_learns(runs):
    _, metrics, _ = runs
    reference = metrics["dp1"]
    assert sorted(reference) == list(range(1, ITERS + 1))
    assert reference[ITERS]["lm_loss"] < reference[1]["lm_loss"]
    for name in CONFIGS:
        assert sorted(metrics[name]) == sorted(reference), name
        for i, m in metrics[name].items():
            assert m["lm_loss"] == pytest.approx(reference[i]["lm_loss"], rel=1e-5), (name, i)
    # Balancing moved work: the comparison is not of identical assignments.
    moved = [m["moved_fraction"] for m in metrics["dp2-auto"].values()]
    assert any(v > 0 for frac in moved for v in frac.values()), moved


@pytest.mark.multiproc
def test_every_sample_of_each_global_batch_is_trained_exactly_once(runs, scanned):
    records, _, _ = runs
    assert len(scanned) == SPEC.num_samples
    n = len(scanned)
    crossing = [i for i in range(ITERS) if i * GBS // n != ((i + 1) * GBS - 1) // n]
    assert crossing == [8]  # the run crosses the epoch boundary inside an iteration
    for name in [*CONFIGS, "dp1"]:
        recs = records[name]
        # The microbatches each pipeline's first stage packed and ran, after any balancing.
        firsts = [r for r in recs if r["pp_rank"] == 0]
        for i in range(ITERS):
            want = Counter(_stream_ids(scanned, i))
            trained = Counter(k for r in firsts for mb in r["iterations"][i]["trained"] for k in mb)
            assert trained == want, (name, i)
            for r in recs:  # every stage of a pipeline runs its first stage's microbatches
                first = firsts[r["dp_rank"]]["iterations"][i]["trained"]
                assert r["iterations"][i]["trained"] == first, (name, i)
            # Loaded: each DP rank its own sampler indices, nothing of another rank's.
            world = len(firsts)
            for rank, r in enumerate(firsts):
                loaded = [k for k, _ in r["iterations"][i]["own"]]
                per_rank = GBS // (2 * world)
                assert loaded == [k for mb in microbatch_indices(i, rank, world, 2, per_rank)
                                  for k in mb]  # fmt: skip
    # Post-balancing changed which rank trained a sample in some iteration.
    balanced, plain = records["dp2-auto"], records["dp2-none"]
    assert any(
        balanced[r]["iterations"][i]["trained"] != plain[r]["iterations"][i]["trained"]
        for r in (0, 1)
        for i in range(ITERS)
    )


@pytest.mark.multiproc
def test_the_trainers_logged_counts_are_the_scanned_metadatas(runs, scanned):
    records, metrics, _ = runs
    by_id = {m.sample_id: m for m in scanned}
    for name in [*CONFIGS, "dp1"]:
        for i in range(ITERS):
            metas = [by_id[s] for s in _stream_ids(scanned, i)]
            logged = metrics[name][i + 1]
            assert logged["samples"] == GBS
            assert logged["tokens"] == sum(m.llm_tokens for m in metas), (name, i)
            # The loss counts every sample's next-token targets once: its text but the first.
            last = records[name][-1]["iterations"][i]
            assert last["loss_tokens"] == sum(m.text_tokens - 1 for m in metas), (name, i)


@pytest.mark.multiproc
def test_a_resume_mid_epoch_gives_the_uninterrupted_losses_bit_for_bit(runs, dataset):
    records, metrics, out = runs
    full, resumed = metrics["dp2-auto"], metrics["dp2-auto-resumed"]
    assert sorted(resumed) == list(range(RESUME_AT + 1, ITERS + 1))
    assert 0 < RESUME_AT * GBS % SPEC.num_samples  # mid-epoch, and the epoch ends ahead
    assert RESUME_AT * GBS < SPEC.num_samples < ITERS * GBS
    for i in resumed:
        assert resumed[i]["lm_loss"] == full[i]["lm_loss"], i
        assert resumed[i]["plan_digest"] == full[i]["plan_digest"], i
    for r in (0, 1):
        assert records["dp2-auto-resumed"][r]["iterations"] == (
            records["dp2-auto"][r]["iterations"][RESUME_AT:]
        )
    # The checkpoint says which stream it continues.
    manifest = json.loads((out / "ckpt" / f"iter_{RESUME_AT:07d}" / "manifest.json").read_text())
    path = dataset[0]
    assert manifest["data"] == {
        "kind": ENERGON, "path": os.path.abspath(path), "num_samples": SPEC.num_samples,
        "fingerprint": shard_index_fingerprint(path), "seed": SEED, "global_batch_size": GBS,
        "consumed_samples": RESUME_AT * GBS,
    }  # fmt: skip


@pytest.mark.multiproc
def test_a_resume_on_another_dataset_or_seed_is_refused_naming_the_flag(runs, dataset):
    records, _, out = runs
    path, fewer, _ = dataset
    where = str(out / "ckpt" / f"iter_{RESUME_AT:07d}")
    fp = shard_index_fingerprint(path)
    expected = {
        "other-dataset": (
            f"--data-path {fewer}: not the dataset {where} was trained on: it was "
            f"{os.path.abspath(path)} with 200 samples (shards {fp}), this one has 134 samples "
            f"(shards {shard_index_fingerprint(fewer)})"
        ),
        "other-seed": f"--seed 6: {where} drew its sample order with --seed 5: resume with --seed 5",
    }
    for name, message in expected.items():
        got = records[name]
        assert got[0] == got[1], got
        kind, text = got[0]
        assert kind == "CheckpointError" and text.startswith(message), text
        assert "\n" not in text


# ----------------------------------------------------------------- the data state, one process


def _source(**changes):
    base = dict(kind=ENERGON, path="/d", num_samples=200, fingerprint="ab", seed=5,
                global_batch_size=24)  # fmt: skip
    return StreamSource(**{**base, **changes})


def test_the_fingerprint_follows_the_shards_not_the_place(dataset, tmp_path):
    path = dataset[0]
    moved = str(tmp_path / "moved")
    shutil.copytree(path, moved)
    assert shard_index_fingerprint(moved) == shard_index_fingerprint(path)
    with open(os.path.join(moved, "shard-000001.tar"), "ab") as f:
        f.write(bytes(1024))  # (two more zero blocks: still a tar, its samples unchanged)
    assert shard_index_fingerprint(moved) != shard_index_fingerprint(path)


def test_resume_problems_name_the_flag_and_both_values():
    saved = saved_state(_source(), 10)
    assert saved["consumed_samples"] == 240
    assert resume_problem(saved, _source(path="/moved"), "C") is None
    assert resume_problem(None, _source(seed=9), "C") is None  # saved before it was recorded
    assert resume_problem(saved, _source(global_batch_size=32), "C") == (
        "--global-batch-size 32: C consumed 240 samples in global batches of 24; this run would "
        "skip or repeat samples: resume with --global-batch-size 24"
    )
    assert resume_problem(saved, _source(fingerprint="cd"), "C").startswith(
        "--data-path /d: not the dataset C was trained on: it was /d with 200 samples (shards "
        "ab), this one has 200 samples (shards cd)"
    )
    synthetic = _source(kind=WORKLOAD, path="omni", num_samples=None, fingerprint=None)
    assert resume_problem(saved, synthetic, "C") == (
        "--data-path: C was trained on --data-path /d (200 samples, shards ab); this run reads "
        "synthetic data (--workload omni): resume on the source it was trained on"
    )
    assert resume_problem(saved_state(synthetic, 1), _source(), "C").startswith(
        "--data-path: C was trained on synthetic data (--workload omni); this run reads "
        "--data-path /d"
    )
    assert resume_problem(saved_state(synthetic, 1), _source(kind=WORKLOAD, seed=6), "C") == (
        "--workload-seed 6: C drew its sample order with --workload-seed 5: resume with "
        "--workload-seed 5"
    )

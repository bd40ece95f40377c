# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Tests of sample metadata, workload specs, the generator, the statistics and the tool.

The statistical tests compare the generator against oracles computed here from the spec
files alone: exact sums for discrete distributions and numerical integration over the
standard normal for clipped lognormals, with tolerances of a few standard errors that come
from the same integration. Means are compared only for components whose largest possible
sample fits under the spec's cap (every component of the built-in specs does), so truncation
cannot bias them; the cap itself is tested against an uncapped twin of a spec where it binds.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestration.workload import Item, SampleMeta, WorkloadError, read_jsonl, write_jsonl
from orchestration.workload_spec import (
    SampleStream,
    WorkloadGenerator,
    WorkloadSpec,
    builtin_specs,
    cumulative,
    draw,
    weighted_index,
)
from orchestration.workload_stats import workload_stats

REPO = Path(__file__).resolve().parents[2]
SPEC_DIR = REPO / "orchestration" / "workloads"
TOOL = REPO / "tools" / "workload.py"

STAT_SAMPLES = 4000
"""Samples per built-in spec in the statistical tests."""

Z_SCORE = 5.0
"""Tolerance of the statistical tests, in standard errors."""


# --------------------------------------------------------------------------------------------
# Oracles, from the spec text only

# A fine grid over the standard normal: clipped lognormal expectations become integrals of a
# bounded function of z, and the clipping puts the tails' mass on the bounds by itself.
_Z = np.linspace(-12.0, 12.0, 240_001)
_PDF = np.exp(-0.5 * _Z**2) / math.sqrt(2.0 * math.pi)


def expect(dist: dict[str, Any], f: Callable[[np.ndarray], np.ndarray]) -> tuple[float, float]:
    """Mean and variance of f(X), X drawn from a spec distribution."""
    kind = dist["dist"]
    if kind == "const":
        x, p = np.array([dist["value"]], dtype=float), np.array([1.0])
    elif kind == "uniform":
        x = np.arange(dist["low"], dist["high"] + 1, dtype=float)
        p = np.full(x.size, 1.0 / x.size)
    elif kind == "choice":
        x = np.array(dist["values"], dtype=float)
        w = np.array(dist.get("weights", [1.0] * x.size), dtype=float)
        p = w / w.sum()
    elif kind == "lognormal":
        x = dist["median"] * np.exp(dist["sigma"] * _Z)
        x = np.clip(x, dist.get("min", 0.0), dist.get("max", np.inf))
        fx = f(x)
        mean = float(np.trapezoid(fx * _PDF, _Z))
        return mean, float(np.trapezoid(fx**2 * _PDF, _Z)) - mean**2
    else:
        raise AssertionError(f"no oracle for {kind}")
    fx = f(x)
    mean = float(np.sum(p * fx))
    return mean, float(np.sum(p * fx**2)) - mean**2


def upper(dist: dict[str, Any]) -> float:
    """The largest value a spec distribution can take."""
    return {
        "const": lambda d: d["value"],
        "uniform": lambda d: d["high"],
        "choice": lambda d: max(d["values"]),
        "lognormal": lambda d: d.get("max", math.inf),
    }[dist["dist"]](dist)


def tokens(x: np.ndarray) -> np.ndarray:
    """A drawn token count as the documentation states it: rounded, at least 1."""
    return np.maximum(1.0, np.rint(x))


# Rounding is monotone, so the largest count is the rounded largest draw.
def item_llm_upper(s: dict[str, Any]) -> float:
    if "seconds" in s:
        return round(upper(s["seconds"]) * s["llm_tokens_per_second"])
    return math.ceil(upper(s["encoder_tokens"]) * s["llm_tokens_per_encoder_token"])


def cap_can_bind(component: dict[str, Any], cap: int) -> bool:
    """Whether some sample of the component could exceed the cap (and so be truncated)."""
    bound = round(upper(component["text_tokens"]))
    for m in ("image", "audio", "video"):
        if m in component:
            bound += upper(component[m]["count"]) * item_llm_upper(component[m])
    return bound > cap


def assert_mean(observed: list[float] | np.ndarray, mean: float, var: float, what: str) -> None:
    observed = np.asarray(observed, dtype=float)
    assert observed.size > 0, what
    tol = Z_SCORE * math.sqrt(max(var, 0.0) / observed.size) + 1e-6
    assert abs(observed.mean() - mean) <= tol, (
        f"{what}: observed mean {observed.mean():.4f} over {observed.size}, "
        f"expected {mean:.4f} +- {tol:.4f}"
    )


@functools.cache
def raw_spec(name: str) -> dict[str, Any]:
    return json.loads((SPEC_DIR / f"{name}.json").read_text())


@functools.cache
def generated(name: str, seed: int = 2024) -> tuple[SampleMeta, ...]:
    gen = WorkloadGenerator(WorkloadSpec.load(name), seed=seed)
    return tuple(gen.samples(STAT_SAMPLES))


BUILTINS = sorted(p.stem for p in SPEC_DIR.glob("*.json"))


def content(s: SampleMeta) -> tuple:
    """A sample without its id, which names the seed and so always differs across seeds."""
    return (s.text_tokens, s.image, s.audio, s.video, s.component)


# --------------------------------------------------------------------------------------------
# Specs and determinism


def test_builtin_specs_are_the_shipped_files():
    assert builtin_specs() == BUILTINS
    assert "omni-three-modality" in BUILTINS and len(BUILTINS) >= 5
    for name in BUILTINS:
        by_name, by_path = WorkloadSpec.load(name), WorkloadSpec.load(SPEC_DIR / f"{name}.json")
        assert by_name == by_path
        assert by_name.name == raw_spec(name)["name"]


def test_generator_is_deterministic_per_seed():
    spec = WorkloadSpec.load("omni-three-modality")
    a = WorkloadGenerator(spec, seed=7).samples(60)
    assert WorkloadGenerator(spec, seed=7).samples(60) == a
    assert len({s.sample_id for s in a}) == 60
    b = WorkloadGenerator(spec, seed=8).samples(60)
    # Continuous text lengths make a coincidence of two whole samples very rare.
    assert sum(content(x) != content(y) for x, y in zip(a, b)) >= 55


def test_sample_k_does_not_depend_on_the_others():
    spec = WorkloadSpec.load("omni-three-modality")
    gen = WorkloadGenerator(spec, seed=11)
    block = gen.samples(20, start=100)
    for i, s in enumerate(block):
        assert WorkloadGenerator(spec, seed=11).sample(100 + i) == s
    first = [s for _, s in zip(range(120), WorkloadGenerator(spec, seed=11))]
    assert first[100:] == block


STREAM_DIGESTS = {
    "llava15-665k": "db87758bfbffad56",
    "obelics-interleaved": "c9c0134adacc9411",
    "omni-three-modality": "f67be503005509b0",
    "qwen2vl-dynamic-resolution": "e5e44e284f85a828",
    "speech-asr-librispeech": "72d7b2bab7bb47bf",
}
"""Digests of each built-in stream (:func:`_stream_digest`), computed by the generator as it
drew until 2026-12-06 (commit 7bec6ce: numpy's ``Generator.choice`` and a list seed)."""


def _stream_digest(name: str) -> str:
    import hashlib

    h = hashlib.sha256()
    spec = WorkloadSpec.load(name)
    for seed, scale in ((0, 1.0), (7, 1 / 32), (2**32 + 1, 0.5)):
        gen = WorkloadGenerator(spec, seed=seed, token_scale=scale)
        for k in [*range(200), 2**32 - 1, 2**32, 10**12]:
            s = gen.sample(k)
            fields = (s.sample_id, s.text_tokens, s.image, s.audio, s.video, s.component,
                      s.text_runs, s.item_order)  # fmt: skip
            h.update(repr(fields).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(STREAM_DIGESTS))
def test_streams_are_the_ones_earlier_runs_drew(name):
    # A run resumed with a newer OrchWeave, or compared with an earlier one, must see the same
    # samples: the sampler's speed-ups may not change one value (seeds and indices on both
    # sides of 2^32, where the seed's words change).
    assert _stream_digest(name) == STREAM_DIGESTS[name]


def test_weighted_index_is_numpys_choice():
    for weights in ([0.5, 0.3, 0.2], [1.0], [0.05, 0, 0.9, 0.05], np.arange(1, 40) ** 2):
        p = np.asarray(weights, dtype=np.float64) / np.sum(weights)
        cdf = cumulative(p)
        for seed in range(300):
            a, b = np.random.default_rng([3, seed]), np.random.default_rng([3, seed])
            assert weighted_index(a, cdf) == int(b.choice(len(p), p=p))
            assert a.random() == b.random()  # both took one double of the stream


# --------------------------------------------------------------------------------------------
# The generator against the spec, for every built-in spec


@pytest.mark.parametrize("name", BUILTINS)
def test_component_shares_match_weights(name):
    raw = raw_spec(name)
    names = [c["name"] for c in raw["components"]]
    assert len(set(names)) == len(names), "component names must identify components"
    weights = np.array([c["weight"] for c in raw["components"]], dtype=float)
    weights /= weights.sum()
    counts = Counter(s.component for s in generated(name))
    assert set(counts) <= set(names)
    n = STAT_SAMPLES
    for cname, p in zip(names, weights):
        se = math.sqrt(p * (1 - p) / n)
        assert abs(counts[cname] / n - p) <= Z_SCORE * se + 1e-12, (cname, counts[cname], p)


@pytest.mark.parametrize("name", BUILTINS)
def test_component_means_match_spec(name):
    raw = raw_spec(name)
    cap = raw["max_sequence_tokens"]
    samples = generated(name)
    assert all(s.llm_tokens <= cap for s in samples)
    checked = 0
    for comp in raw["components"]:
        mine = [s for s in samples if s.component == comp["name"]]
        if len(mine) < 30 or cap_can_bind(comp, cap):
            # Truncation would bias every mean below; the cap has its own test.
            continue
        checked += 1
        where = f"{name}/{comp['name']}"
        text = [s.text_tokens for s in mine]
        lo, hi = bounds(comp["text_tokens"])
        assert tokens(lo) <= min(text) and max(text) <= tokens(hi), f"{where} text support"
        assert_mean(text, *expect(comp["text_tokens"], tokens), f"{where} text")
        for m in ("image", "audio", "video"):
            items = [it for s in mine for it in s.items(m)]
            if m not in comp:
                assert not items, f"{where} has {m} items but the spec has none"
                continue
            spec = comp[m]
            assert_mean(
                [len(s.items(m)) for s in mine],
                *expect(spec["count"], np.trunc),
                f"{where} {m} count",
            )
            if "seconds" in spec:
                _check_timed_items(spec, items, f"{where} {m}")
            else:
                _check_token_items(spec, items, f"{where} {m}")
    assert checked >= 1, f"{name}: no component could be checked against the spec"


def _check_token_items(spec: dict[str, Any], items: list[Item], where: str) -> None:
    enc = spec["encoder_tokens"]
    ratio = spec["llm_tokens_per_encoder_token"]
    assert_mean([it.encoder_tokens for it in items], *expect(enc, tokens), f"{where} encoder")
    assert_mean(
        [it.llm_tokens for it in items],
        *expect(enc, lambda x: tokens(np.ceil(x * ratio))),
        f"{where} llm",
    )
    unit = spec.get("encoder_unit_tokens")
    if unit is None:
        assert all(len(it.units) == 1 for it in items), f"{where}: one unit per item"
    else:
        assert_mean(
            [len(it.units) for it in items],
            *expect(enc, lambda x: np.ceil(x / unit)),
            f"{where} units",
        )
    if enc["dist"] in ("const", "choice") and unit is None:
        allowed = {int(round(v)) for v in support(enc)}
        assert {it.encoder_tokens for it in items} <= allowed


def support(dist: dict[str, Any]) -> list[float]:
    return [dist["value"]] if dist["dist"] == "const" else list(dist["values"])


def bounds(dist: dict[str, Any]) -> tuple[float, float]:
    """The smallest and largest value a spec distribution can take."""
    if dist["dist"] in ("const", "choice"):
        return min(support(dist)), max(support(dist))
    if dist["dist"] == "uniform":
        return dist["low"], dist["high"]
    return dist.get("min", 0.0), dist.get("max", math.inf)


def _check_timed_items(spec: dict[str, Any], items: list[Item], where: str) -> None:
    secs = spec["seconds"]
    llm_rate, enc_rate = spec["llm_tokens_per_second"], spec["encoder_tokens_per_second"]
    pad = spec.get("encoder_pad_seconds")
    llm = [it.llm_tokens for it in items]
    lo, hi = bounds(secs)
    assert tokens(lo * llm_rate) <= min(llm) and max(llm) <= tokens(hi * llm_rate), where
    assert_mean(llm, *expect(secs, lambda x: tokens(x * llm_rate)), f"{where} llm vs seconds")
    if not pad:
        assert all(len(it.units) == 1 for it in items)
        assert_mean(
            [it.encoder_tokens for it in items],
            *expect(secs, lambda x: tokens(x * enc_rate)),
            f"{where} encoder tokens",
        )
        return
    window = round(pad * enc_rate)
    assert all(u == window for it in items for u in it.units), f"{where}: padded windows"
    assert_mean(
        [len(it.units) for it in items],
        *expect(secs, lambda x: np.maximum(1, np.ceil(x / pad))),
        f"{where} windows",
    )
    for it in items:
        # The item's duration, recovered from its LLM tokens up to their rounding.
        lo, hi = (it.llm_tokens - 0.5) / llm_rate, (it.llm_tokens + 0.5) / llm_rate
        assert math.ceil(lo / pad - 1e-9) <= len(it.units) <= max(1, math.ceil(hi / pad)), (
            where,
            it,
        )


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _lognormal_cdf(d: dict[str, Any], t: float) -> float:
    """P(X <= t) for the clipped lognormal: its tails sit on the bounds as point masses."""
    if t < d["min"]:
        return 0.0
    if t >= d["max"]:
        return 1.0
    return _normal_cdf(math.log(t / d["median"]) / d["sigma"])


def _assert_frequency(hits: int, n: int, p: float, what: str) -> None:
    tol = Z_SCORE * math.sqrt(p * (1 - p) / n) + 1e-12
    assert abs(hits / n - p) <= tol, f"{what}: {hits / n:.5f} vs {p:.5f} +- {tol:.5f}"


def test_draw_lognormal_matches_its_cdf():
    # Bounds inside the bulk, so that both point masses are large enough to measure.
    d = {"dist": "lognormal", "median": 13.5, "sigma": 0.45, "min": 6, "max": 30}
    rng = np.random.default_rng(99)
    # Many draws: a 5% error in sigma moves these frequencies by about 0.01.
    n = 100_000
    x = np.array([draw(d, rng) for _ in range(n)])
    assert x.min() == 6 and x.max() == 30
    _assert_frequency(int((x == 6).sum()), n, _lognormal_cdf(d, 6), "mass on min")
    _assert_frequency(int((x == 30).sum()), n, 1 - _lognormal_cdf(d, 29.999999), "mass on max")
    for t in (7.0, 10.0, 13.5, 18.0, 25.0):
        _assert_frequency(int((x <= t).sum()), n, _lognormal_cdf(d, t), f"P(X <= {t})")


@pytest.mark.parametrize(
    "dist, probs",
    [
        ({"dist": "uniform", "low": 2, "high": 6}, {v: 0.2 for v in range(2, 7)}),
        ({"dist": "choice", "values": [1, 5, 9], "weights": [2, 1, 1]}, {1: 0.5, 5: 0.25, 9: 0.25}),
        ({"dist": "choice", "values": [3, 4]}, {3: 0.5, 4: 0.5}),
        ({"dist": "const", "value": 42}, {42: 1.0}),
    ],
)
def test_draw_discrete_frequencies(dist, probs):
    rng = np.random.default_rng(7)
    n = 20_000
    counts = Counter(draw(dist, rng) for _ in range(n))
    assert set(counts) == set(probs)
    for v, p in probs.items():
        _assert_frequency(counts[v], n, p, f"P(X = {v})")


def test_item_rules_on_a_hand_checked_spec():
    spec = WorkloadSpec.from_dict(
        {
            "name": "hand",
            "max_sequence_tokens": 10**6,
            "components": [
                {
                    "name": "c",
                    "weight": 1,
                    "text_tokens": {"dist": "const", "value": 10},
                    "image": {
                        "count": {"dist": "const", "value": 2},
                        "encoder_tokens": {"dist": "const", "value": 1001},
                        "encoder_unit_tokens": 448,
                        "llm_tokens_per_encoder_token": 0.3,
                    },
                    "audio": {
                        "count": {"dist": "const", "value": 1},
                        "seconds": {"dist": "const", "value": 7.2},
                        "encoder_tokens_per_second": 50,
                        "encoder_pad_seconds": None,
                        "llm_tokens_per_second": 25,
                    },
                    "video": {
                        "count": {"dist": "const", "value": 1},
                        "seconds": {"dist": "const", "value": 61},
                        "encoder_tokens_per_second": 10,
                        "encoder_pad_seconds": 30,
                        "llm_tokens_per_second": 2,
                    },
                }
            ],
        }
    )
    s = WorkloadGenerator(spec).sample(0)
    # 1001 = 448 + 448 + 105 encoder tokens in tiles; ceil(1001 * 0.3) = 301 LLM tokens.
    assert s.image == (Item((448, 448, 105), 301),) * 2
    # No padding: one unit of 7.2 s * 50; 7.2 s * 25 = 180 LLM tokens.
    assert s.audio == (Item((360,), 180),)
    # 61 s in 30 s windows: 3 windows of 300 encoder tokens; 122 LLM tokens.
    assert s.video == (Item((300, 300, 300), 122),)
    assert s.llm_tokens == 10 + 2 * 301 + 180 + 122
    assert s.encoder_units("vision") == [448, 448, 105, 448, 448, 105, 300, 300, 300]
    assert s.encoder_units("audio") == [360]


def test_clipped_lognormal_oracle_is_sound():
    # The oracle itself, against a Monte Carlo estimate that shares no code with it.
    d = {"dist": "lognormal", "median": 40, "sigma": 0.8, "min": 4, "max": 100}
    mean, var = expect(d, lambda x: x)
    z = np.random.default_rng(0).standard_normal(400_000)
    mc = np.clip(40 * np.exp(0.8 * z), 4, 100)
    assert abs(mc.mean() - mean) < 5 * math.sqrt(var / mc.size)
    assert abs(mc.var() - var) / var < 0.02
    # Clipping matters here: the unclipped mean is 40*exp(0.32).
    assert mean < 40 * math.exp(0.32) - 3


# --------------------------------------------------------------------------------------------
# token_scale and the per-sample cap


def test_token_scale_scales_every_count():
    spec = WorkloadSpec.load("omni-three-modality")
    s = 0.25
    full = WorkloadGenerator(spec, seed=5).samples(800)
    small = WorkloadGenerator(spec, seed=5, token_scale=s).samples(800)

    def close(scaled: int, unscaled: int) -> bool:
        # Both counts are rounded from the same draw x: |round(s x) - s round(x)| <= (1+s)/2,
        # unless the floor of 1 lifted the scaled count.
        return scaled == 1 or abs(scaled - s * unscaled) <= 0.5 * (1 + s) + 1e-9

    for a, b in zip(full, small):
        assert a.component == b.component
        assert close(b.text_tokens, a.text_tokens), (a, b)
        for m in ("image", "audio", "video"):
            assert len(a.items(m)) == len(b.items(m))
            for x, y in zip(a.items(m), b.items(m)):
                assert len(x.units) == len(y.units)
                assert all(close(v, u) for u, v in zip(x.units, y.units))
                assert close(y.llm_tokens, x.llm_tokens)
    ratio = np.mean([x.llm_tokens for x in small]) / np.mean([x.llm_tokens for x in full])
    assert abs(ratio - s) < 0.01
    enc_small = sum(sum(x.encoder_units("vision")) for x in small)
    enc_full = sum(sum(x.encoder_units("vision")) for x in full)
    assert abs(enc_small / enc_full - s) < 0.01


@pytest.mark.parametrize("scale", [1.0, 0.3, 0.002])
def test_every_sample_respects_the_scaled_cap(scale):
    for name in BUILTINS:
        gen = WorkloadGenerator(WorkloadSpec.load(name), seed=3, token_scale=scale)
        cap = max(1, round(raw_spec(name)["max_sequence_tokens"] * scale))
        assert gen.max_sequence_tokens == cap
        for s in gen.samples(200):
            assert s.llm_tokens <= cap, (name, s)
            assert s.text_tokens >= 1
            for m in ("image", "audio", "video"):
                for it in s.items(m):
                    assert it.llm_tokens >= 1 and it.units and min(it.units) >= 1


TIGHT = {
    "name": "tight",
    "max_sequence_tokens": 700,
    "components": [
        {
            "name": "mixed",
            "weight": 1.0,
            "text_tokens": {
                "dist": "lognormal",
                "median": 300,
                "sigma": 0.9,
                "min": 1,
                "max": 4000,
            },
            "image": {
                "count": {"dist": "uniform", "low": 0, "high": 4},
                "encoder_tokens": {"dist": "choice", "values": [256, 1024]},
                "llm_tokens_per_encoder_token": 0.25,
            },
            "audio": {
                "count": {"dist": "uniform", "low": 0, "high": 2},
                "seconds": {"dist": "lognormal", "median": 8, "sigma": 0.6, "min": 1, "max": 40},
                "encoder_tokens_per_second": 50,
                "encoder_pad_seconds": 30,
                "llm_tokens_per_second": 25,
            },
        }
    ],
}


def expected_fit(sample: SampleMeta, cap: int) -> tuple[int, list[Item]]:
    """Text first, then trailing items (image, audio, video order), keeping text >= 1."""
    items = [it for m in ("image", "audio", "video") for it in sample.items(m)]
    item_llm = sum(it.llm_tokens for it in items)
    if sample.text_tokens + item_llm <= cap:
        return sample.text_tokens, items
    if item_llm + 1 <= cap:
        return cap - item_llm, items
    kept, used = [], 1
    for it in items:
        if used + it.llm_tokens > cap:
            break
        kept.append(it)
        used += it.llm_tokens
    return 1, kept


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_cap_truncates_text_first_then_trailing_items(scale):
    # The same spec without a cap draws the same values, and shows what was cut.
    capped = WorkloadGenerator(WorkloadSpec.from_dict(TIGHT), seed=1, token_scale=scale)
    uncapped = WorkloadGenerator(
        WorkloadSpec.from_dict({**TIGHT, "max_sequence_tokens": 10**9}), seed=1, token_scale=scale
    )
    cap = capped.max_sequence_tokens
    cases = Counter()
    for i in range(400):
        got, full = capped.sample(i), uncapped.sample(i)
        text, items = expected_fit(full, cap)
        assert got.text_tokens == text, (i, got, full)
        assert [it for m in ("image", "audio", "video") for it in got.items(m)] == items
        assert got.llm_tokens <= cap
        cases["kept" if got == full else "text cut" if text > 1 else "items dropped"] += 1
    assert min(cases.values()) >= 20 and len(cases) == 3, cases


# --------------------------------------------------------------------------------------------
# JSONL


def test_jsonl_round_trip_of_generated_samples(tmp_path):
    samples = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=4).samples(300)
    path = tmp_path / "w.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        write_jsonl(samples, f)
    assert read_jsonl(path) == samples
    assert len(path.read_text().splitlines()) == 300


def test_short_form_parses_as_documented(tmp_path):
    path = tmp_path / "short.jsonl"
    path.write_text(
        '{"id": "s0", "text_tokens": 312, "image": [576, 576], "audio": [750]}\n'
        "\n"
        '{"id": "s1", "text_tokens": 40, "audio": [{"units": [1500], "llm_tokens": 337}]}\n'
    )
    s0, s1 = read_jsonl(path)
    assert s0.sample_id == "s0" and s0.text_tokens == 312 and s0.component is None
    assert s0.image == (Item(units=(576,), llm_tokens=576),) * 2
    assert s0.audio == (Item(units=(750,), llm_tokens=750),) and s0.video == ()
    assert s0.llm_tokens == 312 + 576 + 576 + 750
    assert s0.encoder_units("vision") == [576, 576] and s0.encoder_units("audio") == [750]
    assert s0.modalities == ("image", "audio", "text")
    assert s1.audio == (Item(units=(1500,), llm_tokens=337),)
    assert s1.llm_tokens == 377 and s1.modalities == ("audio", "text")
    # The short form is also what is written back when it says everything.
    assert s0.to_json() == {"id": "s0", "text_tokens": 312, "image": [576, 576], "audio": [750]}


_items = st.lists(
    st.builds(
        Item,
        units=st.lists(st.integers(1, 10**7), min_size=1, max_size=4).map(tuple),
        llm_tokens=st.integers(1, 10**7),
    ),
    max_size=3,
).map(tuple)
_samples = st.lists(
    st.builds(
        SampleMeta,
        sample_id=st.text(max_size=12),
        text_tokens=st.integers(0, 10**7),
        image=_items,
        audio=_items,
        video=_items,
        component=st.none() | st.text(max_size=12),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda s: s.sample_id,
)


@pytest.fixture(scope="module")
def scratch_jsonl(tmp_path_factory) -> Path:
    # Module scope: hypothesis reuses one fixture value for all its examples.
    return tmp_path_factory.mktemp("prop") / "p.jsonl"


@settings(max_examples=100, deadline=None)
@given(samples=_samples)
def test_jsonl_round_trip_property(scratch_jsonl, samples):
    path = scratch_jsonl
    with open(path, "w", encoding="utf-8") as f:
        write_jsonl(samples, f)
    assert read_jsonl(path) == samples


def _write_lines(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"id": "s2", "text_tokens": 5', r"bad\.jsonl:2: malformed JSON"),
        ('{"id": "s2", "text_tokens": 5, "imgae": [3]}', r"bad\.jsonl:2: unknown keys \['imgae'\]"),
        ('{"id": "s2", "text_tokens": 5, "image": [0]}', r"bad\.jsonl:2 \(sample 's2'\)\.image"),
        ('{"id": "s2", "text_tokens": -1}', r"bad\.jsonl:2 \(sample 's2'\).*text_tokens"),
        (
            '{"id": "s2", "text_tokens": 5, "audio": [{"units": [1500], "llm_tokens": 0}]}',
            r"sample 's2'.*audio\[0\]\.llm_tokens",
        ),
        ('{"id": "s1", "text_tokens": 5}', r"bad\.jsonl:2: duplicate sample id 's1'.*line 1"),
        ('{"text_tokens": 5}', r"bad\.jsonl:2: missing 'id'"),
        ("[1, 2]", r"bad\.jsonl:2: a sample must be a JSON object"),
    ],
)
def test_malformed_jsonl_names_file_line_and_sample(tmp_path, bad_line, message):
    path = _write_lines(tmp_path, '{"id": "s1", "text_tokens": 5}', bad_line)
    with pytest.raises(WorkloadError, match=message):
        read_jsonl(path)


def test_missing_and_empty_workload_files(tmp_path):
    with pytest.raises(WorkloadError, match="not found: .*nope.jsonl"):
        read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(WorkloadError, match="workload spec not found: no-such-spec"):
        WorkloadSpec.load("no-such-spec")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(WorkloadError, match="no samples"):
        read_jsonl(tmp_path / "empty.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b'{"id": "a", "text_tokens": 1}\n\xff\xfe\n')
    with pytest.raises(WorkloadError, match=r"binary\.jsonl:2: not valid UTF-8"):
        read_jsonl(tmp_path / "binary.jsonl")


def _spec_with_text(dist: Any) -> dict[str, Any]:
    return {
        "name": "bad",
        "max_sequence_tokens": 100,
        "components": [{"name": "c", "weight": 1, "text_tokens": dist}],
    }


@pytest.mark.parametrize(
    "dist, message",
    [
        ({"dist": "normal", "mean": 3}, "a distribution needs 'dist'"),
        ({"dist": "lognormal", "median": 40}, r"misses \['sigma'\]"),
        ({"dist": "uniform", "low": 9, "high": 3}, "low <= high"),
        ({"dist": "uniform", "low": 1.5, "high": 3}, "integers"),
        ({"dist": "lognormal", "median": 0, "sigma": 1}, "median > 0"),
        ({"dist": "lognormal", "median": 10, "sigma": 1, "min": 50, "max": 5}, "min <= max"),
        ({"dist": "lognormal", "median": 10, "sigma": "wide"}, r"\['sigma'\]"),
        ({"dist": "choice", "values": [1, 2], "weights": [1]}, "as many weights"),
        ({"dist": "choice", "values": [1, 2], "weights": [0, 0]}, "positive sum"),
        ({"dist": "const", "value": -3}, r"numbers >= 0 for \['value'\]"),
        (7, "a distribution needs 'dist'"),
    ],
)
def test_bad_spec_distribution_is_a_clear_error(dist, message):
    with pytest.raises(WorkloadError, match=r"component 0 \('c'\)\.text_tokens: .*" + message):
        WorkloadSpec.from_dict(_spec_with_text(dist))


def test_bad_spec_structure_and_file(tmp_path):
    ok = {"dist": "const", "value": 5}
    with pytest.raises(WorkloadError, match="missing 'components'"):
        WorkloadSpec.from_dict({"name": "x", "max_sequence_tokens": 5})
    with pytest.raises(WorkloadError, match="a spec must be a JSON object"):
        WorkloadSpec.from_dict([1, 2])
    with pytest.raises(WorkloadError, match="component 0 must be a JSON object"):
        WorkloadSpec.from_dict({"name": "x", "max_sequence_tokens": 5, "components": [3]})
    with pytest.raises(WorkloadError, match="weights sum to zero"):
        WorkloadSpec.from_dict(
            {
                "name": "x",
                "max_sequence_tokens": 5,
                "components": [{"name": "c", "weight": 0, "text_tokens": ok}],
            }
        )
    bad_audio = _spec_with_text(ok)
    bad_audio["components"][0]["audio"] = {
        "count": ok,
        "seconds": ok,
        "encoder_tokens_per_second": 50,
        "llm_tokens_per_second": 25,
        "encoder_pad_seconds": -30,
    }
    with pytest.raises(WorkloadError, match=r"\.audio: 'encoder_pad_seconds'"):
        WorkloadSpec.from_dict(bad_audio)
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x",')
    with pytest.raises(WorkloadError, match="broken.json: malformed JSON"):
        WorkloadSpec.load(path)
    spec = WorkloadSpec.from_dict(_spec_with_text(ok))
    with pytest.raises(WorkloadError, match="seed"):
        WorkloadGenerator(spec, seed=-1)
    with pytest.raises(WorkloadError, match="token_scale"):
        WorkloadGenerator(spec, token_scale=0)


# --------------------------------------------------------------------------------------------
# Statistics


def _hand_samples() -> list[SampleMeta]:
    return [
        SampleMeta("a", 100, image=(Item((1024,), 256),), component="x"),
        SampleMeta("b", 300, audio=(Item((1500, 1500), 900),), component="y"),
        SampleMeta("c", 50, component="x"),
        SampleMeta("d", 0, image=(Item((576,), 576), Item((576,), 576)), component="x"),
    ]


def test_workload_stats_on_hand_computed_samples():
    st_ = workload_stats(_hand_samples())
    assert st_["num_samples"] == 4
    img, aud, txt = (st_["modalities"][m] for m in ("image", "audio", "text"))
    assert img["samples"] == 2 and img["sample_share"] == 0.5
    assert img["items"] == {"total": 3, "per_sample_mean": 0.75, "per_containing_sample_mean": 1.5}
    assert img["encoder_units"]["mean"] == 1.5 and img["encoder_units"]["max"] == 2
    assert img["encoder_tokens"]["mean"] == (1024 + 1152) / 2
    assert img["llm_tokens"]["total"] == 256 + 1152 and img["llm_tokens"]["p50"] == 704
    assert aud["samples"] == 1 and aud["encoder_units"]["mean"] == 2
    assert aud["encoder_tokens"]["mean"] == 3000 and aud["llm_tokens"]["max"] == 900
    assert st_["modalities"]["video"]["samples"] == 0
    assert st_["modalities"]["video"]["llm_tokens"]["mean"] is None
    # Sample d has no text: text statistics are over a, b and c.
    assert txt["samples"] == 3 and txt["llm_tokens"]["mean"] == 150
    llm = st_["llm_tokens"]
    assert llm["mean"] == (356 + 1200 + 50 + 1152) / 4 and llm["max"] == 1200
    assert llm["p50"] == (356 + 1152) / 2
    assert llm["p90"] == pytest.approx(1152 + 0.7 * (1200 - 1152))
    assert [c["modalities"] for c in st_["combinations"]] == [
        "audio+text",
        "image",
        "image+text",
        "text",
    ]
    assert all(c["share"] == 0.25 for c in st_["combinations"])
    share = st_["modality_share"]
    assert share["image"]["mean"] == pytest.approx((256 / 356 + 1.0) / 4)
    assert share["image"]["min"] == 0 and share["image"]["max"] == 1
    assert share["text"]["max"] == 1 and share["text"]["min"] == 0
    assert share["audio"]["mean"] == pytest.approx(0.75 / 4)
    # Every sample's shares sum to one, so their means do too.
    assert sum(share[m]["mean"] for m in share) == pytest.approx(1.0)
    assert st_["components"] == [
        {"name": "x", "samples": 3, "share": 0.75},
        {"name": "y", "samples": 1, "share": 0.25},
    ]
    json.dumps(st_, allow_nan=False)


def test_workload_stats_edge_cases():
    with pytest.raises(WorkloadError):
        workload_stats([])
    plain = [SampleMeta("p", 5), SampleMeta("q", 0), SampleMeta("r", 3, component="k")]
    st_ = workload_stats(plain)
    assert st_["components"] == [
        {"name": None, "samples": 2, "share": pytest.approx(2 / 3)},
        {"name": "k", "samples": 1, "share": pytest.approx(1 / 3)},
    ]
    assert {c["modalities"] for c in st_["combinations"]} == {"text", "none"}
    # The empty sample has no composition and is left out of the shares.
    assert st_["modality_share"]["text"] == {
        k: 1.0 if k != "std" else 0.0 for k in st_["modality_share"]["text"]
    }
    assert workload_stats([SampleMeta("p", 5)])["components"] is None


def test_workload_stats_sees_modality_incoherence():
    # The omni spec is built to mix samples that are nearly all image, all audio or all text.
    st_ = workload_stats(generated("omni-three-modality"))
    for m in ("image", "audio", "text"):
        assert st_["modality_share"][m]["max"] > 0.9
        assert st_["modality_share"][m]["std"] > 0.3
    names = {c["modalities"] for c in st_["combinations"]}
    assert names == {"image+text", "audio+text", "text"}


# --------------------------------------------------------------------------------------------
# The tool, as a user runs it


def run_tool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    # The tool imports its code as the installed package; PYTHONPATH names this checkout, so
    # that it runs this checkout's code wherever the venv's editable install points.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(TOOL), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_tool_json_matches_workload_stats():
    proc = run_tool("omni-three-modality", "--json", "--num-samples", "2000")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"source", "stats"}
    assert out["source"]["kind"] == "spec" and out["source"]["seed"] == 0
    assert out["source"]["max_sequence_tokens"] == 8192
    samples = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=0).samples(2000)
    assert out["stats"] == json.loads(json.dumps(workload_stats(samples)))
    assert out["stats"]["num_samples"] == 2000


def test_tool_emits_the_generators_samples(tmp_path):
    proc = run_tool("omni-three-modality", "--emit-jsonl", "50", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "emitted.jsonl"
    path.write_text(proc.stdout)
    expected = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=3).samples(50)
    assert read_jsonl(path) == expected

    # The emitted file is itself a valid input, and the report reads it.
    report = run_tool(str(path))
    assert report.returncode == 0, report.stderr
    assert "50 samples read from JSONL" in report.stdout
    for word in ("image", "audio", "video", "text", "Modality combinations", "Components"):
        assert word in report.stdout
    bad = run_tool(str(path), "--emit-jsonl", "5")
    assert bad.returncode == 2 and "error:" in bad.stderr and "JSONL" in bad.stderr


def test_tool_errors_are_one_clear_line(tmp_path):
    missing = run_tool(str(tmp_path / "missing.jsonl"), cwd=tmp_path)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == [
        f"error: workload file not found: {tmp_path / 'missing.jsonl'}"
    ]
    unknown = run_tool("no-such-spec")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: workload spec not found")
    bad = _write_lines(tmp_path, '{"id": "s1", "text_tokens": 5}', '{"id": "s2", "text_tokens": 0,')
    malformed = run_tool(str(bad))
    assert malformed.returncode == 2
    assert malformed.stderr.startswith(f"error: {bad}:2: malformed JSON")
    for proc in (missing, unknown, malformed):
        assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_jsonl_stream_cycles_and_reports_malformed_lines(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "text_tokens": 3}\n{"id": "b", "text_tokens": 4, "image": [5]}\n')
    src = SampleStream(str(good))
    assert [src.meta(k).sample_id for k in range(5)] == ["a", "b", "a", "b", "a"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text_tokens": 3}\n\n{"id": "b", "text_tokens": \n')
    with pytest.raises(WorkloadError, match=r"bad.jsonl:3: malformed JSON"):
        SampleStream(str(bad))
    with pytest.raises(WorkloadError, match="workload file not found"):
        SampleStream(str(tmp_path / "missing.jsonl"))

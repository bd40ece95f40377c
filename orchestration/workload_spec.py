# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Workload specs, the deterministic generator, and the stream of samples a run trains on.

A *workload spec* is a mixture of sample components with per-field distributions (the format is
described in ``docs/workloads.md``); :class:`WorkloadGenerator` turns it into sample metadata,
sample ``k`` depending only on ``(seed, k)``. :class:`SampleStream` is what a run reads: either
a generated spec or a JSONL file of the user's own metadata, decided in one place.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from numbers import Integral, Real
from typing import Any, Iterator, Mapping

import numpy as np

from orchestration.sample_seeds import SeedBlocks
from orchestration.workload import (
    MAX_TOKENS,
    MODALITIES,
    Item,
    SampleMeta,
    WorkloadError,
    positive_count,
    read_jsonl,
)

DEFAULT_WORKLOAD = "omni-three-modality"
"""The embedded workload that the main job and the tests use by default."""


def builtin_specs() -> list[str]:
    """Names of the specs shipped in ``orchestration/workloads``."""
    root = resources.files("orchestration") / "workloads"
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


@dataclass(frozen=True)
class WorkloadSpec:
    """A mixture of sample components (``orchestration/workloads/*.json``)."""

    name: str
    """Name of the workload."""

    max_sequence_tokens: int
    """LLM sequence cap of one sample; text is truncated first."""

    components: tuple[dict[str, Any], ...]
    """The components, each with a ``weight`` and per-field distributions."""

    description: str = ""
    """Free text from the spec."""

    sources: tuple[str, ...] = ()
    """Where the spec's numbers come from."""

    origin: str = field(default="", compare=False)
    """The file or built-in name it was loaded from (names it in errors; two loads of one
    spec are equal)."""

    @classmethod
    def load(cls, name_or_path: str | os.PathLike) -> "WorkloadSpec":
        """Load a spec from a path, or by the name of a built-in spec.

        Raises:
            WorkloadError: the file does not exist or is not a valid spec.
        """
        text_path = os.fspath(name_or_path)
        if os.path.isfile(text_path):
            with open(text_path, encoding="utf-8") as f:
                raw = f.read()
        elif text_path in builtin_specs():
            raw = (resources.files("orchestration") / "workloads" / f"{text_path}.json").read_text()
        else:
            raise WorkloadError(
                f"workload spec not found: {text_path} (not a file, and not one of the built-in "
                f"specs {builtin_specs()})"
            )
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{text_path}: malformed JSON ({e.msg} at line {e.lineno})") from e
        return dataclasses.replace(cls.from_dict(obj, where=text_path), origin=text_path)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "spec") -> "WorkloadSpec":
        """Validate and build a spec from its parsed JSON."""
        if not isinstance(obj, Mapping):
            raise WorkloadError(f"{where}: a spec must be a JSON object, got {type(obj).__name__}")
        for key in ("name", "max_sequence_tokens", "components"):
            if key not in obj:
                raise WorkloadError(f"{where}: missing '{key}'")
        comps = obj["components"]
        if not isinstance(comps, list) or not comps:
            raise WorkloadError(f"{where}: 'components' must be a non-empty list")
        for i, c in enumerate(comps):
            if not isinstance(c, dict):
                raise WorkloadError(f"{where}: component {i} must be a JSON object")
            cw = f"{where}: component {i} ({c.get('name', '?')!r})"
            if not _is_number(c.get("weight")) or c["weight"] < 0:
                raise WorkloadError(f"{cw}: 'weight' must be a number >= 0")
            if "text_tokens" not in c:
                raise WorkloadError(f"{cw}: missing 'text_tokens'")
            _check_dist(c["text_tokens"], f"{cw}.text_tokens")
            for m in MODALITIES:
                if m in c:
                    _check_items_spec(c[m], f"{cw}.{m}")
        if sum(c["weight"] for c in comps) <= 0:
            raise WorkloadError(f"{where}: component weights sum to zero")
        return cls(
            name=str(obj["name"]),
            max_sequence_tokens=positive_count(
                obj["max_sequence_tokens"], f"{where}.max_sequence_tokens"
            ),
            components=tuple(comps),
            description=str(obj.get("description", "")),
            sources=tuple(obj.get("sources", ())),
        )

    @property
    def modalities(self) -> tuple[str, ...]:
        """The modalities whose items some component of positive weight may draw."""
        return tuple(
            m for m in MODALITIES if any(m in c and c["weight"] > 0 for c in self.components)
        )

    @property
    def weights(self) -> np.ndarray:
        """Normalised component weights."""
        w = np.array([c["weight"] for c in self.components], dtype=np.float64)
        return w / w.sum()


_DIST_KEYS = {
    "const": {"value"},
    "uniform": {"low", "high"},
    "lognormal": {"median", "sigma"},
    "choice": {"values"},
}


def _check_dist(d: Any, where: str) -> None:
    if not isinstance(d, dict) or d.get("dist") not in _DIST_KEYS:
        raise WorkloadError(f"{where}: a distribution needs 'dist' in {sorted(_DIST_KEYS)}")
    missing = _DIST_KEYS[d["dist"]] - set(d)
    if missing:
        raise WorkloadError(f"{where}: {d['dist']} distribution misses {sorted(missing)}")
    kind = d["dist"]
    if kind == "choice":
        values, weights = d["values"], d.get("weights")
        if not isinstance(values, list) or not values:
            raise WorkloadError(f"{where}: 'choice' needs a non-empty list of values")
        if weights is not None and (not isinstance(weights, list) or len(weights) != len(values)):
            raise WorkloadError(f"{where}: 'choice' needs values and as many weights")
        if any(not _is_number(v) or v < 0 for v in values):
            raise WorkloadError(f"{where}: 'choice' values must be numbers >= 0, got {values}")
        if weights is not None and (
            any(not _is_number(w) or w < 0 for w in weights) or sum(weights) <= 0
        ):
            raise WorkloadError(
                f"{where}: 'choice' weights must be numbers >= 0 with a positive sum, got {weights}"
            )
        return
    bounds = {k: d[k] for k in ("value", "low", "high", "median", "sigma", "min", "max") if k in d}
    bad = sorted(k for k, v in bounds.items() if not _is_number(v) or v < 0)
    if bad:
        raise WorkloadError(f"{where}: {kind} distribution needs numbers >= 0 for {bad}")
    if kind == "uniform":
        if not all(isinstance(d[k], int) for k in ("low", "high")) or d["low"] > d["high"]:
            raise WorkloadError(f"{where}: uniform needs integers low <= high")
    if kind == "lognormal":
        if d["median"] <= 0:
            raise WorkloadError(f"{where}: lognormal needs median > 0")
        if d.get("min", 0) > d.get("max", math.inf):
            raise WorkloadError(f"{where}: lognormal needs min <= max")


def _is_number(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)


def _check_items_spec(s: Any, where: str) -> None:
    if not isinstance(s, dict) or "count" not in s:
        raise WorkloadError(f"{where}: an items spec needs 'count'")
    _check_dist(s["count"], f"{where}.count")
    if "seconds" in s:
        _check_dist(s["seconds"], f"{where}.seconds")
        for key in ("encoder_tokens_per_second", "llm_tokens_per_second"):
            if not _is_number(s.get(key)) or s[key] <= 0:
                raise WorkloadError(f"{where}: '{key}' must be a positive number")
        pad = s.get("encoder_pad_seconds")
        if pad is not None and (not _is_number(pad) or pad <= 0):
            raise WorkloadError(f"{where}: 'encoder_pad_seconds' must be a positive number or null")
    elif "encoder_tokens" in s:
        _check_dist(s["encoder_tokens"], f"{where}.encoder_tokens")
        ratio = s.get("llm_tokens_per_encoder_token")
        if not _is_number(ratio) or ratio <= 0:
            raise WorkloadError(f"{where}: 'llm_tokens_per_encoder_token' must be positive")
        unit = s.get("encoder_unit_tokens")
        if unit is not None and (isinstance(unit, bool) or not isinstance(unit, int) or unit <= 0):
            raise WorkloadError(f"{where}: 'encoder_unit_tokens' must be a positive int")
    else:
        raise WorkloadError(f"{where}: needs 'encoder_tokens' or 'seconds'")


_MAX_EXPONENT = math.log(np.finfo(np.float64).max)
"""The largest argument of ``math.exp`` that does not overflow."""


_WORD = 2**32
"""Seeds and sample indices below this are one 32-bit word of a generator's seed."""


def cumulative(weights) -> list[float]:
    """The normalised running sums of ``weights``, as numpy's ``Generator.choice`` makes them
    from its ``p`` (see :func:`weighted_index`)."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    cdf /= cdf[-1]
    return cdf.tolist()


@functools.lru_cache(maxsize=256)
def _choice_cdf(weights: tuple[float, ...]) -> list[float]:
    """A ``choice`` distribution's cumulative weights (a spec holds a few such distributions,
    drawn from for every sample)."""
    return cumulative(np.asarray(weights, dtype=np.float64) / sum(weights))


def weighted_index(rng: np.random.Generator, cdf: list[float]) -> int:
    """``rng.choice(len(cdf), p=weights)`` for ``cdf = cumulative(weights)``: the same index
    from the same one double of the stream, without choice's checks of ``p`` on every call
    (a fifth of a sample's drawing; a step of 2,560 GPUs draws 10^4 samples)."""
    return bisect.bisect_right(cdf, rng.random())


def draw(dist: Mapping[str, Any], rng: np.random.Generator) -> float:
    """Draw one value from a spec distribution.

    ``uniform`` draws integers, both ends inclusive; ``lognormal`` is clipped to
    ``[min, max]`` (not re-drawn), so its mass beyond the bounds sits on the bounds.
    """
    kind = dist["dist"]
    if kind == "const":
        return dist["value"]
    if kind == "uniform":
        return int(rng.integers(dist["low"], dist["high"], endpoint=True))
    if kind == "lognormal":
        # Capped where exp() would overflow: the draw is then infinite, clipped to 'max'.
        exponent = min(float(dist["sigma"]) * rng.standard_normal(), _MAX_EXPONENT)
        x = float(dist["median"]) * math.exp(exponent)
        return min(max(x, dist.get("min", 0.0)), dist.get("max", math.inf))
    if kind == "choice":
        values = dist["values"]
        weights = dist.get("weights")
        if weights is None:
            return values[int(rng.choice(len(values)))]
        return values[weighted_index(rng, _choice_cdf(tuple(weights)))]
    raise WorkloadError(f"unknown distribution {kind!r}")


@dataclass
class WorkloadGenerator:
    """Turns a spec into sample metadata, deterministically from a seed.

    Sample ``k`` depends only on ``(seed, k)``, never on which other samples were drawn, so
    any rank can generate any sample and a resumed run regenerates the same stream.
    """

    spec: WorkloadSpec
    """The workload spec to draw from."""

    seed: int = 0
    """Seed of the stream."""

    token_scale: float = 1.0
    """Scale applied to every token count after drawing (each rounded, at least 1), so that a
    realistic spec can drive a tiny CPU model with the same shape of data."""

    _cdf: list[float] = field(init=False, repr=False)
    """The components' cumulative weights (:func:`cumulative`)."""

    _cap: int = field(init=False, repr=False)
    """:attr:`max_sequence_tokens`, scaled once (every sample is fitted to it)."""

    _seeds: SeedBlocks | None = field(init=False, repr=False, compare=False, default=None)
    """The samples' generators, seeded in blocks (a 32-bit seed), made at the first sample."""

    def __post_init__(self) -> None:
        if not self.token_scale > 0:
            raise WorkloadError(f"token_scale must be positive, got {self.token_scale}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, Integral) or self.seed < 0:
            raise WorkloadError(f"seed must be an int >= 0, got {self.seed!r}")
        self._cdf = cumulative(self.spec.weights)
        self._cap = self._scaled(
            self.spec.max_sequence_tokens, f"{self._name}: max_sequence_tokens"
        )

    @property
    def _name(self) -> str:
        return self.spec.origin or self.spec.name

    @property
    def max_sequence_tokens(self) -> int:
        """The spec's per-sample LLM cap, scaled."""
        return self._cap

    def _scaled(self, n: float, where: str) -> int:
        """``n`` tokens times the token scale, rounded, at least 1.

        Raises:
            WorkloadError: at ``where``, when that is not a token count (above ``MAX_TOKENS``).
        """
        x = n * self.token_scale
        if not x <= MAX_TOKENS:  # also NaN
            raise WorkloadError(
                f"{where}: {n:.6g} tokens x token scale {self.token_scale:g} is more than "
                f"{MAX_TOKENS} tokens"
            )
        return max(1, int(round(x)))

    def sample(self, index: int) -> SampleMeta:
        """Sample number ``index`` of the stream.

        Raises:
            WorkloadError: a drawn size is not a token count, or more items than the sample
                has LLM positions; the message names the spec, the sample and the field.
        """
        if index < _WORD and self.seed < _WORD:
            # The generator of the two 32-bit words SeedSequence makes of [seed, index].
            seeds = self._seeds
            if seeds is None or seeds.seed != self.seed:
                seeds = self._seeds = SeedBlocks(self.seed)
            rng = seeds.generator(index)
        else:
            rng = np.random.default_rng([self.seed, index])
        ci = weighted_index(rng, self._cdf)
        comp = self.spec.components[ci]
        sid = f"{self.spec.name}-{self.seed}-{index}"
        where = f"{self._name}: sample {sid!r} (component {comp['name']!r})"
        text = self._scaled(draw(comp["text_tokens"], rng), f"{where}.text_tokens")
        items: dict[str, tuple[Item, ...]] = {}
        for m in MODALITIES:
            if m in comp:
                count = draw(comp[m]["count"], rng)
                # Every item takes an LLM position, so beyond the LLM cap (scaled or not) no
                # item would be kept: such a count is an error, not minutes of drawing.
                most = max(self.spec.max_sequence_tokens, self.max_sequence_tokens)
                if not count <= most:
                    raise WorkloadError(
                        f"{where}.{m}.count: {count:.6g} items, more than the {most} LLM "
                        f"positions of a sample (max_sequence_tokens)"
                    )
                items[m] = tuple(
                    self._draw_item(comp[m], rng, f"{where}.{m}") for _ in range(int(count))
                )
        sample = SampleMeta(sid, text, component=comp["name"], **items)
        return self._fit(sample)

    def samples(self, count: int, start: int = 0) -> list[SampleMeta]:
        """Samples ``start .. start+count-1``."""
        return [self.sample(i) for i in range(start, start + count)]

    def __iter__(self) -> Iterator[SampleMeta]:
        i = 0
        while True:
            yield self.sample(i)
            i += 1

    def _draw_item(self, s: Mapping[str, Any], rng: np.random.Generator, where: str) -> Item:
        if "seconds" in s:
            seconds = float(draw(s["seconds"], rng))
            tps = float(s["encoder_tokens_per_second"])
            # Checked before the windows are made: there is one per padded window.
            self._scaled(seconds * tps, f"{where}.seconds")
            pad = s.get("encoder_pad_seconds")
            if pad:
                windows = max(1, math.ceil(seconds / pad - 1e-9))
                runs = [(pad * tps, windows)]
            else:
                runs = [(seconds * tps, 1)]
            llm = seconds * float(s["llm_tokens_per_second"])
        else:
            enc = float(draw(s["encoder_tokens"], rng))
            self._scaled(enc, f"{where}.encoder_tokens")
            unit = s.get("encoder_unit_tokens")
            if unit:
                full, rest = divmod(enc, unit)
                runs = [(unit, int(full))] + ([(rest, 1)] if rest > 0 else [])
            else:
                runs = [(enc, 1)]
            llm = math.ceil(enc * float(s["llm_tokens_per_encoder_token"]))
        # Units come in runs of equal sizes (windows, tiles): each run is scaled once.
        units = ()
        for size, count in runs:
            if count:
                units += (self._scaled(size, f"{where}.units"),) * count
        return Item(units=units, llm_tokens=self._scaled(llm, f"{where}.llm_tokens"))

    def _fit(self, sample: SampleMeta) -> SampleMeta:
        """Apply the per-sample LLM cap: truncate text first, then drop trailing items."""
        cap = self.max_sequence_tokens
        excess = sample.llm_tokens - cap
        if excess <= 0:
            return sample
        text = max(1, sample.text_tokens - excess)
        sample = dataclasses.replace(sample, text_tokens=text)
        while sample.llm_tokens > cap:
            last = max(
                (m for m in MODALITIES if sample.items(m)), key=lambda m: MODALITIES.index(m)
            )
            sample = dataclasses.replace(sample, **{last: sample.items(last)[:-1]})
        return sample


class SampleStream:
    """The samples of a run: a generated workload spec, or a JSONL metadata file cycled in order.

    This is the one place that decides between the two (a path ending in ``.jsonl`` is metadata;
    anything else names a spec by path or built-in name).
    """

    def __init__(self, workload: str | os.PathLike, seed: int = 0, token_scale: float = 1.0):
        """Open a workload.

        Args:
            workload: a spec (path or built-in name) or a ``.jsonl`` metadata file.
            seed: seed of a generated stream.
            token_scale: token scale of a generated stream; must be 1 for a JSONL file.

        Raises:
            WorkloadError: the file is missing or malformed, or a JSONL file is scaled.
        """
        self.workload = os.fspath(workload)
        self._samples: list[SampleMeta] | None = None
        self._generator: WorkloadGenerator | None = None
        if self.is_metadata_file(self.workload):
            if token_scale != 1.0:
                raise WorkloadError("--workload-token-scale applies to specs, not to JSONL files")
            self._samples = read_jsonl(self.workload)
        else:
            self._generator = WorkloadGenerator(
                WorkloadSpec.load(self.workload), seed=seed, token_scale=token_scale
            )

    @staticmethod
    def is_metadata_file(workload: str | os.PathLike) -> bool:
        """Whether ``workload`` names a JSONL metadata file (else a spec), before opening it.

        For the checks of flags that apply to one kind only (a seed, a token scale).
        """
        return os.fspath(workload).endswith(".jsonl")

    @property
    def generator(self) -> WorkloadGenerator | None:
        """The generator of a spec's stream; None for a JSONL file."""
        return self._generator

    @property
    def file_samples(self) -> list[SampleMeta] | None:
        """Every sample of a JSONL file, in order; None for a generated stream."""
        return self._samples

    def meta(self, index: int) -> SampleMeta:
        """Metadata of stream sample ``index``."""
        if self._samples is not None:
            return self._samples[index % len(self._samples)]
        return self._generator.sample(index)

    def first(self, count: int) -> list[SampleMeta]:
        """Stream samples ``0 .. count-1``."""
        return [self.meta(k) for k in range(count)]

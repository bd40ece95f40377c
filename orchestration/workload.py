# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Sample metadata, workload specs and the deterministic workload generator.

This is the one place where the shape of the training data is described. Everything that
plans work (the balancer, the pipeline searcher, SEMU) and everything that produces work (the
synthetic dataset of `megatron.mllm`) reads the types defined here, so that they agree on what
a sample costs.

A sample is text plus, per modality, a list of *items* (an image, an audio clip, a video).
Each item is seen by its encoder as one or more independent *units* (an image, an
InternVL-style tile, a 30 s Whisper window), each with its own attention, and occupies
``llm_tokens`` positions of the sample's LLM sequence.

On disk a sample is one JSON line. The short form of the architecture document is accepted,
where an item is a bare integer (one unit of that many encoder tokens, the same number of LLM
tokens)::

    {"id": "s0", "text_tokens": 312, "image": [576, 576], "audio": [750]}

and the long form spells out units and LLM tokens::

    {"id": "s1", "text_tokens": 40, "audio": [{"units": [1500], "llm_tokens": 337}]}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from numbers import Integral, Real
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

MODALITIES: tuple[str, ...] = ("image", "audio", "video")
"""Non-text modalities, in the order their items are laid out in a sample."""

ENCODER_OF_MODALITY: Mapping[str, str] = {"image": "vision", "video": "vision", "audio": "audio"}
"""Which encoder processes each modality. Video frames go through the vision encoder."""

PHASES: tuple[str, ...] = ("vision", "audio", "llm")
"""The phases of one iteration: each encoder, then the LLM."""


class WorkloadError(ValueError):
    """Bad workload input: a missing or malformed spec, or malformed sample metadata."""


@dataclass(frozen=True, slots=True)
class Item:
    """One image, audio clip or video of a sample."""

    units: tuple[int, ...]
    """Encoder tokens of each independent encoder unit (image, tile, audio window)."""

    llm_tokens: int
    """Positions the item occupies in the LLM sequence, after merging or pooling."""

    @property
    def encoder_tokens(self) -> int:
        """Total encoder tokens of the item, padding of fixed-size windows included."""
        return sum(self.units)

    def to_json(self) -> int | dict[str, Any]:
        """The JSONL form: a bare integer when the short form says everything."""
        if len(self.units) == 1 and self.units[0] == self.llm_tokens:
            return self.llm_tokens
        return {"units": list(self.units), "llm_tokens": self.llm_tokens}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "Item":
        """Parse an item from its JSONL form.

        Args:
            obj (Any): an int, or a dict with ``units`` (or ``encoder_tokens``) and
                ``llm_tokens``.
            where (str): names the sample and field, for error messages.
        """
        if isinstance(obj, bool):
            raise WorkloadError(f"{where}: an item must be an int or an object, got {obj!r}")
        if isinstance(obj, int):
            return cls(units=(_positive(obj, where),), llm_tokens=_positive(obj, where))
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: an item must be an int or an object, got {obj!r}")
        unknown = set(obj) - {"units", "encoder_tokens", "llm_tokens"}
        if unknown:
            raise WorkloadError(f"{where}: unknown item keys {sorted(unknown)}")
        if "units" in obj:
            units = obj["units"]
            if not isinstance(units, list) or not units:
                raise WorkloadError(f"{where}: 'units' must be a non-empty list of ints")
            units = tuple(_positive(u, f"{where}.units") for u in units)
        elif "encoder_tokens" in obj:
            units = (_positive(obj["encoder_tokens"], f"{where}.encoder_tokens"),)
        else:
            raise WorkloadError(f"{where}: an item object needs 'units' or 'encoder_tokens'")
        llm = obj.get("llm_tokens", sum(units))
        return cls(units=units, llm_tokens=_positive(llm, f"{where}.llm_tokens"))


@dataclass(frozen=True, slots=True)
class SampleMeta:
    """The sizes of one training sample that drive its cost."""

    sample_id: str
    """Unique identifier; ``id`` in the JSONL form."""

    text_tokens: int
    """Text tokens of the sample (the LLM positions that are not encoder outputs)."""

    image: tuple[Item, ...] = ()
    """Images of the sample, in document order."""

    audio: tuple[Item, ...] = ()
    """Audio clips of the sample, in document order."""

    video: tuple[Item, ...] = ()
    """Videos of the sample, in document order."""

    component: str | None = None
    """The workload-spec component the sample was drawn from, when generated."""

    def items(self, modality: str) -> tuple[Item, ...]:
        """The items of one modality."""
        return getattr(self, modality)

    @property
    def llm_tokens(self) -> int:
        """Length of the sample's LLM sequence: text plus every item's LLM tokens."""
        return self.text_tokens + sum(item.llm_tokens for m in MODALITIES for item in self.items(m))

    def encoder_units(self, encoder: str) -> list[int]:
        """Encoder tokens of every unit this sample gives to ``encoder`` ("vision"/"audio")."""
        return [
            u
            for m in MODALITIES
            if ENCODER_OF_MODALITY[m] == encoder
            for item in self.items(m)
            for u in item.units
        ]

    @property
    def modalities(self) -> tuple[str, ...]:
        """The modalities present, text last when the sample has any text."""
        present = tuple(m for m in MODALITIES if self.items(m))
        return present + (("text",) if self.text_tokens > 0 else ())

    def to_json(self) -> dict[str, Any]:
        """The JSONL object of this sample."""
        out: dict[str, Any] = {"id": self.sample_id, "text_tokens": self.text_tokens}
        for m in MODALITIES:
            if self.items(m):
                out[m] = [item.to_json() for item in self.items(m)]
        if self.component is not None:
            out["component"] = self.component
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "SampleMeta":
        """Parse a sample from its JSONL object; ``where`` names the line for errors."""
        if not isinstance(obj, dict):
            raise WorkloadError(
                f"{where}: a sample must be a JSON object, got {type(obj).__name__}"
            )
        unknown = set(obj) - {"id", "text_tokens", "component", *MODALITIES}
        if unknown:
            raise WorkloadError(f"{where}: unknown keys {sorted(unknown)}")
        if "id" not in obj:
            raise WorkloadError(f"{where}: missing 'id'")
        sid = str(obj["id"])
        where = f"{where} (sample {sid!r})"
        if "text_tokens" not in obj:
            raise WorkloadError(f"{where}: missing 'text_tokens'")
        text = obj["text_tokens"]
        if isinstance(text, bool) or not isinstance(text, int) or text < 0:
            raise WorkloadError(f"{where}: 'text_tokens' must be an int >= 0, got {text!r}")
        items = {}
        for m in MODALITIES:
            raw = obj.get(m, [])
            if not isinstance(raw, list):
                raise WorkloadError(f"{where}: '{m}' must be a list of items")
            items[m] = tuple(Item.from_json(x, f"{where}.{m}[{i}]") for i, x in enumerate(raw))
        component = obj.get("component")
        return cls(sid, text, component=None if component is None else str(component), **items)


def _positive(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise WorkloadError(f"{where}: expected a positive int, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# JSONL


def read_jsonl(path: str | os.PathLike) -> list[SampleMeta]:
    """Read sample metadata, one JSON object per line; blank lines are skipped.

    Raises:
        WorkloadError: naming the file and line of the first malformed line, or a duplicate id.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise WorkloadError(f"workload file not found: {path}")
    samples: list[SampleMeta] = []
    seen: dict[str, int] = {}
    try:
        # Binary lines, decoded one by one, so that a bad byte is reported with its line.
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                where = f"{path}:{lineno}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise WorkloadError(f"{where}: not valid UTF-8 ({e.reason})") from e
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise WorkloadError(
                        f"{where}: malformed JSON ({e.msg} at column {e.colno})"
                    ) from e
                sample = SampleMeta.from_json(obj, where)
                if sample.sample_id in seen:
                    raise WorkloadError(
                        f"{where}: duplicate sample id {sample.sample_id!r} "
                        f"(first on line {seen[sample.sample_id]})"
                    )
                seen[sample.sample_id] = lineno
                samples.append(sample)
    except OSError as e:
        raise WorkloadError(f"cannot read workload file {path}: {e.strerror}") from e
    if not samples:
        raise WorkloadError(f"{path}: no samples")
    return samples


def write_jsonl(samples: Iterable[SampleMeta], f) -> None:
    """Write samples as JSONL to an open text file."""
    for s in samples:
        f.write(json.dumps(s.to_json(), separators=(", ", ": ")) + "\n")


# --------------------------------------------------------------------------------------------
# Workload specs (format: shared/workloads/README.md)

DEFAULT_WORKLOAD = "omni-three-modality"
"""The embedded workload that the main job and the tests use by default."""


def builtin_specs() -> list[str]:
    """Names of the specs shipped in ``orchestration/workloads``."""
    root = resources.files("orchestration") / "workloads"
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


@dataclass(frozen=True)
class WorkloadSpec:
    """A mixture of sample components, as in ``shared/workloads/*.json``."""

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
        return cls.from_dict(obj, where=text_path)

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
            max_sequence_tokens=_positive(
                obj["max_sequence_tokens"], f"{where}.max_sequence_tokens"
            ),
            components=tuple(comps),
            description=str(obj.get("description", "")),
            sources=tuple(obj.get("sources", ())),
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
        x = float(dist["median"]) * math.exp(float(dist["sigma"]) * rng.standard_normal())
        return min(max(x, dist.get("min", 0.0)), dist.get("max", math.inf))
    if kind == "choice":
        values = dist["values"]
        weights = dist.get("weights")
        p = None if weights is None else np.asarray(weights, dtype=np.float64) / sum(weights)
        return values[int(rng.choice(len(values), p=p))]
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

    _weights: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.token_scale > 0:
            raise WorkloadError(f"token_scale must be positive, got {self.token_scale}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, Integral) or self.seed < 0:
            raise WorkloadError(f"seed must be an int >= 0, got {self.seed!r}")
        self._weights = self.spec.weights

    @property
    def max_sequence_tokens(self) -> int:
        """The spec's per-sample LLM cap, scaled."""
        return self._scaled(self.spec.max_sequence_tokens)

    def _scaled(self, n: float) -> int:
        return max(1, int(round(n * self.token_scale)))

    def sample(self, index: int) -> SampleMeta:
        """Sample number ``index`` of the stream."""
        rng = np.random.default_rng([self.seed, index])
        ci = int(rng.choice(len(self._weights), p=self._weights))
        comp = self.spec.components[ci]
        text = self._scaled(draw(comp["text_tokens"], rng))
        items: dict[str, tuple[Item, ...]] = {}
        for m in MODALITIES:
            if m in comp:
                count = int(draw(comp[m]["count"], rng))
                items[m] = tuple(self._draw_item(comp[m], rng) for _ in range(count))
        sample = SampleMeta(
            f"{self.spec.name}-{self.seed}-{index}", text, component=comp["name"], **items
        )
        return self._fit(sample)

    def samples(self, count: int, start: int = 0) -> list[SampleMeta]:
        """Samples ``start .. start+count-1``."""
        return [self.sample(i) for i in range(start, start + count)]

    def __iter__(self) -> Iterator[SampleMeta]:
        i = 0
        while True:
            yield self.sample(i)
            i += 1

    def _draw_item(self, s: Mapping[str, Any], rng: np.random.Generator) -> Item:
        if "seconds" in s:
            seconds = float(draw(s["seconds"], rng))
            tps = float(s["encoder_tokens_per_second"])
            pad = s.get("encoder_pad_seconds")
            if pad:
                windows = max(1, math.ceil(seconds / pad - 1e-9))
                units = [pad * tps] * windows
            else:
                units = [seconds * tps]
            llm = seconds * float(s["llm_tokens_per_second"])
        else:
            enc = float(draw(s["encoder_tokens"], rng))
            unit = s.get("encoder_unit_tokens")
            if unit:
                full, rest = divmod(enc, unit)
                units = [unit] * int(full) + ([rest] if rest > 0 else [])
            else:
                units = [enc]
            llm = math.ceil(enc * float(s["llm_tokens_per_encoder_token"]))
        return Item(units=tuple(self._scaled(u) for u in units), llm_tokens=self._scaled(llm))

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


def load_samples(
    source: str | os.PathLike, count: int | None = None, seed: int = 0, token_scale: float = 1.0
) -> Sequence[SampleMeta]:
    """Samples from a JSONL file, or ``count`` generated from a spec (a path or built-in name).

    Raises:
        WorkloadError: the source does not exist or is malformed.
    """
    path = os.fspath(source)
    if path.endswith(".jsonl"):
        samples = read_jsonl(path)
        return samples if count is None else samples[:count]
    gen = WorkloadGenerator(WorkloadSpec.load(path), seed=seed, token_scale=token_scale)
    return gen.samples(1000 if count is None else count)

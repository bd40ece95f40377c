# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Sample metadata: what a training sample is made of, and its JSONL form.

This is the one place where the shape of the training data is described. Everything that
plans work (the balancer, the pipeline searcher, SEMU) and everything that produces work (the
synthetic dataset of `megatron.mllm`) reads the types defined here, so that they agree on what
a sample costs. Workload specs and the stream of samples are in
:mod:`orchestration.workload_spec`.

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

By default a sample's text is split evenly around its items, laid out in ``MODALITIES`` order
(what synthetic workloads use). A real document says where its items sit: ``text_runs`` gives
the text tokens before each item and after the last, in document order, and ``item_order`` the
modality of each item in document order (omitted when it is ``MODALITIES`` order)::

    {"id": "d0", "text_tokens": 12, "image": [64, 64], "audio": [16],
     "text_runs": [3, 5, 0, 4], "item_order": ["image", "audio", "image"]}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

MODALITIES: tuple[str, ...] = ("image", "audio", "video")
"""Non-text modalities, in the order their items are laid out in a sample."""

ENCODER_OF_MODALITY: Mapping[str, str] = {"image": "vision", "video": "vision", "audio": "audio"}
"""Which encoder processes each modality. Video frames go through the vision encoder."""

PHASES: tuple[str, ...] = ("vision", "audio", "llm")
"""The phases of one iteration: each encoder, then the LLM."""


MAX_TOKENS = 2**31 - 1
"""The largest token count of any field of a sample (text, an item's LLM tokens, a unit's
encoder tokens). No real sample comes near it, and under it every sum the planner, the
metadata all-gather and the statistics form over a batch stays exact in int64."""


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
            return cls(units=(positive_count(obj, where),), llm_tokens=positive_count(obj, where))
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: an item must be an int or an object, got {obj!r}")
        unknown = set(obj) - {"units", "encoder_tokens", "llm_tokens"}
        if unknown:
            raise WorkloadError(f"{where}: unknown item keys {sorted(unknown)}")
        if "units" in obj:
            units = obj["units"]
            if not isinstance(units, list) or not units:
                raise WorkloadError(f"{where}: 'units' must be a non-empty list of ints")
            units = tuple(positive_count(u, f"{where}.units") for u in units)
        elif "encoder_tokens" in obj:
            units = (positive_count(obj["encoder_tokens"], f"{where}.encoder_tokens"),)
        else:
            raise WorkloadError(f"{where}: an item object needs 'units' or 'encoder_tokens'")
        llm = obj.get("llm_tokens", sum(units))
        return cls(units=units, llm_tokens=positive_count(llm, f"{where}.llm_tokens"))


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

    text_runs: tuple[int, ...] | None = None
    """Text tokens before each item and after the last, in document order (one more than the
    items; they sum to ``text_tokens``), or None: the text split evenly around the items."""

    item_order: tuple[str, ...] | None = None
    """The modality of each item in document order (the ``j``-th ``image`` is ``image[j]``), or
    None: ``MODALITIES`` order. Only with ``text_runs``; stored only when it differs from
    ``MODALITIES`` order, so that equal layouts compare equal."""

    _llm_tokens: int = field(init=False, repr=False, compare=False)
    """:attr:`llm_tokens`, summed once: packing, costing and the sampler's cap each ask for it,
    about four times per sample (a simulated 84B step at DP 320 draws 10^5 samples)."""

    def __post_init__(self):
        llm = self.text_tokens
        for m in MODALITIES:  # plain loops: a generator costs more than the sum, once a sample
            for item in getattr(self, m):
                llm += item.llm_tokens
        object.__setattr__(self, "_llm_tokens", llm)
        if self.text_runs is None:
            if self.item_order is not None:
                raise WorkloadError("'item_order' needs 'text_runs'")
            return
        canonical = tuple(m for m in MODALITIES for _ in self.items(m))
        order = canonical if self.item_order is None else tuple(self.item_order)
        runs = tuple(self.text_runs)
        if len(runs) != len(canonical) + 1:
            raise WorkloadError(
                f"'text_runs' has {len(runs)} runs for {len(canonical)} items (needs one more "
                "run than items)"
            )
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in runs):
            raise WorkloadError(f"'text_runs' must be ints >= 0, got {list(runs)}")
        if sum(runs) != self.text_tokens:
            raise WorkloadError(
                f"'text_runs' sum to {sum(runs)}, 'text_tokens' is {self.text_tokens}"
            )
        if sorted(order, key=str) != sorted(canonical, key=str):
            raise WorkloadError(
                f"'item_order' {list(order)} does not list the sample's items "
                f"({', '.join(f'{len(self.items(m))} {m}' for m in MODALITIES)})"
            )
        vision = [m for m in order if ENCODER_OF_MODALITY[m] == "vision"]
        if vision != sorted(vision, key=MODALITIES.index):
            # An encoder's units travel in modality order (SampleMeta.encoder_units).
            raise WorkloadError("'item_order': a video before an image is not supported")
        object.__setattr__(self, "text_runs", runs)
        object.__setattr__(self, "item_order", None if order == canonical else order)

    def document_items(self) -> list[tuple[str, int, Item]]:
        """``(modality, index among its modality, item)`` of every item, in document order."""
        if self.item_order is None:
            return [(m, i, item) for m in MODALITIES for i, item in enumerate(self.items(m))]
        seen = {m: 0 for m in MODALITIES}
        out = []
        for m in self.item_order:
            out.append((m, seen[m], self.items(m)[seen[m]]))
            seen[m] += 1
        return out

    def items(self, modality: str) -> tuple[Item, ...]:
        """The items of one modality."""
        return getattr(self, modality)

    @property
    def llm_tokens(self) -> int:
        """Length of the sample's LLM sequence: text plus every item's LLM tokens."""
        return self._llm_tokens

    def encoder_items(self, encoder: str) -> list[Item]:
        """The items this sample gives to ``encoder`` ("vision"/"audio"), in modality order."""
        return [
            item for m in MODALITIES if ENCODER_OF_MODALITY[m] == encoder for item in self.items(m)
        ]

    def encoder_units(self, encoder: str) -> list[int]:
        """Encoder tokens of every unit this sample gives to ``encoder``."""
        return [u for item in self.encoder_items(encoder) for u in item.units]

    def unencoded(self, encoders: Iterable[str]) -> str | None:
        """The first modality of this sample whose items no encoder in ``encoders`` reads."""
        present = set(encoders)
        for m in MODALITIES:  # asked of every sample drawn: the cheap test first
            if getattr(self, m) and ENCODER_OF_MODALITY[m] not in present:
                return m
        return None

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
        if self.text_runs is not None:
            out["text_runs"] = list(self.text_runs)
        if self.item_order is not None:
            out["item_order"] = list(self.item_order)
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "SampleMeta":
        """Parse a sample from its JSONL object; ``where`` names the line for errors."""
        if not isinstance(obj, dict):
            raise WorkloadError(
                f"{where}: a sample must be a JSON object, got {type(obj).__name__}"
            )
        unknown = set(obj) - {
            "id",
            "text_tokens",
            "component",
            "text_runs",
            "item_order",
            *MODALITIES,
        }
        if unknown:
            raise WorkloadError(f"{where}: unknown keys {sorted(unknown)}")
        if "id" not in obj:
            raise WorkloadError(f"{where}: missing 'id'")
        sid = str(obj["id"])
        where = f"{where} (sample {sid!r})"
        if "text_tokens" not in obj:
            raise WorkloadError(f"{where}: missing 'text_tokens'")
        text = obj["text_tokens"]
        if isinstance(text, bool) or not isinstance(text, int) or not 0 <= text <= MAX_TOKENS:
            raise WorkloadError(
                f"{where}: 'text_tokens' must be an int in [0, {MAX_TOKENS}], got {text!r}"
            )
        items = {}
        for m in MODALITIES:
            raw = obj.get(m, [])
            if not isinstance(raw, list):
                raise WorkloadError(f"{where}: '{m}' must be a list of items")
            items[m] = tuple(Item.from_json(x, f"{where}.{m}[{i}]") for i, x in enumerate(raw))
        component = obj.get("component")
        layout = {}
        for key in ("text_runs", "item_order"):
            if key in obj:
                if not isinstance(obj[key], list):
                    raise WorkloadError(f"{where}: '{key}' must be a list")
                layout[key] = tuple(obj[key])
        if any(m not in MODALITIES for m in layout.get("item_order", ())):
            raise WorkloadError(f"{where}: 'item_order' names modalities of {list(MODALITIES)}")
        try:
            return cls(
                sid, text, component=None if component is None else str(component),
                **items, **layout,
            )  # fmt: skip
        except WorkloadError as e:
            raise WorkloadError(f"{where}: {e}") from None


def missing_encoder_error(sample: str, modality: str) -> WorkloadError:
    """The error for data the model cannot read: ``sample`` (its name in errors) has items of
    ``modality`` and the model has no encoder for them."""
    enc = ENCODER_OF_MODALITY[modality]
    return WorkloadError(
        f"{sample} has {modality} items but the model has no {enc} encoder "
        f"(--{enc}-num-layers is 0)"
    )


def positive_count(value: Any, where: str) -> int:
    """``value`` as a token count of a JSON document (an int in ``[1, MAX_TOKENS]``), or a
    :class:`WorkloadError` at ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise WorkloadError(f"{where}: expected a positive int, got {value!r}")
    if value > MAX_TOKENS:
        raise WorkloadError(f"{where}: {value} is more than {MAX_TOKENS} tokens")
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

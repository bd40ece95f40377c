# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Mixtures of Energon datasets in one run: ``--data-path`` as a blend or a metadataset YAML.

``--data-path`` takes, as Megatron does, one dataset directory, weighted pairs
``W1 DIR1 W2 DIR2 ...``, or several directories of equal weight; or one Energon metadataset
YAML (Energon's v2 format), read here by a small parser of our own::

    __module__: megatron.energon
    __class__: MetadatasetV2
    splits:
      train:
        blend:
          - weight: 2
            path: captions        # relative to the YAML's directory
          - weight: 1
            path: documents
            split_part: val       # this dataset's `val` part (default: the split read, train)

(``train`` may also be a single ``path:``; an entry's ``subflavors`` are accepted and unused.)
An entry's ``split_part`` names a part of the dataset's ``.nv-meta/split.yaml`` to train on;
as in Energon, on an entry naming another YAML it picks that YAML's split, which its own
entries inherit. An entry's ``path`` may be another metadataset YAML: it is drawn with the
entry's weight, which its own datasets share in proportion to their weights, as Energon blends
a nested blend.

Stream index ``k`` comes from dataset ``d(k)``, drawn by weight from a hash of ``(seed, k)``
alone (:func:`blend_choices`), and is that dataset's own stream index ``j``: how many indices
before ``k`` drew ``d``. So the order depends on neither the parallel layout nor where a run
resumed, as for one dataset.

``blend_epochized:`` instead of ``blend:`` lists entries with ``repetitions`` (default 1, any
number > 0) in place of ``weight``: each epoch holds every sample of each dataset that many
times, a fractional part taking that fraction of its samples, in a shuffled order
(:class:`megatron.mllm.data_epochized.EpochizedStream`). A nested YAML's repetitions multiply
its entry's; a ``blend`` and a ``blend_epochized`` do not mix, in one split or nested.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from megatron.mllm.arguments import ConfigError
from megatron.mllm.decode_pool import DEFAULT_TIMEOUT_S, DecodePool

METADATASET_SUFFIXES = (".yaml", ".yml")
"""A ``--data-path`` ending so is a metadataset YAML."""

BLOCK = 1 << 14
"""Stream indices whose draws are counted at once (the per-dataset positions' granularity)."""

_MASK = (1 << 64) - 1

EPOCHIZED = "blend_epochized"
"""The metadataset key of a blend by repetitions (Energon's ``MetadatasetBlendEpochized``)."""


class BlendEntry(NamedTuple):
    """One dataset of a ``--data-path`` mixture."""

    weight: float
    """Its weight in a blend; its repetitions per epoch in a ``blend_epochized``."""

    path: str
    """The dataset directory."""

    label: str
    """Names it in sample ids: its path as written, or relative to the outermost YAML."""

    split_part: str = "train"
    """The part of the dataset's ``.nv-meta/split.yaml`` it reads."""


@dataclass(frozen=True)
class DataBlend:
    """The datasets ``--data-path`` names and how they mix; iterates its entries."""

    entries: tuple[BlendEntry, ...]
    """Each dataset, in the order written (nested YAMLs in place)."""

    epochized: bool = False
    """A ``blend_epochized`` (entries' weights are repetitions), else drawn by weight."""

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 values (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def blend_uniforms(seed: int, indices: np.ndarray) -> np.ndarray:
    """A uniform in ``[0, 1)`` for each stream index, from ``(seed, index)`` alone: the top 53
    bits of ``splitmix(splitmix(seed) xor index)``."""
    with np.errstate(over="ignore"):
        key = _splitmix(np.array([seed & _MASK], dtype=np.uint64))
        bits = _splitmix(key ^ np.asarray(indices, dtype=np.uint64))
    return (bits >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def blend_choices(seed: int, weights: Sequence[float], indices: np.ndarray) -> np.ndarray:
    """The dataset each stream index draws: the first whose cumulative share of the weights
    exceeds the index's uniform."""
    bounds = np.cumsum(np.asarray(weights, dtype=np.float64))
    bounds /= bounds[-1]
    return np.minimum(np.searchsorted(bounds, blend_uniforms(seed, indices), side="right"),
                      len(bounds) - 1)  # fmt: skip


def blend_of(entries: Sequence[str]) -> DataBlend:
    """The datasets ``--data-path`` names (:class:`BlendEntry` each) and how they mix.

    Raises:
        ConfigError: naming the flag or the YAML file, for a malformed blend.
    """
    entries = [str(e) for e in entries]
    if len(entries) == 1 and entries[0].endswith(METADATASET_SUFFIXES):
        return read_metadataset(entries[0])
    if any(e.endswith(METADATASET_SUFFIXES) for e in entries):
        raise ConfigError(
            "--data-path: a metadataset YAML must be the only --data-path entry "
            f"(got {' '.join(entries)})"
        )
    numbers = [_number(e) for e in entries]
    if len(entries) > 1 and len(entries) % 2 == 0 and all(
        w is not None for w in numbers[0::2]
    ):  # fmt: skip
        pairs = [(numbers[i], entries[i + 1]) for i in range(0, len(entries), 2)]
    elif any(w is not None for w in numbers):
        raise ConfigError(
            "--data-path: give weights and paths in pairs (W1 DIR1 W2 DIR2 ...) or only "
            f"dataset directories, got {' '.join(entries)}"
        )
    else:
        pairs = [(1.0, e) for e in entries]
    for w, path in pairs:
        if not (w > 0 and math.isfinite(w)):
            raise ConfigError(f"--data-path: the weight of {path} must be > 0, got {w:g}")
    return DataBlend(_checked([BlendEntry(w, p, p) for w, p in pairs], "--data-path"))


def read_metadataset(path: str) -> DataBlend:
    """The blend of an Energon v2 metadataset YAML's ``train`` split (see the module).

    Raises:
        ConfigError: naming the file, when it is missing, not YAML, or not such a blend.
    """
    top = os.path.dirname(os.path.abspath(path))
    mode, entries = _read_metadataset(path, (), top, "train")
    return DataBlend(_checked(entries, f"--data-path {path}"), epochized=mode == EPOCHIZED)


def split_parts(path: str) -> list[str] | None:
    """The split parts the Energon dataset at ``path`` defines (``.nv-meta/split.yaml``, or
    ``split.json`` as Energon falls back to), in their order; None when it has neither, or it
    cannot be read (opening the dataset then says why)."""
    import yaml

    for name in ("split.yaml", "split.json"):
        file = os.path.join(path, ".nv-meta", name)
        if os.path.isfile(file):
            try:
                with open(file, encoding="utf-8") as f:
                    doc = yaml.safe_load(f)  # JSON is YAML
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                return None
            parts = doc.get("split_parts") if isinstance(doc, dict) else None
            return [str(p) for p in parts] if isinstance(parts, dict) else None
    return None


def missing_split_part(path: str, part: str) -> str | None:
    """Why the dataset at ``path`` cannot be read as split part ``part`` (``has no split part
    ...``), or None when it can or its parts cannot be listed (opening it then says why)."""
    parts = split_parts(path)
    if parts is None or part in parts:
        return None
    return f"has no split part {part!r} (its .nv-meta/split.yaml has {', '.join(parts) or 'none'})"


def _read_metadataset(path: str, within: tuple[str, ...], top: str, part: str):
    """``(mode, entries)`` of split ``part`` of ``path``, nested in the YAMLs ``within``
    (outermost first): the mode is ``"blend"``, :data:`EPOCHIZED`, or None for a single
    ``path:`` of a dataset; labels are dataset paths relative to ``top``, the outermost YAML's
    directory."""
    import yaml

    where = "--data-path " + " -> ".join((*within, path))
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{where}: cannot read the metadataset YAML ({_first_line(e)})") from e
    if not isinstance(doc, dict) or doc.get("__class__") != "MetadatasetV2":
        got = doc.get("__class__") if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(
            f"{where}: not an Energon metadataset (needs __class__: MetadatasetV2, got {got!r})"
        )
    split = (doc.get("splits") or {}).get(part) if isinstance(doc.get("splits"), dict) else None
    if not isinstance(split, dict):
        raise ConfigError(f"{where}: no 'splits: {part}:' entry")
    modes = [m for m in ("blend", EPOCHIZED) if m in split]
    if len(modes) > 1:
        raise ConfigError(
            f"{where}: splits.{part} has both 'blend' and '{EPOCHIZED}' (Energon blends a split "
            "by weights or by repetitions, not both)"
        )
    mode = modes[0] if modes else None
    if mode:
        entries = split[mode]
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{where}: 'splits.{part}.{mode}' must be a non-empty list")
        if set(split) != {mode}:  # (Energon's subset, say: not read, so not silently ignored)
            raise ConfigError(
                f"{where}: splits.{part}: unknown keys {sorted(set(split) - {mode})} beside "
                f"'{mode}'"
            )
    else:
        entries = [split]
    amount = "repetitions" if mode == EPOCHIZED else "weight"
    known = ("path", amount, "split_part", "subflavors")
    base = os.path.dirname(os.path.abspath(path))
    out, result = [], mode
    for n, entry in enumerate(entries):
        at = f"{where}: splits.{part}.{mode}[{n}]" if mode else f"{where}: splits.{part}"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ConfigError(f"{at} needs a 'path' (a string)")
        unknown = sorted(set(entry) - set(known))
        if unknown:
            raise ConfigError(f"{at}: unknown keys {unknown} (known: {', '.join(known)})")
        value = entry.get(amount, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            value > 0 and math.isfinite(value)
        ):  # fmt: skip
            raise ConfigError(f"{at}: '{amount}' must be a number > 0, got {value!r}")
        # As in Energon, an entry's split part overrides the one it was reached by, and what
        # it names inherits it.
        entry_part = entry.get("split_part", part)
        if not isinstance(entry_part, str) or not entry_part:
            raise ConfigError(f"{at}: 'split_part' must be a split part's name, got {entry_part!r}")
        rel = entry["path"]
        full = rel if os.path.isabs(rel) else os.path.normpath(os.path.join(base, rel))
        if rel.endswith(METADATASET_SUFFIXES):
            chain = tuple(os.path.realpath(p) for p in (*within, path))
            if os.path.realpath(full) in chain:
                raise ConfigError(f"{at}: {rel} includes itself (a cycle of metadatasets)")
            if not os.path.isfile(full):
                raise ConfigError(f"{at}: metadataset {rel} ({full}) is not a file")
            inner_mode, inner = _read_metadataset(full, (*within, path), top, entry_part)
            if inner_mode and mode and inner_mode != mode:
                raise ConfigError(
                    f"{at}: {rel} is a '{inner_mode}' inside a '{mode}' (Energon cannot mix "
                    "a blend by weights with one by repetitions)"
                )
            if inner_mode == EPOCHIZED:
                # Nested repetitions multiply, as Energon's do (a lone path has none of its own).
                factor = float(value) if mode == EPOCHIZED else 1.0
                out.extend(e._replace(weight=factor * e.weight) for e in inner)
            else:
                # A nested blend is drawn with its entry's weight, and shares it among its own
                # datasets in proportion to theirs (as Energon blends a nested blend); a lone
                # dataset gets the entry's weight or repetitions whole.
                total = sum(e.weight for e in inner)
                out.extend(e._replace(weight=float(value) * e.weight / total) for e in inner)
            result = result or inner_mode
            continue
        if not os.path.isdir(full):
            raise ConfigError(f"{at}: dataset {rel} ({full}) is not a directory")
        missing = missing_split_part(full, entry_part)
        if missing:
            raise ConfigError(f"{at}: dataset {rel} {missing}")
        label = os.path.normpath(os.path.relpath(full, top)) if not os.path.isabs(rel) else rel
        label = os.path.basename(full) if label == "." else label
        out.append(BlendEntry(float(value), full, label, entry_part))
    return result, out


def _checked(blend: list[BlendEntry], where: str) -> tuple[BlendEntry, ...]:
    seen = set()
    for e in blend:
        # Another part of a dataset is other samples (its parts share no shard).
        key = (os.path.realpath(e.path), e.split_part)
        if key in seen:
            raise ConfigError(f"{where}: dataset {e.path} is named twice")
        seen.add(key)
    return tuple(blend)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


@dataclass
class BlendedStream:
    """Several datasets' streams as one, each index drawn by weight; a stream and a task for
    :class:`megatron.mllm.data.BatchLoader`, as :class:`~megatron.mllm.data_energon.EnergonStream`
    is."""

    streams: list
    """Each dataset's :class:`~megatron.mllm.data_energon.EnergonStream` (ids labelled)."""

    weights: tuple[float, ...]
    """Each dataset's weight (any positive scale)."""

    seed: int
    """Seed of the draws (``--seed``)."""

    num_workers: int = 0
    """Processes that decode the media of every dataset (0: the main process); the datasets'
    own pools are not used (give them none)."""

    decode_timeout_s: float = DEFAULT_TIMEOUT_S
    """The longest wait on the decode workers (a run's ``--distributed-timeout-minutes``)."""

    _before: list[np.ndarray] = field(default_factory=list, init=False, repr=False)
    _block: tuple[int, np.ndarray] | None = field(default=None, init=False, repr=False)
    _pool: DecodePool | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if len(self.streams) != len(self.weights) or not self.streams:
            raise ValueError("a blend needs one weight per dataset, and a dataset")
        self._before = [np.zeros(len(self.streams), dtype=np.int64)]
        if self.num_workers > 0:
            # One pool for the blend: a batch's items of every dataset spread over the workers.
            name = "--data-path blend of " + ", ".join(s.label or s.path for s in self.streams)
            self._pool = DecodePool(self.num_workers, name, self.decode_timeout_s)

    def __len__(self) -> int:
        return sum(len(s) for s in self.streams)

    @property
    def chat_turns(self):
        """The datasets' chat turn tokens (one tokenizer and prompt format for all), or None."""
        return self.streams[0].chat_turns

    def identity(self) -> tuple[str, int, str, int]:
        """What a checkpoint records (as :meth:`EnergonStream.identity`): the weighted paths,
        the samples of all datasets, one fingerprint of every dataset's shard index and its
        weight (another weight draws another order), and the seed."""
        parts = [(w, *s.identity()[:3]) for w, s in zip(self.weights, self.streams)]
        path = " ".join(f"{w:g} {p}" for w, p, _, _ in parts)
        digest = hashlib.sha256(repr([(w, n, f) for w, _, n, f in parts]).encode())
        return path, len(self), digest.hexdigest()[:16], self.seed

    def _choices(self, block: int) -> np.ndarray:
        if self._block is None or self._block[0] != block:
            start = block * BLOCK
            idx = np.arange(start, start + BLOCK, dtype=np.uint64)
            self._block = (block, blend_choices(self.seed, self.weights, idx))
        return self._block[1]  # the loader's thread only: payloads() finds sources first

    def source(self, k: int) -> tuple[int, int]:
        """``(dataset, its stream index)`` of stream index ``k``."""
        block, at = divmod(k, BLOCK)
        while len(self._before) <= block:  # draws counted once, block by block
            counts = np.bincount(self._choices(len(self._before) - 1), minlength=len(self.streams))
            self._before.append(self._before[-1] + counts)
        choices = self._choices(block)
        d = int(choices[at])
        return d, int(self._before[block][d]) + int(np.count_nonzero(choices[:at] == d))

    def meta(self, k: int):
        """Stream sample ``k``'s metadata (its dataset keeps the bytes for :meth:`payload`)."""
        d, j = self.source(k)
        return self.streams[d].meta(j)

    def payload(self, meta, k: int, with_features: bool = True):
        """Stream sample ``k``'s payload."""
        d, j = self.source(k)
        return self.streams[d].payload(meta, j, with_features)

    def discard(self, k: int) -> None:
        """Forget the bytes kept for stream sample ``k`` (a sample dropped before its payload)."""
        d, j = self.source(k)
        self.streams[d].discard(j)

    def encoded_media(self, k: int) -> dict[str, list[bytes]]:
        """Stream sample ``k``'s encoded item files (``EnergonStream.encoded_media``)."""
        d, j = self.source(k)
        return self.streams[d].encoded_media(j)

    def payloads(self, wanted, with_features: bool = True) -> list:
        """The payloads of ``(k, meta)`` pairs, in order; the media decoded by the worker
        processes when there are."""
        # Here, not at the top: --data-path's checks import this module for blend_of alone.
        from megatron.mllm.data_energon import decode_in_pool

        jobs = [(self.streams[d], j, meta) for (d, j), (_, meta) in
                 zip((self.source(k) for k, _ in wanted), wanted)]  # fmt: skip
        if self._pool is None or not with_features:
            return [s.payload(meta, j, with_features) for s, j, meta in jobs]
        return decode_in_pool(self._pool, [(s, s.take(j), meta) for s, j, meta in jobs])

    def workers_ready(self) -> float | None:
        """Wait until the decode workers have started; the seconds they took from launch (None
        without workers)."""
        return None if self._pool is None else self._pool.wait_ready()

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        for s in self.streams:
            s.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

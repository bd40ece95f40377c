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

(``train`` may also be a single ``path:``; an entry's ``subflavors`` are accepted and unused.)
An entry's ``path`` may be another metadataset YAML: it is drawn with the entry's weight, which
its own datasets share in proportion to their weights, as Energon blends a nested blend.

Stream index ``k`` comes from dataset ``d(k)``, drawn by weight from a hash of ``(seed, k)``
alone (:func:`blend_choices`), and is that dataset's own stream index ``j``: how many indices
before ``k`` drew ``d``. So the order depends on neither the parallel layout nor where a run
resumed, as for one dataset.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from megatron.mllm.arguments import ConfigError
from megatron.mllm.decode_pool import DEFAULT_TIMEOUT_S, DecodePool

METADATASET_SUFFIXES = (".yaml", ".yml")
"""A ``--data-path`` ending so is a metadataset YAML."""

BLOCK = 1 << 14
"""Stream indices whose draws are counted at once (the per-dataset positions' granularity)."""

_MASK = (1 << 64) - 1


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


def blend_of(entries: Sequence[str]) -> list[tuple[float, str, str]]:
    """``(weight, dataset directory, label)`` of each dataset ``--data-path`` names; the label
    names it in sample ids (the path as written).

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
    return _checked([(w, p, p) for w, p in pairs], "--data-path")


def read_metadataset(path: str) -> list[tuple[float, str, str]]:
    """The blend of an Energon v2 metadataset YAML's ``train`` split (see the module).

    Raises:
        ConfigError: naming the file, when it is missing, not YAML, or not such a blend.
    """
    return _checked(_read_metadataset(path, (), os.path.dirname(os.path.abspath(path))),
                    f"--data-path {path}")  # fmt: skip


def _read_metadataset(path: str, within: tuple[str, ...], top: str):
    """:func:`read_metadataset` of ``path``, nested in the YAMLs ``within`` (outermost first);
    labels are dataset paths relative to ``top``, the outermost YAML's directory."""
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
    split = (doc.get("splits") or {}).get("train") if isinstance(doc.get("splits"), dict) else None
    if not isinstance(split, dict):
        raise ConfigError(f"{where}: no 'splits: train:' entry")
    if "blend" in split:
        entries = split["blend"]
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{where}: 'splits.train.blend' must be a non-empty list")
    else:
        entries = [split]
    base = os.path.dirname(os.path.abspath(path))
    out = []
    for n, entry in enumerate(entries):
        at = f"{where}: splits.train.blend[{n}]" if "blend" in split else f"{where}: splits.train"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ConfigError(f"{at} needs a 'path' (a string)")
        unknown = sorted(set(entry) - {"path", "weight", "subflavors"})
        if unknown:
            raise ConfigError(f"{at}: unknown keys {unknown} (known: path, weight, subflavors)")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (
            weight > 0 and math.isfinite(weight)
        ):  # fmt: skip
            raise ConfigError(f"{at}: 'weight' must be a number > 0, got {weight!r}")
        rel = entry["path"]
        full = rel if os.path.isabs(rel) else os.path.normpath(os.path.join(base, rel))
        if rel.endswith(METADATASET_SUFFIXES):
            # A nested metadataset is drawn with its entry's weight, and shares it among its
            # own datasets in proportion to theirs (as Energon blends a nested blend).
            chain = tuple(os.path.realpath(p) for p in (*within, path))
            if os.path.realpath(full) in chain:
                raise ConfigError(f"{at}: {rel} includes itself (a cycle of metadatasets)")
            if not os.path.isfile(full):
                raise ConfigError(f"{at}: metadataset {rel} ({full}) is not a file")
            inner = _read_metadataset(full, (*within, path), top)
            total = sum(w for w, _, _ in inner)
            out.extend((float(weight) * w / total, p, label) for w, p, label in inner)
            continue
        if not os.path.isdir(full):
            raise ConfigError(f"{at}: dataset {rel} ({full}) is not a directory")
        label = os.path.normpath(os.path.relpath(full, top)) if not os.path.isabs(rel) else rel
        out.append((float(weight), full, os.path.basename(full) if label == "." else label))
    return out


def _checked(blend, where):
    seen = set()
    for _, path, _ in blend:
        key = os.path.realpath(path)
        if key in seen:
            raise ConfigError(f"{where}: dataset {path} is named twice")
        seen.add(key)
    return blend


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

    def encoded_sizes(self, k: int) -> dict[str, list[int]]:
        """Stream sample ``k``'s encoded item bytes (``EnergonStream.encoded_sizes``)."""
        d, j = self.source(k)
        return self.streams[d].encoded_sizes(j)

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

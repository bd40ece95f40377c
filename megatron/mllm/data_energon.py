# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Real data: this rank's samples of a Megatron-Energon dataset (``--data-path DIR``).

The dataset is WebDataset shards prepared by ``energon prepare`` (``.nv-meta/``); its samples
are read by random access through Energon's tar index (``ShardInfosITarReader``), so each DP
rank reads exactly the samples Megatron's sampler gives it (:func:`microbatch_indices`) and
nothing of another rank's. Stream index ``k`` is dataset sample ``perm_e[k mod N]`` of epoch
``e = k // N``, a permutation drawn from ``(seed, e)``: a resumed run, or one with another
parallel layout, sees the same samples in the same order.

:class:`EnergonStream` plays both parts :class:`megatron.mllm.data.BatchLoader` needs: the
stream (``meta(k)``: the sample's metadata, from its text and its media *headers* only, so the
balancer plans before anything is decoded) and the task (``payload``: decoding, tiling,
log-mels and token ids, once the batch's metadata has been gathered and checked). Between the
two the sample is held as its compact encoded bytes.

A sample is one ``json`` part (``type``, ``caption`` or ``text``) and its media part:
``png``/``jpg``/``jpeg``/``webp`` for ``caption`` (image-text), ``flac``/``wav`` for
``audio_caption`` (audio-text).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from megatron.mllm.arguments import ConfigError
from megatron.mllm.batch import PLACEHOLDER_TOKEN, SamplePayload, sample_layout
from megatron.mllm.data_state import shard_index_fingerprint
from megatron.mllm.preprocess import (
    AudioFeatures,
    DecodeError,
    ImageTiling,
    audio_header,
    image_size,
)
from megatron.mllm.tokenizer import TextTokenizer
from orchestration.workload import SampleMeta, WorkloadError

IMAGE_PARTS = ("png", "jpg", "jpeg", "webp")
"""WebDataset extensions read as images."""

AUDIO_PARTS = ("flac", "wav")
"""WebDataset extensions read as audio."""

SAMPLE_TYPES = {"caption": ("image", IMAGE_PARTS), "audio_caption": ("audio", AUDIO_PARTS)}
"""The sample types read, and the modality and parts of each one's media."""


class DataError(WorkloadError):
    """A sample of the dataset that cannot be read; the message names its shard and key."""


@dataclass(frozen=True)
class RawSample:
    """One sample as read from its shard: metadata inputs and still-encoded media."""

    name: str
    """``shard/key``: its id in logs and errors."""

    text_ids: tuple[int, ...]
    """Token ids of its text, ``<s>`` and ``</s>`` included."""

    modality: str
    """The modality of its one media item."""

    media: bytes
    """The encoded image or audio."""


def open_dataset(path: str):
    """Energon's random-access reader of the ``train`` split of the dataset at ``path``.

    Raises:
        ConfigError: ``path`` is not an Energon dataset, or Energon is not installed.
        WorkloadError: the dataset has no samples.
    """
    if not os.path.isdir(path):
        raise ConfigError(f"--data-path {path}: no such directory")
    if not os.path.isfile(os.path.join(path, ".nv-meta", ".info.json")):
        raise ConfigError(
            f"--data-path {path} is not an Energon dataset (no .nv-meta/.info.json): prepare it "
            "with `energon prepare`, or build the demo with `make demo-data`"
        )
    try:
        from megatron.energon.epathlib import EPath
        from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError
        from megatron.energon.flavors.webdataset.itar_reader import ShardInfosITarReader
        from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta
    except ImportError as e:
        raise ConfigError("--data-path needs megatron-energon: the 'data' extra") from e
    try:
        meta = WebdatasetMeta.from_config(EPath(path), split_part="train")
    except EmptyDatasetError as e:
        raise WorkloadError(f"--data-path {path}: the dataset is empty ({e})") from e
    reader = ShardInfosITarReader(EPath(path), meta.shards)
    if len(reader) == 0:
        raise WorkloadError(
            f"--data-path {path}: the dataset is empty (its shards hold no samples)"
        )
    return reader


@dataclass
class EnergonStream:
    """The samples of an Energon dataset, in stream order; a stream and a task for the loader."""

    path: str
    """``--data-path``."""

    tokenizer: TextTokenizer
    """The text tokenizer."""

    tiling: ImageTiling
    """How images become vision units."""

    audio: AudioFeatures
    """How audio becomes audio units."""

    seed: int
    """Seed of the epochs' sample orders."""

    num_workers: int = 0
    """``--num-workers``: threads that decode an iteration's payloads (0: the main thread)."""

    _reader: object = field(default=None, init=False, repr=False)
    _raw: dict[int, RawSample] = field(default_factory=dict, init=False, repr=False)
    _orders: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self._reader = open_dataset(self.path)
        if self.num_workers > 0:
            self._pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="orchweave-data")

    def __len__(self) -> int:
        return len(self._reader)

    def identity(self) -> tuple[str, int, str, int]:
        """What a checkpoint records of the stream (``megatron.mllm.data_state``): the
        dataset's absolute path, its number of samples, its shard index fingerprint, and the
        seed of the epochs' orders; the position is the iteration's, as the order is stateless."""
        fingerprint = shard_index_fingerprint(self.path)
        return os.path.abspath(self.path), len(self), fingerprint, self.seed

    def dataset_index(self, k: int) -> int:
        """The dataset sample at stream index ``k``."""
        n = len(self)
        epoch = k // n
        order = self._orders.get(epoch)
        if order is None:
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
            self._orders = {epoch: order}  # one epoch at a time is ever read
        return int(order[k % n])

    def read(self, index: int) -> RawSample:
        """Dataset sample ``index``: its text tokenized, its media still encoded.

        Raises:
            DataError: naming the shard and key, for a missing or malformed field.
        """
        sample = self._reader[index]
        name = f"{sample['__shard__']}/{sample['__key__']}"
        if "json" not in sample:
            raise DataError(f"sample {name}: missing field 'json'")
        try:
            info = json.loads(sample["json"])
        except ValueError as e:
            raise DataError(f"sample {name}: field 'json' is not JSON ({e})") from e
        kind = info.get("type") if isinstance(info, dict) else None
        if kind not in SAMPLE_TYPES:
            raise DataError(
                f"sample {name}: sample type {kind!r} cannot be read (known: "
                f"{', '.join(SAMPLE_TYPES)})"
            )
        text = info.get("caption", info.get("text"))
        if not isinstance(text, str):
            raise DataError(f"sample {name}: missing field 'caption' (a string) in 'json'")
        modality, parts = SAMPLE_TYPES[kind]
        part = next((p for p in parts if p in sample), None)
        if part is None:
            raise DataError(
                f"sample {name}: a {kind} sample needs one of the fields {', '.join(parts)}"
            )
        tk = self.tokenizer
        ids = (tk.token_id("<s>"), *tk.encode(text), tk.token_id("</s>"))
        return RawSample(name, ids, modality, sample[part])

    def sample_meta(self, raw: RawSample) -> SampleMeta:
        """The metadata of a read sample, from its media's header.

        Raises:
            DataError: naming the sample, when the header cannot be read.
        """
        try:
            if raw.modality == "image":
                item = self.tiling.item(*image_size(raw.media))
            else:
                item = self.audio.item(*audio_header(raw.media))
        except DecodeError as e:
            raise DataError(f"sample {raw.name}: {e}") from e
        return SampleMeta(raw.name, len(raw.text_ids), **{raw.modality: (item,)})

    def meta(self, k: int) -> SampleMeta:
        """Stream sample ``k``'s metadata; its bytes are kept for :meth:`payload`."""
        raw = self.read(self.dataset_index(k))
        self._raw[k] = raw
        return self.sample_meta(raw)

    def payload(self, meta: SampleMeta, k: int, with_features: bool = True) -> SamplePayload:
        """Stream sample ``k``'s payload (after :meth:`meta`; the kept bytes are released)."""
        raw = self._raw.pop(k, None) or self.read(self.dataset_index(k))
        return self.decode(raw, meta, with_features)

    def payloads(
        self, wanted: list[tuple[int, SampleMeta]], with_features: bool = True
    ) -> list[SamplePayload]:
        """The payloads of ``(k, meta)`` pairs, decoded by the worker threads when there are."""
        if self._pool is None:
            return [self.payload(meta, k, with_features) for k, meta in wanted]
        return list(self._pool.map(lambda km: self.payload(km[1], km[0], with_features), wanted))

    def decode(self, raw: RawSample, meta: SampleMeta, with_features: bool) -> SamplePayload:
        """Token ids laid out as :func:`sample_layout` places text and items, and features.

        Raises:
            DataError: naming the sample, when its media cannot be decoded or does not match
                the metadata its header gave.
        """
        spans, runs = sample_layout(meta)
        tokens = np.full(meta.llm_tokens, PLACEHOLDER_TOKEN, dtype=np.int64)
        text = np.asarray(raw.text_ids, dtype=np.int64)
        used = 0
        for start, length in runs:
            tokens[start : start + length] = text[used : used + length]
            used += length
        units: dict[str, list[np.ndarray]] = {}
        if with_features:
            encoder = "vision" if raw.modality == "image" else "audio"
            prep = self.tiling if raw.modality == "image" else self.audio
            try:
                feats = prep.features(raw.media)
            except DecodeError as e:
                raise DataError(f"sample {raw.name}: {e}") from e
            want = meta.items(raw.modality)[0].units
            if tuple(f.shape[0] for f in feats) != want:
                raise DataError(
                    f"sample {raw.name}: its decoded {raw.modality} has units "
                    f"{[f.shape[0] for f in feats]}, its header said {list(want)}"
                )
            units[encoder] = feats
        return SamplePayload(tokens=tokens, units=units)

    def close(self) -> None:
        """Stop the worker threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def stream_from_run(run) -> EnergonStream:
    """The Energon stream of a run with ``--data-path`` (``run.data`` set).

    Raises:
        ConfigError: a bad flag (tokenizer, tiling) or a path that is not an Energon dataset.
        WorkloadError: an empty dataset.
    """
    from megatron.mllm.tokenizer import load_tokenizer

    d, mm = run.data, run.multimodal
    tokenizer = load_tokenizer(d.tokenizer_type, d.tokenizer_model)
    if tokenizer.vocab_size > run.vocab_size:
        raise ConfigError(
            f"--vocab-size {run.vocab_size} is smaller than the tokenizer's vocabulary "
            f"({tokenizer.vocab_size} in --tokenizer-model {d.tokenizer_model})"
        )
    try:
        tiling = ImageTiling(mm.image_tile_size, mm.vision_patch_size, mm.image_max_tiles)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return EnergonStream(
        d.data_path, tokenizer, tiling, AudioFeatures(mm.audio_feature_dim), run.seed,
        num_workers=d.num_workers,
    )  # fmt: skip

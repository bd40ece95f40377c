# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Real data: this rank's samples of a Megatron-Energon dataset (``--data-path DIR``).

The dataset is WebDataset shards prepared by ``energon prepare`` (``.nv-meta/``); the samples
of its ``train`` split part (or the part a metadataset entry's ``split_part`` names) are read
by random access through Energon's tar index (``ShardInfosITarReader``), so each DP rank reads
exactly the samples Megatron's sampler gives it (:func:`microbatch_indices`) and nothing of
another rank's. Stream index ``k`` is dataset sample ``perm_e[k mod N]`` of epoch
``e = k // N``, a permutation drawn from ``(seed, e)``: a resumed run, or one with another
parallel layout, sees the same samples in the same order.

:class:`EnergonStream` plays both parts :class:`megatron.mllm.data.BatchLoader` needs: the
stream (``meta(k)``: the sample's metadata, from its text and its media *headers* only, so the
balancer plans before anything is decoded) and the task (``payload``: decoding, tiling,
log-mels and token ids, once the batch's metadata has been gathered and checked). Between the
two the sample is held as its compact encoded bytes. With ``--num-workers N`` the media are
decoded in N worker processes (:mod:`megatron.mllm.decode_pool`), bit-identical to decoding in
the main process and in the same order.

A sample is one ``json`` part and its media parts: captions (image-text and audio-text), VQA
samples and interleaved documents, their text in a ``--prompt-format``
(:mod:`megatron.mllm.data_formats`). Several datasets are blended by
:mod:`megatron.mllm.data_blend`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import numpy as np

from megatron.mllm.arguments import ConfigError
from megatron.mllm.batch import PLACEHOLDER_TOKEN, ChatTurns, SamplePayload, sample_layout
from megatron.mllm.data_blend import missing_split_part
from megatron.mllm.data_formats import (  # noqa: F401 (DataError: raised to callers)
    PROMPT_FORMATS,
    DataError,
    RawSample,
    read_sample,
)
from megatron.mllm.data_state import shard_index_fingerprint
from megatron.mllm.decode_pool import DEFAULT_TIMEOUT_S, DecodePool, Failed, decode_item
from megatron.mllm.image_dynamic import DynamicResolution, image_preprocessor
from megatron.mllm.overlong import truncated_text_ids
from megatron.mllm.preprocess import (
    AudioFeatures,
    DecodeError,
    ImageTiling,
    audio_header,
    image_size,
)
from megatron.mllm.tokenizer import TextTokenizer
from orchestration.workload import ENCODER_OF_MODALITY, SampleMeta, WorkloadError


def open_dataset(path: str, split_part: str = "train"):
    """Energon's random-access reader of split part ``split_part`` of the dataset at ``path``.

    Raises:
        ConfigError: ``path`` is not an Energon dataset, its ``.nv-meta/split.yaml`` has no such
            part, or Energon is not installed.
        WorkloadError: the dataset (its part) has no samples.
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
    missing = missing_split_part(path, split_part)
    if missing:  # Energon would only assert
        raise ConfigError(f"--data-path {path}: the dataset {missing}")
    try:
        meta = WebdatasetMeta.from_config(EPath(path), split_part=split_part)
    except EmptyDatasetError as e:
        what = "the dataset" if split_part == "train" else f"the dataset's {split_part} part"
        raise WorkloadError(f"--data-path {path}: {what} is empty ({e})") from e
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

    tiling: ImageTiling | DynamicResolution
    """How images become vision units (``--image-preprocess``)."""

    audio: AudioFeatures
    """How audio becomes audio units."""

    seed: int
    """Seed of the epochs' sample orders."""

    num_workers: int = 0
    """``--num-workers``: processes that decode an iteration's media (0: the main process)."""

    prompt_format: str = "caption"
    """``--prompt-format``: how text is wrapped (:mod:`megatron.mllm.data_formats`)."""

    label: str = ""
    """Names the dataset in sample ids (``label/shard/key``) within a blend; empty alone."""

    split_part: str = "train"
    """The part of the dataset's ``.nv-meta/split.yaml`` read (a metadataset's ``split_part``)."""

    decode_timeout_s: float = DEFAULT_TIMEOUT_S
    """The longest wait on the decode workers (a run's ``--distributed-timeout-minutes``)."""

    _reader: object = field(default=None, init=False, repr=False)
    _raw: dict[int, RawSample] = field(default_factory=dict, init=False, repr=False)
    _orders: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)
    _pool: DecodePool | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        check_prompt_format(self.prompt_format, self.tokenizer)
        self._reader = open_dataset(self.path, self.split_part)
        if self.num_workers > 0:
            # Started now: the workers import while the run sets up, before the first batch.
            name = f"--data-path {self.label or self.path}"
            self._pool = DecodePool(self.num_workers, name, self.decode_timeout_s)

    def __len__(self) -> int:
        return len(self._reader)

    @property
    def chat_turns(self) -> ChatTurns | None:
        """The turn tokens the loss masks by (``--prompt-format chat``), else None."""
        return ChatTurns.of(self.tokenizer) if self.prompt_format == "chat" else None

    def identity(self) -> tuple[str, int, str, int]:
        """What a checkpoint records of the stream (``megatron.mllm.data_state``): the
        dataset's absolute path, its number of samples, its shard index fingerprint, and the
        seed of the epochs' orders; the position is the iteration's, as the order is stateless.
        A part other than ``train`` is named in the path and folded into the fingerprint, which
        covers every part's shards: a resume on another part of the same shards is refused as
        one on another dataset is (``train``'s identity is what it was before parts were read)."""
        path, fingerprint = os.path.abspath(self.path), shard_index_fingerprint(self.path)
        if self.split_part != "train":
            path = f"{path} [split part {self.split_part}]"
            key = f"{fingerprint}\0{self.split_part}".encode()
            fingerprint = hashlib.sha256(key).hexdigest()[:16]
        return path, len(self), fingerprint, self.seed

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
        if self.label:
            name = f"{self.label}/{name}"
        return read_sample(sample, name, self.tokenizer, self.prompt_format)

    def sample_meta(self, raw: RawSample) -> SampleMeta:
        """The metadata of a read sample, from its media's header.

        Raises:
            DataError: naming the sample, when the header cannot be read.
        """
        items: dict[str, list] = {"image": [], "audio": []}
        try:
            for modality, media in raw.media:
                if modality == "image":
                    items[modality].append(self.tiling.item(*image_size(media)))
                else:
                    items[modality].append(self.audio.item(*audio_header(media)))
        except DecodeError as e:
            raise DataError(f"sample {raw.name}: {e}") from e
        return SampleMeta(
            raw.name,
            len(raw.text_ids),
            **{m: tuple(v) for m, v in items.items()},
            text_runs=raw.text_runs,
            item_order=raw.item_order,
        )

    def meta(self, k: int) -> SampleMeta:
        """Stream sample ``k``'s metadata; its bytes are kept for :meth:`payload`."""
        raw = self.read(self.dataset_index(k))
        self._raw[k] = raw
        return self.sample_meta(raw)

    def payload(self, meta: SampleMeta, k: int, with_features: bool = True) -> SamplePayload:
        """Stream sample ``k``'s payload (after :meth:`meta`; the kept bytes are released)."""
        return self.decode(self.take(k), meta, with_features)

    def take(self, k: int) -> RawSample:
        """Stream sample ``k`` as read, its kept bytes released (read again if not kept)."""
        return self._raw.pop(k, None) or self.read(self.dataset_index(k))

    def preprocessor(self, modality: str) -> ImageTiling | DynamicResolution | AudioFeatures:
        """What turns the media of ``modality`` into units (picklable: it goes to a worker)."""
        return self.tiling if modality == "image" else self.audio

    def discard(self, k: int) -> None:
        """Forget the bytes kept for stream sample ``k`` (a sample dropped before its payload)."""
        self._raw.pop(k, None)

    def encoded_media(self, k: int) -> dict[str, list[bytes]]:
        """Per modality, the encoded files of stream sample ``k``'s items in the order of
        ``SampleMeta.items``: what moving the files instead of the units would move."""
        raw = self._raw.get(k) or self.read(self.dataset_index(k))
        media: dict[str, list[bytes]] = {}
        for modality, data in raw.media:  # document order keeps each modality's own order
            media.setdefault(modality, []).append(data)
        return media

    def payloads(
        self, wanted: list[tuple[int, SampleMeta]], with_features: bool = True
    ) -> list[SamplePayload]:
        """The payloads of ``(k, meta)`` pairs, in order; the media decoded by the worker
        processes when there are (see :func:`decode_in_pool`)."""
        if self._pool is None or not with_features:
            return [self.payload(meta, k, with_features) for k, meta in wanted]
        return decode_in_pool(self._pool, [(self, self.take(k), meta) for k, meta in wanted])

    def decode(self, raw: RawSample, meta: SampleMeta, with_features: bool) -> SamplePayload:
        """Token ids laid out as :func:`sample_layout` places text and items, and features,
        decoded here (in the main process).

        Raises:
            DataError: naming the sample, when its media cannot be decoded or does not match
                the metadata its header gave.
        """
        # Lazily: the first item that cannot be decoded stops the sample, as a worker's does.
        feats = (decode_item(self.preprocessor(m), media) for m, media in raw.media)
        return self.assemble(raw, meta, feats if with_features else None)

    def assemble(self, raw: RawSample, meta: SampleMeta, features) -> SamplePayload:
        """The payload of a sample from its decoded items (:func:`decode_item`'s results, in
        document order; None: tokens only).

        Raises:
            DataError: naming the sample, for an item that failed or whose units do not match
                the metadata its header gave.
        """
        spans, runs = sample_layout(meta)
        tokens = np.full(meta.llm_tokens, PLACEHOLDER_TOKEN, dtype=np.int64)
        # A sample --overlong-samples truncate cut keeps its text's prefix and its </s>.
        text = np.asarray(truncated_text_ids(raw.text_ids, meta.text_tokens), dtype=np.int64)
        used = 0
        for start, length in runs:
            tokens[start : start + length] = text[used : used + length]
            used += length
        units: dict[str, list[np.ndarray]] = {}
        if features is None:
            return SamplePayload(tokens=tokens, units=units)
        seen = {"image": 0, "audio": 0}
        # Document order: each encoder's units in order.
        for (modality, _), feats in zip(raw.media, features, strict=True):
            if isinstance(feats, Failed):
                raise DataError(f"sample {raw.name}: {feats.message}")
            want = meta.items(modality)[seen[modality]].units
            seen[modality] += 1
            if tuple(f.shape[0] for f in feats) != want:
                raise DataError(
                    f"sample {raw.name}: its decoded {modality} has units "
                    f"{[f.shape[0] for f in feats]}, its header said {list(want)}"
                )
            units.setdefault(ENCODER_OF_MODALITY[modality], []).extend(feats)
        return SamplePayload(tokens=tokens, units=units)

    def workers_ready(self) -> float | None:
        """Wait until the decode workers have started; the seconds they took from launch (None
        without workers)."""
        return None if self._pool is None else self._pool.wait_ready()

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def decode_in_pool(pool: DecodePool, samples: list) -> list[SamplePayload]:
    """The payloads of ``(stream, raw sample, meta)`` triples, their media decoded by ``pool``'s
    worker processes: every item of the batch goes out at once (a document's images spread over
    the workers), and the payloads are assembled in order, the first failing sample raising.

    Raises:
        DataError: naming the sample, as :meth:`EnergonStream.decode` does.
        DecodePoolError: a worker died or stopped answering (naming the stream and rank).
    """
    jobs, names = [], []
    for stream, raw, _ in samples:
        for modality, media in raw.media:
            jobs.append((stream.preprocessor(modality), media))
            names.append(raw.name)
    decoded = iter(pool.map(jobs, names))
    return [
        stream.assemble(raw, meta, [next(decoded) for _ in raw.media])
        for stream, raw, meta in samples
    ]


def check_prompt_format(prompt_format: str, tokenizer: TextTokenizer) -> None:
    """Raise :class:`ConfigError` for an unknown ``--prompt-format``, or ``chat`` with a
    tokenizer that lacks its turn tokens."""
    from megatron.mllm.tokenizer import CHAT_TOKENS

    if prompt_format not in PROMPT_FORMATS:
        raise ConfigError(
            f"--prompt-format must be one of {', '.join(PROMPT_FORMATS)}, got {prompt_format!r}"
        )
    missing = [t for t in CHAT_TOKENS if not tokenizer.has_token(t)]
    if prompt_format == "chat" and missing:
        raise ConfigError(
            f"--prompt-format chat needs the turn tokens {', '.join(CHAT_TOKENS)}; "
            f"--tokenizer-model {tokenizer.directory} has no {', '.join(missing)}"
        )


def stream_from_run(run):
    """The stream of a run with ``--data-path`` (``run.data`` set): an
    :class:`EnergonStream`, a :class:`~megatron.mllm.data_blend.BlendedStream` of several, or
    a :class:`~megatron.mllm.data_epochized.EpochizedStream` of a ``blend_epochized``.

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
        tiling = image_preprocessor(
            mm.image_preprocess, mm.vision_patch_size, mm.image_tile_size, mm.image_max_tiles,
            mm.min_pixels, mm.max_pixels,
        )  # fmt: skip
    except ValueError as e:
        raise ConfigError(str(e)) from e
    from megatron.mllm.data_blend import BlendedStream, blend_of

    blend = blend_of(d.data_blend or (d.data_path,))
    alone = len(blend) == 1 and not blend.epochized  # (one epochized dataset may repeat)
    # A wait on the decode workers is bounded as a wait on another rank is.
    timeout = run.distributed_timeout.total_seconds()
    streams = [
        EnergonStream(
            e.path, tokenizer, tiling, AudioFeatures(mm.audio_feature_dim), run.seed,
            num_workers=d.num_workers if alone else 0,
            prompt_format=d.prompt_format, label=e.label if len(blend) > 1 else "",
            split_part=e.split_part, decode_timeout_s=timeout,
        )  # fmt: skip
        for e in blend
    ]
    if alone:
        return streams[0]
    weights = tuple(e.weight for e in blend)
    if blend.epochized:
        from megatron.mllm.data_epochized import EpochizedStream

        return EpochizedStream(streams, weights, run.seed, d.num_workers,
                               decode_timeout_s=timeout)  # fmt: skip
    return BlendedStream(streams, weights, run.seed, d.num_workers, decode_timeout_s=timeout)

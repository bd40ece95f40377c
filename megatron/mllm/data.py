# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The loader: each DP rank's samples of an iteration in Megatron's order, with synthetic data.

Every sample of the stream is addressed by its global index ``k``: its metadata comes from the
workload (``orchestration.workload_spec.SampleStream``: generated from ``(seed, k)``, or line
``k mod N`` of a JSONL file) and its payload is generated from ``(seed, k)``. A resumed run, or
a run with a different parallel layout, sees exactly the same data.

:class:`BatchLoader` is the first stage of an iteration: it loads this DP rank's samples (and
only those) in Megatron's sampler order, then all-gathers every rank's metadata (a few ints per
sample): the :class:`GlobalBatch` that the balancer plans from, the log line reports and the
length check reads, on every rank alike.

The language-modelling task is learnable and needs the encoders: each image or audio clip has a
hidden class, its features are that class's prototype plus noise, and the text run after an
item starts with the item's class token. The rest of the text follows a fixed bigram rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from megatron.mllm.batch import PLACEHOLDER_TOKEN, SamplePayload, sample_layout
from megatron.mllm.overlong import FittedBatch, SequenceTooLongError, check_fits, fit_batch
from megatron.mllm.timers import NULL_TIMERS, StepTimers
from orchestration.dispatcher import Dispatcher
from orchestration.metadata import GatheredMetadata, check_encoders
from orchestration.packing import microbatch_indices
from orchestration.workload import (
    ENCODER_OF_MODALITY,
    MODALITIES,
    SampleMeta,
    WorkloadError,
    missing_encoder_error,
)
from orchestration.workload_spec import SampleStream

BOS_TOKEN = 1
"""Token that opens every sample."""

_ENCODER_INDEX = {"vision": 0, "audio": 1}


@dataclass(frozen=True)
class SyntheticTask:
    """The rules that turn metadata into learnable token ids and encoder features."""

    vocab_size: int
    """Real (unpadded) vocabulary; ids are drawn below it."""

    num_classes: int
    """Hidden classes per encoder."""

    input_dims: dict[str, int]
    """Features per token of each encoder."""

    seed: int
    """Seed of the prototypes and of every sample's payload."""

    noise: float = 0.5
    """Standard deviation of the feature noise around a class prototype."""

    def __post_init__(self):
        if self.first_text_token + 2 > self.vocab_size:
            raise ValueError(
                f"--vocab-size {self.vocab_size} is too small for --synthetic-num-classes "
                f"{self.num_classes}: need at least {self.first_text_token + 2}"
            )
        rng = np.random.default_rng([self.seed, 0x5EED])
        object.__setattr__(
            self,
            "_prototypes",
            {
                enc: rng.standard_normal((self.num_classes, dim)).astype(np.float32)
                for enc, dim in sorted(self.input_dims.items())
            },
        )

    @property
    def first_text_token(self) -> int:
        """Ids below this are reserved: placeholder, BOS and the class tokens."""
        return 2 + len(_ENCODER_INDEX) * self.num_classes

    def class_token(self, encoder: str, cls: int) -> int:
        """The token that names class ``cls`` of ``encoder``."""
        return 2 + _ENCODER_INDEX[encoder] * self.num_classes + cls

    def next_text_token(self, token: int) -> int:
        """The bigram rule of plain text."""
        lo = self.first_text_token
        return lo + ((token - lo) * 7 + 3) % (self.vocab_size - lo)

    def payload(self, meta: SampleMeta, index: int, with_features: bool = True) -> SamplePayload:
        """The payload of stream sample ``index``.

        Args:
            meta: its metadata.
            index: its global stream index (seeds the payload).
            with_features: also generate encoder features (only encoder input stages need them).
        """
        rng = np.random.default_rng([self.seed, index])
        spans, text_runs = sample_layout(meta)
        tokens = np.full(meta.llm_tokens, PLACEHOLDER_TOKEN, dtype=np.int64)
        classes = rng.integers(0, self.num_classes, size=len(spans))
        units: dict[str, list[np.ndarray]] = {}
        # Text run r follows item r-1 (run 0 opens the sample).
        for r, (start, length) in enumerate(text_runs):
            if length == 0:
                continue
            if r == 0:
                first = BOS_TOKEN
                second = int(rng.integers(self.first_text_token, self.vocab_size))
            else:
                enc = ENCODER_OF_MODALITY[spans[r - 1].modality]
                first = self.class_token(enc, int(classes[r - 1]))
                second = self.next_text_token(first)
            run = [first, second]
            while len(run) < length:
                run.append(self.next_text_token(run[-1]))
            tokens[start : start + length] = run[:length]
        if with_features:
            for span, cls in zip(spans, classes):
                enc = ENCODER_OF_MODALITY[span.modality]
                proto = self._prototypes[enc][int(cls)]
                for unit in meta.items(span.modality)[span.index].units:
                    noise = rng.standard_normal((unit, proto.shape[0]), dtype=np.float32)
                    units.setdefault(enc, []).append(proto + self.noise * noise)
        return SamplePayload(tokens=tokens, units=units)


@dataclass(frozen=True)
class LoadedSample:
    """One sample as its loader holds it."""

    index: int
    """Its stream index."""

    meta: SampleMeta
    """Its metadata."""

    payload: SamplePayload
    """Its token ids and (where this rank needs them) encoder features."""


@dataclass
class GlobalBatch:
    """One iteration as a DP rank sees it: its own samples, and every rank's metadata."""

    iteration: int
    """The iteration."""

    microbatches: list[list[LoadedSample]]
    """This rank's samples, in Megatron's microbatches and order."""

    metadata: GatheredMetadata
    """Every DP rank's sample metadata (all-gathered, with sample ids)."""

    next_metadata: GatheredMetadata | None = None
    """The next iteration's metadata, gathered one iteration early (loaders that look ahead,
    for a step that plans ahead), or None."""

    control: list[np.ndarray] | None = None
    """Every DP rank's control words of this iteration's gather (what the step gave the loader
    to carry, e.g. the digest of its plan), in group rank order; None when none were sent."""

    next_microbatches: list[list[SampleMeta]] | None = None
    """This rank's samples of the next iteration, in Megatron's microbatches (loaders that
    look ahead; the dynamic pipeline searches their schedule while this iteration runs)."""

    truncated_samples: int = 0
    """Samples of the whole batch (all DP ranks) whose text ``--overlong-samples truncate``
    cut."""

    dropped_samples: int = 0
    """Samples of the whole batch (all DP ranks) that ``--overlong-samples drop`` skipped."""

    @property
    def samples(self) -> list[LoadedSample]:
        """This rank's samples, in loading order."""
        return [s for mb in self.microbatches for s in mb]

    def data_iterator(self) -> Iterator["LoadedMicrobatch"]:
        """What a training step's ``data_iterator`` yields: this rank's microbatches."""
        return iter([LoadedMicrobatch(mb, self) for mb in self.microbatches])


@dataclass
class LoadedMicrobatch:
    """A loaded microbatch; it knows its iteration, so that a balancing step can re-plan the
    whole global batch."""

    samples: list[LoadedSample]
    """Its samples."""

    batch: GlobalBatch = field(repr=False)
    """The iteration it belongs to."""

    def pairs(self) -> list[tuple[SampleMeta, SamplePayload]]:
        """``(metadata, payload)`` of each sample, for the packers."""
        return [(s.meta, s.payload) for s in self.samples]


@dataclass
class BatchLoader:
    """Loads one DP rank's samples of every iteration and gathers the batch's metadata."""

    stream: SampleStream
    """The workload."""

    task: SyntheticTask
    """The synthetic payloads."""

    dispatcher: Dispatcher
    """Collectives over this rank's DP group (the metadata all-gather)."""

    micro_batch_size: int
    """Samples per microbatch (Megatron's order)."""

    num_microbatches: int
    """Microbatches per DP rank per iteration."""

    seq_length: int
    """``--seq-length``; longer samples are an error."""

    with_features: bool
    """Generate encoder features (only ranks that run an encoder's input layer need them)."""

    encoders: tuple[str, ...]
    """The model's encoders; a sample with items for another one is an error."""

    timers: StepTimers = NULL_TIMERS
    """Where loading reports its time (``payloads``; the dispatcher times the gather)."""

    lookahead: bool = False
    """Gather the next iteration's metadata with this one's (one gather per iteration, one
    iteration early), so that a step can plan the next iteration while this one runs."""

    train_iters: int | None = None
    """The last iteration + 1: nothing is gathered ahead beyond it."""

    share_errors: Callable[[str | None], str | None] | None = None
    """Real data: gathers every rank's reading problem (or None) and returns the first, so a
    sample that cannot be read stops every rank with its error instead of leaving the others
    waiting at the next collective; None where reading cannot fail (synthetic data)."""

    overlong_samples: str = "error"
    """``--overlong-samples``: what a sample longer than :attr:`seq_length` does (see
    :mod:`megatron.mllm.overlong`)."""

    _ahead: tuple[int, list, GatheredMetadata] | None = field(default=None, init=False, repr=False)

    def load(self, iteration: int, control: np.ndarray | None = None) -> GlobalBatch:
        """This rank's samples of ``iteration`` and the batch's metadata; collective over DP.

        With :attr:`lookahead`, the gather also carries the next iteration's metadata (kept for
        the next call, which then gathers only the one after); the first call, and the first
        after a resume, gathers both. ``control`` words ride along (see
        :meth:`~orchestration.dispatcher.Dispatcher.gather_batches`).

        Raises:
            SequenceTooLongError: on every rank, naming the first sample of any rank that does
                not fit ``--seq-length`` (``--overlong-samples error``), or that cannot be made
                to fit (:func:`megatron.mllm.overlong.fit_batch`).
            WorkloadError: on every rank, naming the first sample with items for an encoder
                the model lacks.
        """
        wanted = [iteration]
        if self._ahead is not None and self._ahead[0] == iteration:
            wanted = []
        if self.lookahead and (self.train_iters is None or iteration + 1 < self.train_iters):
            wanted.append(iteration + 1)
        metas_of = self._shared(lambda: {i: self._metas(i) for i in wanted})
        gathered, controls = [], None
        if wanted or control is not None:  # the same on every rank
            gathered, controls = self.dispatcher.gather_batches(
                [[pair for mb in metas_of[i] for pair in mb] for i in wanted], control
            )
        by_iteration = dict(zip(wanted, gathered))
        if iteration in by_iteration:
            metas, metadata = metas_of[iteration], by_iteration[iteration]
        else:
            _, metas, metadata = self._ahead
        self._ahead = None
        if iteration + 1 in by_iteration:
            self._ahead = (iteration + 1, metas_of[iteration + 1], by_iteration[iteration + 1])
        next_metadata, next_own = None, None
        if self._ahead is not None:
            next_metas, next_metadata = self._ahead[1], self._ahead[2]
            if self.overlong_samples != "error":
                try:
                    fitted = fit_batch(next_metadata, self.seq_length, self.overlong_samples)
                    next_metas, next_metadata = (
                        self._fitted_own(next_metas, fitted),
                        fitted.metadata,
                    )
                except SequenceTooLongError:
                    pass  # raised when it becomes the current iteration, as check_fits is
            next_own = [[meta for _, meta in mb] for mb in next_metas]
        # The whole batch's metadata is checked before any payload is made: a bad sample then
        # stops every rank with the same error, and is never allocated. (The next iteration's
        # is checked when it becomes the current one.)
        fitted = None
        if self.overlong_samples == "error":
            check_fits(metadata, self.seq_length)
        check_encoders(metadata, self.encoders)
        if self.overlong_samples != "error":
            fitted = fit_batch(metadata, self.seq_length, self.overlong_samples)
            metas, metadata = self._fitted_own(metas, fitted), fitted.metadata
        with self.timers.span("payloads"):
            pairs = [pair for mb in metas for pair in mb]
            made = iter(self._shared(lambda: self._payloads(pairs)))
            microbatches = [[LoadedSample(k, meta, next(made)) for k, meta in mb] for mb in metas]
        return GlobalBatch(
            iteration,
            microbatches,
            metadata,
            next_metadata,
            None if control is None else controls,
            next_own,
            0 if fitted is None else fitted.truncated,
            0 if fitted is None else fitted.dropped,
        )

    def _fitted_own(self, metas: list[list[tuple[int, SampleMeta]]], fitted: FittedBatch):
        """This rank's microbatches as ``fitted`` trains them; a real-data stream forgets the
        bytes it kept for the samples dropped."""
        own = fitted.own(metas, self.dispatcher.rank)
        discard = getattr(self.stream, "discard", None)
        if fitted.dropped and discard is not None:
            kept = {k for mb in own for k, _ in mb}
            for k in (k for mb in metas for k, _ in mb if k not in kept):
                discard(k)
        return own

    def _payloads(self, pairs: list[tuple[int, SampleMeta]]) -> list[SamplePayload]:
        """The payloads of ``(stream index, metadata)`` pairs, in order."""
        if hasattr(self.task, "payloads"):  # a task that decodes in parallel
            return self.task.payloads(pairs, self.with_features)
        return [self.task.payload(meta, k, self.with_features) for k, meta in pairs]

    def _shared(self, read: Callable):
        """``read()``; with :attr:`share_errors`, a :class:`WorkloadError` of any rank is raised
        on every rank (one small gather)."""
        if self.share_errors is None:
            return read()
        out, problem = None, None
        try:
            out = read()
        except WorkloadError as e:
            problem = str(e)
        first = self.share_errors(problem)
        if first is not None:
            raise WorkloadError(first)
        return out

    def _metas(self, iteration: int) -> list[list[tuple[int, SampleMeta]]]:
        """This rank's (stream index, metadata) pairs of ``iteration``, per microbatch."""
        d = self.dispatcher
        indices = microbatch_indices(
            iteration, d.rank, d.world, self.micro_batch_size, self.num_microbatches
        )
        return [[(k, self.stream.meta(k)) for k in mb] for mb in indices]


def check_stream_encoders(stream: SampleStream, encoders: Sequence[str], count: int) -> None:
    """Before any process group exists: the first ``count`` samples of ``stream`` have items
    only for ``encoders``, so a model built without an encoder the data needs stops every rank
    at once (the loader checks every batch again, on every rank alike).

    Raises:
        WorkloadError: naming the first such sample and the encoder's flag.
    """
    unread = [m for m in MODALITIES if ENCODER_OF_MODALITY[m] not in encoders]
    if stream.generator is not None:  # a spec says what it can draw: no need to look
        unread = [m for m in unread if m in stream.generator.spec.modalities]
    if not unread:
        return
    for k in range(count):
        meta = stream.meta(k)
        modality = meta.unencoded(encoders)
        if modality is not None:
            raise missing_encoder_error(f"sample {meta.sample_id!r} (stream index {k})", modality)

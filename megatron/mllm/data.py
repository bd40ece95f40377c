# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Synthetic multimodal data consistent with sample metadata, and Megatron's data order.

Every sample of the stream is addressed by its global index ``k``: its metadata comes from the
workload (generated from ``(seed, k)``, or line ``k mod N`` of a JSONL file) and its payload is
generated from ``(seed, k)``. Any rank can therefore produce any sample, and a resumed run, or
a run with a different parallel layout, sees exactly the same data.

The language-modelling task is learnable and needs the encoders: each image or audio clip has a
hidden class, its features are that class's prototype plus noise, and the text run after an
item starts with the item's class token. The rest of the text follows a fixed bigram rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from megatron.mllm.batch import PLACEHOLDER_TOKEN, SamplePayload, sample_layout
from orchestration.workload import ENCODER_OF_MODALITY, SampleMeta, WorkloadError, read_jsonl
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec

BOS_TOKEN = 1
"""Token that opens every sample."""

_ENCODER_INDEX = {"vision": 0, "audio": 1}


class SequenceTooLongError(ValueError):
    """A sample does not fit the LLM's sequence length."""


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


class SampleSource:
    """The stream of sample metadata: a generated workload, or a JSONL file cycled in order."""

    def __init__(self, workload: str, seed: int = 0, token_scale: float = 1.0):
        """Open a workload spec (path or built-in name) or a ``.jsonl`` metadata file.

        Raises:
            WorkloadError: the file is missing or malformed.
        """
        self.workload = workload
        self._samples: list[SampleMeta] | None = None
        self._generator: WorkloadGenerator | None = None
        if os.fspath(workload).endswith(".jsonl"):
            if token_scale != 1.0:
                raise WorkloadError("--workload-token-scale applies to specs, not to JSONL files")
            self._samples = read_jsonl(workload)
        else:
            self._generator = WorkloadGenerator(
                WorkloadSpec.load(workload), seed=seed, token_scale=token_scale
            )

    def meta(self, index: int) -> SampleMeta:
        """Metadata of stream sample ``index``."""
        if self._samples is not None:
            return self._samples[index % len(self._samples)]
        return self._generator.sample(index)


def check_fits(metas: Sequence[tuple[int, SampleMeta]], seq_length: int, dp_rank: int) -> None:
    """Raise :class:`SequenceTooLongError` naming the first sample longer than ``seq_length``."""
    for index, meta in metas:
        if meta.llm_tokens > seq_length:
            raise SequenceTooLongError(
                f"sample {meta.sample_id!r} (stream index {index}, loaded by data-parallel rank "
                f"{dp_rank}) has {meta.llm_tokens} LLM tokens ({meta.text_tokens} text + "
                f"{meta.llm_tokens - meta.text_tokens} from encoders), more than --seq-length "
                f"{seq_length}"
            )

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A metadataset's ``blend_epochized``: epochs that hold each dataset's samples R times.

Energon's ``MetadatasetBlendEpochized`` lists datasets with ``repetitions`` instead of
weights: one epoch of the blend reads every sample of dataset ``d`` ``R_d`` times (``R_d`` an
int or a float; a fractional part reads that fraction of the dataset, the first samples of one
more shuffled pass), interleaved at random, and the next epoch starts again. It is not drawn
by weight: the counts are exact.

Here the epoch of dataset ``d`` takes ``T_d = floor(R_d * N_d)`` samples (``R_d`` read as the
decimal it was written as, so ``2.3 x 10`` is 23), and the epoch holds ``L = sum T_d``
stream indices. Epoch ``e``'s order is a permutation, drawn from ``(seed, e)``, of ``T_d``
slots of each dataset; the ``t``-th slot of ``d`` in that order is dataset ``d``'s own stream
index ``j = e * P_d * N_d + t``, with ``P_d = ceil(T_d / N_d)`` passes per epoch. Dataset
``d``'s stream (:class:`~megatron.mllm.data_energon.EnergonStream`) reads ``j`` as sample
``perm[j mod N_d]`` of its own epoch ``j // N_d``, a permutation: each whole pass reads every
sample once, a partial pass ``T_d mod N_d`` distinct ones. Stream index ``k`` is thus a pure
function of ``(seed, k)``, whatever the parallel layout or where a run resumed.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from megatron.mllm.data_blend import BlendedStream
from orchestration.workload import WorkloadError

_ORDER_KEY = 0x45504F43
"""Keys the epoch orders' generator apart from the datasets' own, which use ``(seed, epoch)``."""

_EPOCHS_KEPT = 2
"""Epoch orders kept: a global batch across an epoch's end reads two in turn."""


def samples_per_epoch(repetitions: float, num_samples: int) -> int:
    """``floor(repetitions * num_samples)``, with ``repetitions`` as the decimal it reads as
    (``2.3`` is 23/10, not the float just below it)."""
    return math.floor(Fraction(repr(float(repetitions))) * num_samples)


@dataclass
class EpochizedStream(BlendedStream):
    """A ``blend_epochized`` of datasets' streams: each epoch holds each dataset's samples
    ``weights[d]`` times, shuffled. A stream and a task for the loader, as
    :class:`~megatron.mllm.data_blend.BlendedStream` is (whose decoding it shares); only the
    source of a stream index differs.

    ``weights`` holds each dataset's repetitions per epoch (any number > 0).
    """

    _takes: np.ndarray = field(default=None, init=False, repr=False)
    _starts: np.ndarray = field(default=None, init=False, repr=False)
    _orders: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        takes = [samples_per_epoch(r, len(s)) for r, s in zip(self.weights, self.streams)]
        for d, (r, s, t) in enumerate(zip(self.weights, self.streams, takes)):
            if not (r > 0 and math.isfinite(r)):
                raise ValueError(f"dataset {d}'s repetitions must be a number > 0, got {r!r}")
            if t == 0:
                # Energon would read nothing of it; listing it is then surely a mistake.
                name = getattr(s, "label", "") or getattr(s, "path", f"dataset {d}")
                raise WorkloadError(
                    f"blend_epochized: {name} has {len(s)} samples: repetitions {r:g} take none "
                    "of them per epoch"
                )
        super().__post_init__()  # (after the checks: it starts the decoding threads)
        self._takes = np.asarray(takes, dtype=np.int64)
        self._starts = np.concatenate(([0], np.cumsum(self._takes)[:-1]))

    def __len__(self) -> int:
        """Stream indices per epoch: every dataset's samples times its repetitions."""
        return int(self._takes.sum())

    @property
    def repetitions(self) -> tuple[float, ...]:
        """Each dataset's repetitions per epoch (``weights``)."""
        return self.weights

    def identity(self) -> tuple[str, int, str, int]:
        """What a checkpoint records (as :meth:`BlendedStream.identity`): the datasets and their
        repetitions, the samples of one epoch, one fingerprint of every dataset's shard index
        and its repetitions (marked apart from a weighted blend of the same numbers), and the
        seed."""
        parts = [(r, *s.identity()[:3]) for r, s in zip(self.weights, self.streams)]
        path = "epochized " + " ".join(f"{r:g}x {p}" for r, p, _, _ in parts)
        key = repr(("blend_epochized", [(r, n, f) for r, _, n, f in parts]))
        return path, len(self), hashlib.sha256(key.encode()).hexdigest()[:16], self.seed

    def epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch ``epoch``'s dataset at each position, and how many earlier positions of the
        epoch took that dataset (its slot ``t``); 12 bytes per position, two epochs kept."""
        kept = self._orders.get(epoch)
        if kept is not None:
            return kept
        slots = np.repeat(np.arange(len(self.streams), dtype=np.int32), self._takes)
        rng = np.random.default_rng([self.seed, epoch, _ORDER_KEY])
        datasets = slots[rng.permutation(len(slots))]
        # Each dataset's slots are taken in order along the epoch, so its own stream reads its
        # passes one after another (its stream keeps one epoch's permutation at a time).
        by_dataset = np.argsort(datasets, kind="stable")
        ranks = np.empty(len(slots), dtype=np.int64)
        ranks[by_dataset] = np.arange(len(slots)) - np.repeat(self._starts, self._takes)
        while len(self._orders) >= _EPOCHS_KEPT:
            del self._orders[min(self._orders)]
        self._orders[epoch] = (datasets, ranks)
        return datasets, ranks

    def source(self, k: int) -> tuple[int, int]:
        """``(dataset, its stream index)`` of stream index ``k``."""
        epoch, at = divmod(k, len(self))
        datasets, ranks = self.epoch_order(epoch)
        d = int(datasets[at])
        n = len(self.streams[d])
        passes = -(-int(self._takes[d]) // n)
        return d, epoch * passes * n + int(ranks[at])

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The calibration's fits: non-negative least squares, and the joint fit of a module's chunks.

Pure numpy. Every cost is a sum of non-negative parts (a fixed cost, a cost per token, ...), so
every fit is NNLS; times are fitted on relative errors, so that small and large shapes count
alike, as they do in a step made of many small microbatches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (drop negative columns and refit)."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def relative_nnls(a: np.ndarray, b: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """NNLS minimising errors relative to ``scale`` (default ``b``): small and large shapes
    count alike, as they do in a step made of many small microbatches."""
    s = np.maximum(np.asarray(b if scale is None else scale, dtype=float), 1e-12)
    return nnls(a / s[:, None], np.asarray(b, dtype=float) / s)


COLUMNS = ("chunk", "layer", "layer_seq", "layer_tok", "layer_sq", "in", "in_tok", "head",
           "head_tok", "head_row")  # fmt: skip
"""Columns of the joint fit of a chunk's time: the chunk call, its layers (fixed, per extra
packed sequence, per token, per squared length), the input layer (fixed, per token), the head
(fixed, per token, per LLM row produced)."""

MEMORY_COLUMNS = ("layer_tok", "layer_sq", "in_tok", "head_tok", "head_row")
"""The columns of the saved bytes: bytes have no fixed parts (per token, per squared length,
per row)."""


def chunk_features(
    layers: int, lens: Sequence[int], first: bool, last: bool, rows: int
) -> list[float]:
    """One point's row of the joint fit (:data:`COLUMNS`).

    Args:
        layers: transformer layers of the chunk.
        lens: its packed sequences (units, for an encoder).
        first: whether it holds the module's input layer.
        last: whether it holds the module's head.
        rows: LLM rows an encoder's head produces (0 for the LLM).
    """
    n, k = float(sum(lens)), float(len(lens))
    sq = float(sum(x * x for x in lens))
    f, l_ = float(first), float(last)
    return [1.0, layers, layers * (k - 1), layers * n, layers * sq, f, f * n, l_, l_ * n, l_ * rows]


@dataclass
class ChunkFit:
    """A module's chunk costs, fitted jointly: coefficient per column of :data:`COLUMNS`."""

    forward: dict[str, float]
    """Forward time (the unit of the measured times)."""

    backward: dict[str, float]
    """Backward time."""

    memory: dict[str, float]
    """Bytes saved for backward (:data:`MEMORY_COLUMNS` only)."""

    forward_errors: np.ndarray
    """Relative error of the fit at each point, forward."""

    backward_errors: np.ndarray
    """Relative error of the fit at each point, backward."""


def fit_chunks(
    features: Sequence[Sequence[float]],
    forward: Sequence[float],
    backward: Sequence[float],
    saved: Sequence[float],
) -> ChunkFit:
    """One fit over all of a module's measured chunks, so that the parts add up to the chunks
    the trainer runs (fitting the layers first and the edges from what is left would push the
    layer fit's errors into the edges).

    Args:
        features: each point's :func:`chunk_features`.
        forward: each point's forward time.
        backward: each point's backward time.
        saved: each point's bytes saved for backward.
    """
    a = np.array(features, dtype=float)
    f, b = np.array(forward, dtype=float), np.array(backward, dtype=float)
    cf = relative_nnls(a, f)
    cb = relative_nnls(a, b)
    idx = [COLUMNS.index(c) for c in MEMORY_COLUMNS]
    cm = nnls(a[:, idx], np.array(saved, dtype=float))
    return ChunkFit(
        forward=dict(zip(COLUMNS, cf.tolist())),
        backward=dict(zip(COLUMNS, cb.tolist())),
        memory=dict(zip(MEMORY_COLUMNS, cm.tolist())),
        forward_errors=np.abs(a @ cf / f - 1),
        backward_errors=np.abs(a @ cb / b - 1),
    )

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Summary statistics of a set of samples: what a workload looks like to the balancer.

`workload_stats` is a pure function of the sample metadata, so the report tool, benchmarks
and tests all describe a workload with the same numbers. It answers the questions that decide
how much balancing can win: how often each modality occurs, how heavy its samples are (the
tail matters more than the mean), which modality mixes occur, and how much the share of each
modality varies from sample to sample (OrchMLLM's "modality composition incoherence").

The result is a JSON-ready dict (ints, floats, strings, lists, dicts and ``None``) with
these keys, which stay stable::

    num_samples: int
    modalities:                              # always all of "image", "audio", "video", "text"
      <image|audio|video>:
        samples: int                         # samples with at least one item of it
        sample_share: float                  # samples / num_samples
        items: {total: int,
                per_sample_mean: float,      # over all samples
                per_containing_sample_mean: float | None}
        encoder_units: TOKENS                # units per sample, over samples with it
        encoder_tokens: TOKENS               # encoder tokens per sample, over samples with it
        llm_tokens: TOKENS                   # LLM positions per sample, over samples with it
      text:
        samples: int                         # samples with text_tokens > 0
        sample_share: float
        llm_tokens: TOKENS                   # text tokens per sample, over samples with text
    llm_tokens: TOKENS                       # whole LLM sequence per sample, over all samples
    combinations: [{modalities: str, samples: int, share: float}]
        # "image+audio+text" style names (image, audio, video, text order; "none" for a sample
        # with nothing), sorted by share, largest first, then by name
    modality_share:                          # per sample: share of its LLM tokens from each
      <image|audio|video|text>: SHARES       # modality, 0 where absent, over samples with
                                             # llm_tokens > 0
    components: [{name: str | None, samples: int, share: float}] | None
        # the `component` the samples carry, sorted like combinations; None when no sample
        # carries one; name None groups the samples without one in a mixed set

    TOKENS = {total, mean, p50, p90, p99, max}    # total an int; the rest None when empty
    SHARES = {mean, std, p10, p50, p90, min, max}

Percentiles use numpy's default (linear interpolation between order statistics); ``std`` is
the population standard deviation.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

import numpy as np

from orchestration.workload import MODALITIES, SampleMeta, WorkloadError

ALL_MODALITIES: tuple[str, ...] = (*MODALITIES, "text")
"""The modalities the statistics report on, in report order."""

TOKEN_STATS: tuple[str, ...] = ("total", "mean", "p50", "p90", "p99", "max")
"""Keys of a per-sample token summary."""

SHARE_STATS: tuple[str, ...] = ("mean", "std", "p10", "p50", "p90", "min", "max")
"""Keys of a per-sample share summary."""


def workload_stats(samples: Iterable[SampleMeta]) -> dict[str, Any]:
    """Summarise sample metadata; the keys are listed in the module docstring.

    Args:
        samples (Iterable[SampleMeta]): the samples, generated or read from JSONL.

    Returns:
        dict[str, Any]: JSON-ready statistics, deterministic in the samples.

    Raises:
        WorkloadError: there are no samples.
    """
    samples = list(samples)
    if not samples:
        raise WorkloadError("workload statistics need at least one sample")
    n = len(samples)
    total_llm = np.array([s.llm_tokens for s in samples], dtype=np.int64)

    modalities: dict[str, Any] = {}
    llm_by_modality: dict[str, np.ndarray] = {}
    for m in MODALITIES:
        per_sample = [s.items(m) for s in samples]
        count = np.array([len(items) for items in per_sample], dtype=np.int64)
        units = np.array([sum(len(i.units) for i in items) for items in per_sample], np.int64)
        enc = np.array([sum(i.encoder_tokens for i in items) for items in per_sample], np.int64)
        llm = np.array([sum(i.llm_tokens for i in items) for items in per_sample], np.int64)
        llm_by_modality[m] = llm
        has = count > 0
        modalities[m] = {
            "samples": int(has.sum()),
            "sample_share": float(has.mean()),
            "items": {
                "total": int(count.sum()),
                "per_sample_mean": float(count.mean()),
                "per_containing_sample_mean": float(count[has].mean()) if has.any() else None,
            },
            "encoder_units": _token_summary(units[has]),
            "encoder_tokens": _token_summary(enc[has]),
            "llm_tokens": _token_summary(llm[has]),
        }
    text = np.array([s.text_tokens for s in samples], dtype=np.int64)
    llm_by_modality["text"] = text
    has_text = text > 0
    modalities["text"] = {
        "samples": int(has_text.sum()),
        "sample_share": float(has_text.mean()),
        "llm_tokens": _token_summary(text[has_text]),
    }

    # A sample with no LLM tokens at all has no composition; leave it out of the shares
    # rather than count it as 0 of everything.
    nonempty = total_llm > 0
    modality_share = {
        m: _share_summary(llm_by_modality[m][nonempty] / total_llm[nonempty])
        for m in ALL_MODALITIES
    }

    combos = Counter("+".join(s.modalities) or "none" for s in samples)
    has_component = any(s.component is not None for s in samples)
    components = Counter(s.component for s in samples) if has_component else None

    return {
        "num_samples": n,
        "modalities": modalities,
        "llm_tokens": _token_summary(total_llm),
        "combinations": [
            {"modalities": name, "samples": k, "share": k / n} for name, k in _by_share(combos)
        ],
        "modality_share": modality_share,
        "components": (
            None
            if components is None
            else [{"name": name, "samples": k, "share": k / n} for name, k in _by_share(components)]
        ),
    }


def _by_share(counts: Counter) -> list[tuple[Any, int]]:
    # Ties broken by name so that the order, and with it the JSON, is deterministic; None
    # (samples without a component) sorts last among equals.
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0] is None, str(kv[0])))


def _token_summary(values: np.ndarray) -> dict[str, Any]:
    if values.size == 0:
        return {"total": 0, **{k: None for k in TOKEN_STATS[1:]}}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "total": int(values.sum()),
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": int(values.max()),
    }


def _share_summary(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {k: None for k in SHARE_STATS}
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "p10": float(p10),
        "p50": float(p50),
        "p90": float(p90),
        "min": float(values.min()),
        "max": float(values.max()),
    }

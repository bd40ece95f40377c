# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The workload report: where a run's samples come from and what they look like, as data and text.

:func:`workload_report` describes the samples of a :class:`~orchestration.workload_spec.
SampleStream` (a generated spec or a JSONL file) as one JSON-ready dict, ``{"source": ...,
"stats": ...}``; :func:`format_report` writes the same content as readable text. The
``orchweave-workload`` tool (``tools/workload.py``) prints one or the other. The layout::

    source:                       # where the samples came from
      kind: "spec" | "jsonl"
      argument: str               # the workload as given
      name: str                   # spec only: the spec's name
      seed: int                   # spec only
      token_scale: float          # spec only
      max_sequence_tokens: int    # spec only: the per-sample LLM cap, scaled
      components: [{name: str, weight: float}]   # spec only: normalised weights
    stats: {...}                  # orchestration.workload_stats.workload_stats(samples)
"""

from __future__ import annotations

from typing import Any

from orchestration.workload import ENCODER_OF_MODALITY
from orchestration.workload_spec import SampleStream
from orchestration.workload_stats import ALL_MODALITIES, SHARE_STATS, workload_stats

DEFAULT_NUM_SAMPLES = 10000
"""Samples generated from a spec when the report is not told how many."""


def workload_report(
    stream: SampleStream, argument: str, num_samples: int | None = None
) -> dict[str, Any]:
    """The report of a stream's first samples.

    Args:
        stream: the samples.
        argument: the workload as the user gave it (the report's ``source.argument``).
        num_samples: how many samples: of a spec, :data:`DEFAULT_NUM_SAMPLES` when None; of a
            JSONL file, the first ``num_samples`` (all when None).

    Returns:
        ``{"source": ..., "stats": ...}`` as in the module doc.
    """
    gen = stream.generator
    if gen is None:
        samples = stream.file_samples
        if num_samples is not None:
            samples = samples[:num_samples]
        return {"source": {"kind": "jsonl", "argument": argument}, "stats": workload_stats(samples)}
    spec = gen.spec
    source = {
        "kind": "spec",
        "argument": argument,
        "name": spec.name,
        "seed": gen.seed,
        "token_scale": gen.token_scale,
        "max_sequence_tokens": gen.max_sequence_tokens,
        "components": [
            {"name": str(c["name"]), "weight": float(w)}
            for c, w in zip(spec.components, spec.weights)
        ],
    }
    count = DEFAULT_NUM_SAMPLES if num_samples is None else num_samples
    return {"source": source, "stats": workload_stats(gen.samples(count))}


def _num(value: float | int | None) -> str:
    """A compact number: no decimals for whole or large values, more for small ones."""
    if value is None:
        return "-"
    if float(value).is_integer() or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:.2f}"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


_TOKEN_COLUMNS = ("mean", "p50", "p90", "p99", "max")


def _token_row(label: str, summary: dict[str, Any]) -> str:
    return f"  {label:<26}" + "".join(f"{_num(summary[k]):>10}" for k in _TOKEN_COLUMNS)


def _token_header(title: str) -> str:
    return f"{title:<28}" + "".join(f"{k:>10}" for k in _TOKEN_COLUMNS)


def format_report(report: dict[str, Any]) -> str:
    """The readable form of a :func:`workload_report`.

    Per modality: how many samples carry it and their item, encoder-unit, encoder-token and
    LLM-token counts (mean and tail); the LLM sequence length; the modality combinations by
    share; the spread of each modality's share of a sample's LLM tokens; the observed share of
    each spec component.

    Args:
        report: ``{"source": ..., "stats": ...}``.

    Returns:
        The report, lines ending in newlines.
    """
    src, st = report["source"], report["stats"]
    n = st["num_samples"]
    lines: list[str] = []
    if src["kind"] == "spec":
        lines += [
            f"Workload {src['name']}: {n:,} samples generated from the spec",
            f"  seed {src['seed']}, token scale {src['token_scale']:g}, "
            f"cap {src['max_sequence_tokens']:,} LLM tokens per sample",
        ]
    else:
        lines.append(f"Workload {src['argument']}: {n:,} samples read from JSONL")
    lines += ["", _token_header("LLM tokens per sample"), _token_row("all", st["llm_tokens"])]

    lines += ["", "Per modality (tokens per sample, over the samples that contain the modality)"]
    for m in ALL_MODALITIES:
        ms = st["modalities"][m]
        if ms["samples"] == 0:
            lines.append(f"{m:<7} absent")
            continue
        head = f"{m:<7} {ms['samples']:,} samples ({_pct(ms['sample_share'])})"
        if m == "text":
            lines += [head, _token_row("text tokens", ms["llm_tokens"])]
            continue
        items = ms["items"]
        lines += [
            f"{head}, {items['total']:,} items ({_num(items['per_sample_mean'])} per sample, "
            f"{_num(items['per_containing_sample_mean'])} per sample with {m})",
            _token_header(""),
            _token_row("encoder units", ms["encoder_units"]),
            _token_row(f"encoder tokens ({ENCODER_OF_MODALITY[m]})", ms["encoder_tokens"]),
            _token_row("LLM tokens", ms["llm_tokens"]),
        ]

    lines += ["", f"{'Modality combinations':<28}{'share':>10}{'samples':>10}"]
    for c in st["combinations"]:
        lines.append(f"  {c['modalities']:<26}{_pct(c['share']):>10}{c['samples']:>10,}")

    lines += [
        "",
        f"{'Share of a sample' + chr(39) + 's LLM tokens':<32}"
        + "".join(f"{k:>8}" for k in SHARE_STATS),
    ]
    for m in ALL_MODALITIES:
        share = st["modality_share"][m]
        cells = ("-" if share[k] is None else f"{share[k]:.3f}" for k in SHARE_STATS)
        lines.append(f"  {m:<30}" + "".join(f"{c:>8}" for c in cells))

    lines += ["", *_component_lines(src, st)]
    return "\n".join(lines) + "\n"


def _component_lines(src: dict[str, Any], st: dict[str, Any]) -> list[str]:
    observed = {c["name"]: c for c in st["components"] or ()}
    if src["kind"] == "spec":
        # Spec order, next to the weight the spec asks for, so a drift is visible at a glance.
        lines = [f"{'Components':<40}{'observed':>10}{'weight':>10}{'samples':>10}"]
        for c in src["components"]:
            got = observed.get(c["name"], {"share": 0.0, "samples": 0})
            lines.append(
                f"  {c['name']:<38}{_pct(got['share']):>10}{_pct(c['weight']):>10}"
                f"{got['samples']:>10,}"
            )
        return lines
    if not observed:
        return ["Components: the samples carry no 'component'"]
    lines = [f"{'Components':<40}{'observed':>10}{'samples':>10}"]
    for c in st["components"]:
        name = "(none)" if c["name"] is None else c["name"]
        lines.append(f"  {name:<38}{_pct(c['share']):>10}{c['samples']:>10,}")
    return lines

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Describe a workload, or write generated sample metadata as JSONL.

Usage (from the repository root)::

    python tools/workload.py SPEC_OR_JSONL [--num-samples N] [--seed S] [--token-scale X]
                             [--json] [--output PATH]
    python tools/workload.py SPEC --emit-jsonl N [--seed S] [--token-scale X] [--output PATH]

``SPEC_OR_JSONL`` is a workload spec file, the name of a built-in spec (for example
``omni-three-modality``), or a file of sample metadata whose name ends in ``.jsonl``. A spec
is turned into ``N`` samples (10000 unless told) by the deterministic generator; a JSONL file
is read whole, or its first ``N`` samples with ``--num-samples``. ``--seed`` and
``--token-scale`` apply to specs only.

The default output is a readable report: per modality how many samples carry it and their
item, encoder-unit, encoder-token and LLM-token counts (mean and tail), the LLM sequence
length, the modality combinations by share, the spread of each modality's share of a
sample's LLM tokens, and the observed share of each spec component.

``--json`` prints the same content as one JSON object, with these keys::

    source:                       # where the samples came from
      kind: "spec" | "jsonl"
      argument: str               # SPEC_OR_JSONL as given
      name: str                   # spec only: the spec's name
      seed: int                   # spec only
      token_scale: float          # spec only
      max_sequence_tokens: int    # spec only: the per-sample LLM cap, scaled
      components: [{name: str, weight: float}]   # spec only: normalised weights
    stats: {...}                  # orchestration.workload_stats.workload_stats(samples)

``--emit-jsonl N`` writes ``N`` generated samples of a spec, one JSON line each, in the form
that `orchestration.workload.read_jsonl` reads back.

Errors (a missing or malformed file, a bad spec, a bad argument) print one line starting with
``error:`` on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Sequence, TextIO

# tools/ is not a package: make the repository importable when run as a script.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tool_args import EXIT_ERROR, ToolParser, nonneg_int, positive_float, positive_int  # noqa: E402

from orchestration.workload import (
    ENCODER_OF_MODALITY,
    SampleMeta,
    WorkloadError,
    read_jsonl,
    write_jsonl,
)
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec
from orchestration.workload_stats import ALL_MODALITIES, SHARE_STATS, workload_stats  # noqa: E402

DEFAULT_NUM_SAMPLES = 10000
"""Samples generated from a spec when ``--num-samples`` is not given."""


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of this tool."""
    p = ToolParser(
        prog="tools/workload.py",
        description="Describe a workload spec or a JSONL file of sample metadata, or emit "
        "generated samples as JSONL.",
    )
    p.add_argument(
        "source",
        metavar="SPEC_OR_JSONL",
        help="a spec file, a built-in spec name, or a .jsonl file of sample metadata",
    )
    p.add_argument(
        "--num-samples",
        type=positive_int,
        help=f"samples to generate from a spec (default {DEFAULT_NUM_SAMPLES}) or to read "
        "from the start of a JSONL file (default all)",
    )
    p.add_argument("--seed", type=nonneg_int, help="generator seed (spec only, default 0)")
    p.add_argument(
        "--token-scale",
        type=positive_float,
        help="scale every token count after drawing (spec only, default 1)",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--emit-jsonl",
        type=positive_int,
        metavar="N",
        help="write N generated samples of the spec as JSONL instead of a report",
    )
    p.add_argument("--output", metavar="PATH", help="write to PATH instead of stdout")
    return p


def _is_jsonl(source: str) -> bool:
    return source.endswith(".jsonl")


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if _is_jsonl(args.source):
        spec_only = [
            flag
            for flag, value in (
                ("--emit-jsonl", args.emit_jsonl),
                ("--seed", args.seed),
                ("--token-scale", args.token_scale),
            )
            if value is not None
        ]
        if spec_only:
            parser.error(
                f"{', '.join(spec_only)}: only for a workload spec, and {args.source} is a "
                "JSONL file of samples"
            )
    if args.emit_jsonl is not None:
        if args.json:
            parser.error("--emit-jsonl writes JSONL; it cannot be combined with --json")
        if args.num_samples is not None:
            parser.error("--emit-jsonl N sets the number of samples; drop --num-samples")


def _spec_source(arg: str, spec: WorkloadSpec, gen: WorkloadGenerator) -> dict[str, Any]:
    return {
        "kind": "spec",
        "argument": arg,
        "name": spec.name,
        "seed": gen.seed,
        "token_scale": gen.token_scale,
        "max_sequence_tokens": gen.max_sequence_tokens,
        "components": [
            {"name": str(c["name"]), "weight": float(w)}
            for c, w in zip(spec.components, spec.weights)
        ],
    }


def _load(args: argparse.Namespace) -> tuple[dict[str, Any], Sequence[SampleMeta]]:
    """The samples to describe, and a description of where they came from."""
    if _is_jsonl(args.source):
        samples = read_jsonl(args.source)
        if args.num_samples is not None:
            samples = samples[: args.num_samples]
        return {"kind": "jsonl", "argument": args.source}, samples
    spec = WorkloadSpec.load(args.source)
    gen = WorkloadGenerator(
        spec,
        seed=0 if args.seed is None else args.seed,
        token_scale=1.0 if args.token_scale is None else args.token_scale,
    )
    count = DEFAULT_NUM_SAMPLES if args.num_samples is None else args.num_samples
    return _spec_source(args.source, spec, gen), gen.samples(count)


# --------------------------------------------------------------------------------------------
# The readable report


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
    """The readable form of the tool's JSON report.

    Args:
        report (dict[str, Any]): ``{"source": ..., "stats": ...}`` as printed by ``--json``.

    Returns:
        str: the report, lines ending in newlines.
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


# --------------------------------------------------------------------------------------------


def _write(args: argparse.Namespace, emit: Callable[[TextIO], None]) -> None:
    if args.output is None:
        emit(sys.stdout)
        sys.stdout.flush()
        return
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            emit(f)
    except OSError as e:
        raise WorkloadError(f"cannot write {args.output}: {e.strerror}") from e


def run(argv: Sequence[str] | None = None) -> int:
    """Run the tool.

    Args:
        argv (Sequence[str] | None): the arguments, without the program name; ``None`` reads
            ``sys.argv``.

    Returns:
        int: the exit status, 0 on success and 2 on a user error.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    try:
        if args.emit_jsonl is not None:
            gen = WorkloadGenerator(
                WorkloadSpec.load(args.source),
                seed=0 if args.seed is None else args.seed,
                token_scale=1.0 if args.token_scale is None else args.token_scale,
            )
            # Lazily, so that a large N streams instead of building a list first.
            samples = (gen.sample(i) for i in range(args.emit_jsonl))
            _write(args, lambda f: write_jsonl(samples, f))
            return 0
        source, samples = _load(args)
        report = {"source": source, "stats": workload_stats(samples)}
        if args.json:
            text = json.dumps(report, indent=1, allow_nan=False) + "\n"
        else:
            text = format_report(report)
        _write(args, lambda f: f.write(text))
        return 0
    except WorkloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR


def main() -> None:
    """Entry point: run, and leave quietly when stdout is closed early (``| head``)."""
    try:
        status = run()
    except BrokenPipeError:
        # Python would complain again when flushing stdout at exit; point it at devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = 1
    sys.exit(status)


if __name__ == "__main__":
    main()

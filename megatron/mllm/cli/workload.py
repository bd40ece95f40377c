# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Describe a workload, or write generated sample metadata as JSONL.

Usage (from the repository root; installed: ``orchweave-workload``)::

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

``--json`` prints the same content as one JSON object: ``source`` (``kind`` ``"spec"`` or
``"jsonl"``, ``argument``; for a spec also ``name``, ``seed``, ``token_scale``,
``max_sequence_tokens`` and ``components``) and ``stats``, laid out in
:mod:`orchestration.workload_report`.

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
from typing import Callable, Sequence, TextIO

from megatron.mllm.cli.args import MAX_GENERATED_SAMPLES, ToolParser, number, report_error
from orchestration.workload import WorkloadError, write_jsonl
from orchestration.workload_report import DEFAULT_NUM_SAMPLES, format_report, workload_report
from orchestration.workload_spec import SampleStream


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of this tool."""
    p = ToolParser(
        description="Describe a workload spec or a JSONL file of sample metadata, or emit "
        "generated samples as JSONL."
    )
    p.add_argument(
        "source",
        metavar="SPEC_OR_JSONL",
        help="a spec file, a built-in spec name, or a .jsonl file of sample metadata",
    )
    p.add_argument(
        "--num-samples",
        type=number(int, most=MAX_GENERATED_SAMPLES),
        help=f"samples to generate from a spec (default {DEFAULT_NUM_SAMPLES}) or to read "
        "from the start of a JSONL file (default all)",
    )
    p.add_argument(
        "--seed", type=number(int, zero=True), help="generator seed (spec only, default 0)"
    )
    p.add_argument(
        "--token-scale",
        type=number(float),
        help="scale every token count after drawing (spec only, default 1)",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--emit-jsonl",
        type=number(int),
        metavar="N",
        help="write N generated samples of the spec as JSONL instead of a report",
    )
    p.add_argument("--output", metavar="PATH", help="write to PATH instead of stdout")
    return p


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if SampleStream.is_metadata_file(args.source):
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


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    try:
        stream = SampleStream(
            args.source,
            seed=0 if args.seed is None else args.seed,
            token_scale=1.0 if args.token_scale is None else args.token_scale,
        )
        if args.emit_jsonl is not None:
            # Lazily, so that a large N streams instead of building a list first.
            samples = (stream.generator.sample(i) for i in range(args.emit_jsonl))
            _write(args, lambda f: write_jsonl(samples, f))
            return 0
        report = workload_report(stream, args.source, args.num_samples)
        if args.json:
            text = json.dumps(report, indent=1, allow_nan=False) + "\n"
        else:
            text = format_report(report)
        _write(args, lambda f: f.write(text))
        return 0
    except WorkloadError as e:
        return report_error(str(e))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool, and leave quietly when stdout is closed early (``| head``).

    Args:
        argv: the arguments, without the program name; None reads ``sys.argv``.

    Returns:
        The exit status: 0, 2 on a user error, 1 when stdout was closed.
    """
    try:
        return _run(argv)
    except BrokenPipeError:
        # Python would complain again when flushing stdout at exit; point it at devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1

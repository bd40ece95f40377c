# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Where a step went, per rank and phase, measured beside predicted.

Usage (from the repository root; installed: ``orchweave-explain-step``)::

    python tools/explain_step.py RUN [--baseline RUN] [--skip 1] [--top 12]

``RUN`` is a run's ``--metrics-jsonl`` (trained with ``--timing-log-level 2
--step-prediction``) or its ``--profile-trace``. Prints, per rank, the measured iteration cut
into terms (compute, pipeline waits, collective waits, transfers, host, optimizer) beside what
the run's prediction (SEMU's step, or the balance plan's loads) said of each, largest
discrepancy first with the prediction that explains it, then the compute per rank and phase.
With ``--baseline`` (the same data under another mode, e.g. ``--post-balance none`` or
``--pipeline-schedule 1f1b``) it also prints where the predicted gain of ``RUN`` over the
baseline went, term by term. The terms are defined in :mod:`megatron.mllm.explain`.

Errors print one line starting with ``error:`` on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys

from megatron.mllm.cli.args import ToolParser, number, report_error
from megatron.mllm.explain import (
    ExplainError,
    format_comparison,
    format_run,
    load_records,
    summarize,
    summarize_pair,
)


def _parser() -> argparse.ArgumentParser:
    p = ToolParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="metrics JSONL or profile trace of the run to explain")
    p.add_argument("--baseline", help="the same data under the mode RUN is compared against")
    p.add_argument(
        "--skip", type=number(int, zero=True), default=1,
        help="warm-up iterations left out (default 1)",
    )  # fmt: skip
    p.add_argument("--top", type=number(int), default=12, help="rows of each table (default 12)")
    return p


def explain(run: str, baseline: str | None, skip: int, top: int) -> list[str]:
    """The report's lines."""
    records = load_records(run)
    if not baseline:
        return format_run(summarize("run", records, skip), top)
    a, b = summarize_pair(load_records(baseline), records, skip)
    return [f"A = {baseline}", *format_run(a, top), "", f"B = {run}", *format_run(b, top), "",
            *format_comparison(a, b)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = _parser().parse_args(argv)
    try:
        lines = explain(args.run, args.baseline, args.skip, args.top)
    except ExplainError as e:
        return report_error(str(e))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

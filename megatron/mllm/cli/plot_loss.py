# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Draw the loss curves of runs as a PNG, from their ``--metrics-jsonl`` records.

Usage (from the repository root)::

    python tools/plot_loss.py RUN.jsonl [LABEL=RUN2.jsonl ...] --out loss.png [--title T]

A file given without ``LABEL=`` is labelled by its name; a resumed run's rewritten iterations
keep their last record. Needs matplotlib (the ``plots`` extra). Errors print one ``error:``
line and exit with status 2.
"""

from __future__ import annotations

import json
import os

from megatron.mllm.cli.args import ToolParser, report_error


class PlotError(Exception):
    """A file that cannot be plotted; the message names it."""


def read_losses(path: str) -> tuple[list[int], list[float]]:
    """The ``(iteration, lm_loss)`` series of one metrics JSONL file, in iteration order.

    Raises:
        PlotError: the file is missing, a line is not JSON, or no record has ``lm_loss``.
    """
    if not os.path.isfile(path):
        raise PlotError(f"{path}: no such file")
    points = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise PlotError(f"{path}:{number}: not a JSON record ({e})") from e
            if isinstance(record, dict) and "lm_loss" in record and "iteration" in record:
                points[int(record["iteration"])] = float(record["lm_loss"])  # a resume rewrites
    if not points:
        raise PlotError(f"{path}: no record with 'iteration' and 'lm_loss' (--metrics-jsonl)")
    iterations = sorted(points)
    return iterations, [points[i] for i in iterations]


def write_png(series: dict[str, tuple[list[int], list[float]]], out: str, title: str) -> None:
    """One line per labelled series: LM loss against the iteration."""
    from pipeweaver.semu.trace import pyplot

    plt, _ = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    # Runs that should agree are drawn wide then narrow, dashed, so that equal curves stay
    # visible one over the other.
    styles = [("-", 3.0), ("--", 1.2), (":", 1.2)]
    for i, (label, (iterations, losses)) in enumerate(series.items()):
        style, width = styles[min(i, len(styles) - 1)]
        ax.plot(iterations, losses, linestyle=style, linewidth=width, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("lm loss")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def build_parser() -> ToolParser:
    """The command-line interface of this tool."""
    p = ToolParser(description="Draw loss curves from --metrics-jsonl files.")
    p.add_argument("runs", nargs="+", help="RUN.jsonl or LABEL=RUN.jsonl")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="LM loss")
    return p


def main(argv=None) -> int:
    """Run the tool; returns the exit status."""
    args = build_parser().parse_args(argv)
    series = {}
    try:
        for run in args.runs:
            label, _, path = run.rpartition("=") if "=" in run else ("", "", run)
            series[label or os.path.basename(path)] = read_losses(path)
        write_png(series, args.out, args.title)
    except (PlotError, ImportError) as e:
        return report_error(str(e))
    first, last = next(iter(series.values())), list(series.values())[-1]
    print(f"wrote {args.out}: {len(series)} run(s); loss {first[1][0]:.4f} at iteration "
          f"{first[0][0]}, {last[1][-1]:.4f} at {last[0][-1]}")  # fmt: skip
    return 0

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Measure OrchWeave's modules on this device and write the calibration JSON SEMU reads.

Usage (from the repository root)::

    python tools/calibrate.py [--model scripts/configs/cpu-main.json] [--output F.json]
                              [--quick] [--reps N] [--lengths 16,64,256] [--packs 1,2,4]
                              [--threads 1] [--workloads llava15-665k,...] [--stages ...]
                              [--base FILE] [--no-progress]

``--base FILE`` writes FILE's calibration with the stages measured now laid over it (e.g.
``--stages layers --base scripts/configs/calibration-cpu.json``: fresh layer tables, about a
minute here, with the file's host, runtime and transfer figures).

What is measured, and how: :mod:`megatron.mllm.calibration`. Progress goes to stdout while it
measures, then a summary of every module's fitted table; on a terminal, bars per stage, module
and repetition go to stderr (:mod:`megatron.mllm.cli.progress`). Errors print one ``error:``
line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from megatron.mllm import logs
from megatron.mllm.arguments import ConfigError
from megatron.mllm.calibration import DEFAULT_MODEL, DEFAULT_WORKLOADS, STAGES, calibrate
from megatron.mllm.cli.args import ToolParser, number, report_error
from megatron.mllm.cli.progress import add_no_progress_flag, echo
from orchestration.calibration import Calibration
from orchestration.workload import WorkloadError


def _ints(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated positive integers."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 8,32, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(text: str) -> list[str]:
    """An ``argparse`` type: comma-separated names (empty ones dropped)."""
    return [x for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``tools/calibrate.py``."""
    parser = ToolParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model config (trainer flags)")
    parser.add_argument("--output", default="calibration.json", help="where to write the JSON")
    parser.add_argument("--quick", action="store_true", help="tiny grid (tests)")
    parser.add_argument(
        "--reps", type=number(int), default=None, help="timed repetitions per point"
    )
    parser.add_argument(
        "--lengths", type=_ints, default=None, help="sequence lengths, e.g. 16,64,256"
    )
    parser.add_argument(
        "--packs", type=_ints, default=None, help="sequences packed per call, e.g. 1,2,4"
    )
    parser.add_argument("--modules", type=_names, default=None, help="subset, e.g. llm,vision")
    parser.add_argument(
        "--max-tokens",
        type=number(int),
        default=2048,
        help="largest grid point (tokens in one call)",
    )
    parser.add_argument(
        "--threads",
        type=number(int),
        default=int(os.environ.get("SEMU_CALIBRATION_THREADS", "1")),
        help="torch threads per process (the main job runs OMP_NUM_THREADS=1 per rank)",
    )
    parser.add_argument(
        "--stages",
        type=_names,
        default=None,
        help=f"subset of {','.join(STAGES)} (default all; --quick: layers,optimizer,host)",
    )
    parser.add_argument(
        "--workloads",
        type=_names,
        default=list(DEFAULT_WORKLOADS),
        help="workloads of the trainer stage (keep the accuracy benchmark's out of it)",
    )
    parser.add_argument(
        "--base",
        default=None,
        help="a calibration file: write it with the stages measured now laid over it",
    )
    add_no_progress_flag(parser)
    return parser


def summary(cal: Calibration) -> list[str]:
    """The lines printed after a calibration: each module's table, then the host figures."""
    lines = []
    for m, t in cal.modules.items():
        lines.append(
            f"  {m:6s} layer fwd {t.const_s * 1e6:.1f} us + {t.linear_s * 1e9:.2f} ns/token + "
            f"{t.quadratic_s * 1e12:.3f} ps/token^2 (+{t.per_sequence_s * 1e6:.1f} us/sequence), "
            f"bwd {t.backward_const_s * 1e6:.1f} us + {t.backward_linear_s * 1e9:.2f} ns/token "
            f"(x{t.backward_ratio:.2f} on the grid), activations {t.act_bytes_per_token:.0f} "
            f"B/token/layer; input {t.input_const_s * 1e6:.0f} us + "
            f"{(t.input_s_per_token or 0) * 1e9:.0f} ns/token, head {t.head_const_s * 1e6:.0f} "
            f"us + {(t.head_s_per_token or 0) * 1e9:.0f} ns/token + {t.head_s_per_row * 1e9:.0f} "
            f"ns/row"
        )
    if cal.host:
        lines.append("  host: " + ", ".join(f"{k} {v:.3g}" for k, v in cal.host.items()))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tools/calibrate.py``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = set(args.stages or ()) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {','.join(STAGES)}")
    # The trainer's quiet log: megatron-core's parameter listings and import warnings off.
    logs.configure(logging.INFO)
    # Every flag but these two is a keyword of the library, by the same name.
    options = vars(args)
    model, output, base_path = options.pop("model"), options.pop("output"), options.pop("base")
    try:
        base = Calibration.load(base_path) if base_path else None
    except ValueError as e:
        return report_error(f"--base {e}")
    try:
        cal = calibrate(model, **options, log=echo)
    except (ConfigError, WorkloadError) as e:
        return report_error(str(e))
    if base is not None:
        try:
            cal = cal.over(base)
        except ValueError as e:  # the base describes another model
            return report_error(f"--base {e}")
    try:
        cal.save(output)
    except OSError as e:
        return report_error(f"cannot write {output}: {e.strerror}")
    print(f"wrote {output}: {cal.device}")
    for line in summary(cal):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

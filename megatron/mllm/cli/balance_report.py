# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""How well each balancing algorithm balances each phase of one global batch.

Usage (from the repository root; installed: ``orchweave-balance-report``)::

    python tools/balance_report.py SPEC_OR_JSONL --dp 8 [--samples-per-rank 8]
        [--model CONFIG] [model flags] [--seed S] [--token-scale X]
        [--gpus-per-node 8] [--calibration FILE] [--ilp-seconds 3] [--json] [--no-progress]

``SPEC_OR_JSONL`` is a workload spec file, a built-in spec name (e.g. ``omni-three-modality``)
or a ``.jsonl`` file of sample metadata. DP rank ``r`` gets samples ``r*k .. r*k+k-1`` of the
stream (``k`` = ``--samples-per-rank``), as the trainer's loader would give them.

For each phase (vision, audio, llm) and each algorithm it reports: max/mean of the ranks'
predicted costs before (items stay where they were loaded) and after balancing, the lower
bound on the optimal max load and the ratio to it, the planning time (CPU ms) and the fraction
of items moved. Algorithms:

* ``none``: the ordinary assignment;
* ``sample-lpt``: LPT over whole samples by their summed cost over all phases, every phase
  following its sample: the reference to beat (what balancers that move whole samples do);
* ``lpt``, ``kk``, ``kk+refine``: one algorithm of ``orchestration.balance`` per phase, over
  encoder units and samples;
* ``auto``: what the planner uses (all of them, best max load, then fewest moved items).

The lower bound is the best of ``orchestration.bounds`` (average, largest item, pigeonhole
sums, ...) and, for small problems (``d <= 16`` and at most 400 items), the HiGHS ILP's dual
bound within ``--ilp-seconds`` (0 disables); when the ILP proves the optimum it is reported.
The numbers are :func:`orchestration.balance_report.compare_algorithms`. On a terminal, a bar
counts the phases on stderr (the ILP bound takes up to ``--ilp-seconds`` per phase);
``--no-progress`` switches it off.

Models (``--model``, default ``cpu-main``): a model config of ``scripts/configs`` (a name there
or a path; ``scripts/configs/README.md``), read by ``megatron.mllm.config_files`` exactly as the
trainer and SEMU read it, i.e. the shape the trainer would build from those flags
(``cpu-main``: the CPU main job; ``omni-84b``: OrchMLLM's headline model; ``slurm-example``:
the README's SLURM example; DIP's ``vlm-*`` and ``t2v-*``), as one model replica. The model
flags below override the config's; ``--token-scale`` defaults to the config's
``--workload-token-scale`` (1 for a JSONL file).

``--json`` prints one JSON object::

    source: {kind, argument, name?, seed?, token_scale?}
    dp, samples_per_rank, gpus_per_node: int
    model: str; cost_unit: "flops" | "seconds"
    plan_iteration_ms: float      # orchestration.phase_plan.plan_iteration, all phases, CPU ms
    digest: str                   # its plan digest
    phases:
      <phase>:
        items: int                # encoder units, or samples for the llm phase
        lower_bound: {value, which, proven_optimum, ilp_status}
        algorithms:
          <algorithm>:            # none, sample-lpt, lpt, kk, kk+refine, auto
            max_over_mean_before: float
            max_over_mean_after: float
            ratio_to_lower_bound: float   # max load after / lower bound (1.0 for no work)
            plan_ms: float                # CPU ms of the algorithm on this phase
            moved_fraction: float         # items that change rank

Errors print one line starting with ``error:`` on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from megatron.mllm.arguments import ONE_REPLICA, ConfigError
from megatron.mllm.cli.args import (
    MAX_GENERATED_SAMPLES,
    ToolParser,
    number,
    quiet_config_files,
    report_error,
)
from megatron.mllm.cli.progress import add_no_progress_flag, progress
from orchestration.balance import InfeasibleCapError
from orchestration.balance_report import compare_algorithms
from orchestration.calibration import Calibration
from orchestration.cost_model import CostModel
from orchestration.workload import WorkloadError
from orchestration.workload_spec import SampleStream

_MODEL_FLAGS = [
    ("num_layers", number(int)),
    ("hidden_size", number(int)),
    ("num_attention_heads", number(int)),
    ("num_query_groups", number(int)),
    ("ffn_hidden_size", number(int)),
    ("vocab_size", number(int)),
    ("vision_num_layers", number(int, zero=True)),
    ("vision_hidden_size", number(int)),
    ("vision_num_attention_heads", number(int)),
    ("vision_ffn_hidden_size", number(int)),
    ("vision_patch_size", number(int)),
    ("audio_num_layers", number(int, zero=True)),
    ("audio_hidden_size", number(int)),
    ("audio_num_attention_heads", number(int)),
    ("audio_ffn_hidden_size", number(int)),
    ("audio_feature_dim", number(int)),
]


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of this tool."""
    p = ToolParser(
        description="Per-phase balance of one global batch under each balancing algorithm."
    )
    p.add_argument(
        "source",
        metavar="SPEC_OR_JSONL",
        help="a spec file, a built-in spec name, or a .jsonl file of sample metadata",
    )
    p.add_argument(
        "--dp", type=number(int, most=MAX_GENERATED_SAMPLES), required=True,
        help="data-parallel ranks",
    )  # fmt: skip
    p.add_argument(
        "--samples-per-rank",
        type=number(int, most=MAX_GENERATED_SAMPLES),
        default=8,
        help="samples each DP rank loads (default 8)",
    )
    p.add_argument(
        "--model",
        default="cpu-main",
        help="model config: a name in scripts/configs or a path (default cpu-main); the flags "
        "below override it",
    )
    p.add_argument(
        "--seed", type=number(int, zero=True), default=0, help="generator seed (spec only)"
    )
    p.add_argument(
        "--token-scale",
        type=number(float),
        default=None,
        help="scale every token count (spec only; default: the model config's)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=number(int),
        default=8,
        help="ranks per node for the node-aware locality mapping (default 8)",
    )
    p.add_argument("--calibration", help="calibration JSON of measured per-layer times")
    p.add_argument(
        "--ilp-seconds",
        type=number(float, zero=True),
        default=3.0,
        help="time limit of the ILP bound per phase (small problems; 0 disables)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_no_progress_flag(p)
    g = p.add_argument_group("model flags (override the config's)")
    for name, typ in _MODEL_FLAGS:
        g.add_argument("--" + name.replace("_", "-"), type=typ, default=None)
    g.add_argument("--swiglu", action="store_true", default=None, help="gated MLP in the LLM")
    return p


def _model_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The model flags given, as ``set_flags`` pairs."""
    overrides: dict[str, Any] = {
        name: getattr(args, name) for name, _ in _MODEL_FLAGS if getattr(args, name) is not None
    }
    if "num_query_groups" in overrides:
        overrides["group_query_attention"] = True
    if args.swiglu:
        overrides["swiglu"] = True
    return overrides


def _format_table(report: dict[str, Any]) -> str:
    lines = []
    head = (
        f"{'algorithm':<12} {'max/mean before':>15} {'after':>8} {'ratio to LB':>12} "
        f"{'plan ms':>9} {'moved':>7}"
    )
    for phase, entry in report["phases"].items():
        lb = entry["lower_bound"]
        proof = ""
        if lb["proven_optimum"] is not None:
            proof = " (ILP optimum)"
        elif lb["ilp_status"]:
            proof = f" (ILP: {lb['ilp_status']})"
        lines.append(
            f"\n{phase}: {entry['items']} items, lower bound {lb['value']:.4g} "
            f"[{lb['which']}]{proof}"
        )
        lines.append(head)
        for alg, row in entry["algorithms"].items():
            lines.append(
                f"{alg:<12} {row['max_over_mean_before']:>15.4f} "
                f"{row['max_over_mean_after']:>8.4f} "
                f"{row['ratio_to_lower_bound']:>12.4f} {row['plan_ms']:>9.2f} "
                f"{row['moved_fraction']:>7.3f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print every algorithm's balance of the batch the arguments describe.

    Args:
        argv: the arguments, without the program name; None reads ``sys.argv``.

    Returns:
        The exit status: 0, or 2 on a user error.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.dp * args.samples_per_rank > MAX_GENERATED_SAMPLES:
        parser.error(
            f"--dp {args.dp} x --samples-per-rank {args.samples_per_rank} is more than "
            f"{MAX_GENERATED_SAMPLES:,} samples"
        )
    configs = quiet_config_files()
    try:
        # One model replica: the report's DP is --dp, not the config's layout.
        extra = configs.set_flags(_model_flags(args))
        model = configs.load_run_config(args.model, extra, world_size=ONE_REPLICA)
        token_scale = args.token_scale
        if token_scale is None:
            # The config's scale is for its generated workload; a JSONL file is not scaled.
            scaled = not SampleStream.is_metadata_file(args.source)
            token_scale = model.run.workload.workload_token_scale if scaled else 1.0
        calib = Calibration.load(args.calibration) if args.calibration else None
        report = compare_algorithms(
            SampleStream(args.source, seed=args.seed, token_scale=token_scale),
            args.dp,
            args.samples_per_rank,
            CostModel.build(model.shape, calib),
            gpus_per_node=args.gpus_per_node,
            ilp_seconds=args.ilp_seconds,
            progress=progress,
        )
    except (ConfigError, WorkloadError, InfeasibleCapError, ValueError, OSError) as e:
        return report_error(str(e))
    source = report.pop("source")
    out = {
        "source": source,
        "dp": args.dp,
        "samples_per_rank": args.samples_per_rank,
        "gpus_per_node": args.gpus_per_node,
        "model": args.model,
        **report,
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(
            f"{source['argument']}: DP={args.dp} x {args.samples_per_rank} samples per rank, "
            f"model {args.model}, costs in {out['cost_unit']}; plan_iteration "
            f"{out['plan_iteration_ms']:.1f} ms (CPU), digest {out['digest'][:16]}"
        )
        print(_format_table(out))
    return 0

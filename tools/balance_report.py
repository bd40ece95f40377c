# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""How well each balancing algorithm balances each phase of one global batch.

Usage (from the repository root)::

    python tools/balance_report.py SPEC_OR_JSONL --dp 8 [--samples-per-rank 8]
        [--model CONFIG] [model flags] [--seed S] [--token-scale X]
        [--gpus-per-node 8] [--calibration FILE] [--ilp-seconds 3] [--json]

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

Models (``--model``, default ``cpu-main``): a model config of ``scripts/configs`` (a name there
or a path; ``scripts/configs/README.md``), read by ``pipeweaver.semu.model`` exactly as SEMU reads
it, i.e. the shape the trainer would build from those flags (``cpu-main``: the CPU main job;
``omni-84b``: OrchMLLM's headline model; ``slurm-example``: the README's SLURM example; DIP's
``vlm-*`` and ``t2v-*``). The model flags below override the config's; ``--token-scale``
defaults to the config's ``--workload-token-scale``.

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
import os
import sys
import time
from typing import Any, Sequence

# tools/ is not a package: make the repository importable when run as a script.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

import numpy as np  # noqa: E402
from tool_args import (  # noqa: E402
    EXIT_ERROR,
    ToolParser,
    find_config,
    nonneg_float,
    nonneg_int,
    positive_int,
)

from orchestration.balance import InfeasibleCapError, balance, max_over_mean  # noqa: E402
from orchestration.bounds import lower_bound  # noqa: E402
from orchestration.calibration import Calibration  # noqa: E402
from orchestration.cost_model import CostModel  # noqa: E402
from orchestration.metadata import GatheredMetadata, phase_items  # noqa: E402
from orchestration.phase_plan import plan_iteration  # noqa: E402
from orchestration.sample_plan import sample_phase_costs  # noqa: E402
from orchestration.workload import PHASES, SampleMeta, WorkloadError, read_jsonl
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec
from pipeweaver.semu.model import load_model_config  # noqa: E402

ALGORITHMS = ("none", "sample-lpt", "lpt", "kk", "kk+refine", "auto")
"""Rows of the report, in order."""

ILP_MAX_BINS = 16
"""The ILP bound runs only up to this many ranks..."""

ILP_MAX_ITEMS = 400
"""...and this many items."""

# --------------------------------------------------------------------------------------------
# Inputs


def load_rank_samples(
    source: str, dp: int, per_rank: int, seed: int, token_scale: float
) -> tuple[list[list[tuple[int, SampleMeta]]], dict[str, Any]]:
    """Every DP rank's (stream index, metadata) pairs, and a description of the source."""
    need = dp * per_rank
    if source.endswith(".jsonl"):
        samples = read_jsonl(source)
        if len(samples) < need:
            raise WorkloadError(
                f"{source} has {len(samples)} samples; --dp {dp} x --samples-per-rank "
                f"{per_rank} needs {need}"
            )
        desc = {"kind": "jsonl", "argument": source}
    else:
        spec = WorkloadSpec.load(source)
        gen = WorkloadGenerator(spec, seed=seed, token_scale=token_scale)
        samples = gen.samples(need)
        desc = {
            "kind": "spec",
            "argument": source,
            "name": spec.name,
            "seed": seed,
            "token_scale": token_scale,
        }
    ranks = [
        [(r * per_rank + k, samples[r * per_rank + k]) for k in range(per_rank)] for r in range(dp)
    ]
    return ranks, desc


# --------------------------------------------------------------------------------------------
# Evaluation


def _cpu_ms(fn):
    t = time.process_time()
    out = fn()
    return out, 1000.0 * (time.process_time() - t)


def _ratio(max_load: float, bound: float) -> float:
    if bound > 0:
        return max_load / bound
    return 1.0 if max_load <= 0 else float("inf")


def evaluate(
    metadata: GatheredMetadata,
    cost_model: CostModel,
    *,
    gpus_per_node: int = 8,
    ilp_seconds: float = 3.0,
    algorithms: Sequence[str] = ALGORITHMS,
) -> dict[str, Any]:
    """The report's numbers for one gathered batch: see the module doc's JSON layout."""
    d = metadata.num_ranks
    plan, plan_ms = _cpu_ms(
        lambda: plan_iteration(metadata, cost_model, gpus_per_node=gpus_per_node)
    )
    per_sample = sample_phase_costs(metadata, cost_model)
    sample_total = np.sum(list(per_sample.values()), axis=0)
    llm_items = phase_items(metadata, "llm")
    sample_dst = None
    sample_ms = 0.0
    if "sample-lpt" in algorithms:
        res, sample_ms = _cpu_ms(
            lambda: balance(
                sample_total,
                d,
                algorithm="lpt",
                owners=llm_items.owner,
                item_bytes=llm_items.tokens,
                gpus_per_node=gpus_per_node,
                keep_ordinary=False,
            )
        )
        sample_dst = res.bins
    phases: dict[str, Any] = {}
    for phase in PHASES:
        if phase not in cost_model:
            continue
        items = phase_items(metadata, phase)
        costs = cost_model[phase].item_costs(items.tokens, items.out_tokens)
        before = np.bincount(items.owner, weights=costs, minlength=d)
        entry: dict[str, Any] = {"items": items.size}
        # The LLM phase is the sample-lpt balance itself; encoders follow their samples.
        incumbent = None
        rows: dict[str, Any] = {}
        best_max = None
        for alg in algorithms:
            if alg == "none":
                dst, ms = items.owner, 0.0
            elif alg == "sample-lpt":
                dst, ms = sample_dst[items.sample], sample_ms
            else:
                if items.size == 0:
                    dst, ms = items.owner, 0.0
                else:
                    res, ms = _cpu_ms(
                        lambda: balance(
                            costs,
                            d,
                            algorithm=alg,
                            owners=items.owner,
                            item_bytes=items.tokens,
                            gpus_per_node=gpus_per_node,
                            keep_ordinary=(alg == "auto"),
                        )
                    )
                    dst = res.bins
            after = np.bincount(dst, weights=costs, minlength=d)
            if alg not in ("none", "sample-lpt") and (best_max is None or after.max() < best_max):
                best_max, incumbent = after.max(), dst
            rows[alg] = {
                "max_over_mean_before": max_over_mean(before),
                "max_over_mean_after": max_over_mean(after),
                "max_load": float(after.max()) if after.size else 0.0,
                "plan_ms": ms,
                "moved_fraction": (
                    float(np.count_nonzero(dst != items.owner)) / items.size if items.size else 0.0
                ),
            }
        use_ilp = ilp_seconds > 0 and 0 < items.size <= ILP_MAX_ITEMS and 1 < d <= ILP_MAX_BINS
        lb = lower_bound(costs, d, ilp=use_ilp, time_limit=ilp_seconds, incumbent=incumbent)
        for row in rows.values():
            row["ratio_to_lower_bound"] = _ratio(row.pop("max_load"), lb.value)
        entry["lower_bound"] = {
            "value": lb.value,
            "which": lb.which,
            "proven_optimum": lb.proven_optimum,
            "ilp_status": lb.ilp_status,
        }
        entry["algorithms"] = rows
        phases[phase] = entry
    return {
        "plan_iteration_ms": plan_ms,
        "digest": plan.digest,
        "cost_unit": cost_model.unit,
        "phases": phases,
    }


# --------------------------------------------------------------------------------------------
# Command line


_MODEL_FLAGS = [
    ("num_layers", positive_int),
    ("hidden_size", positive_int),
    ("num_attention_heads", positive_int),
    ("num_query_groups", positive_int),
    ("ffn_hidden_size", positive_int),
    ("vocab_size", positive_int),
    ("vision_num_layers", nonneg_int),
    ("vision_hidden_size", positive_int),
    ("vision_num_attention_heads", positive_int),
    ("vision_ffn_hidden_size", positive_int),
    ("vision_patch_size", positive_int),
    ("audio_num_layers", nonneg_int),
    ("audio_hidden_size", positive_int),
    ("audio_num_attention_heads", positive_int),
    ("audio_ffn_hidden_size", positive_int),
    ("audio_feature_dim", positive_int),
]


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of this tool."""
    p = ToolParser(
        prog="tools/balance_report.py",
        description="Per-phase balance of one global batch under each balancing algorithm.",
    )
    p.add_argument(
        "source",
        metavar="SPEC_OR_JSONL",
        help="a spec file, a built-in spec name, or a .jsonl file of sample metadata",
    )
    p.add_argument("--dp", type=positive_int, required=True, help="data-parallel ranks")
    p.add_argument(
        "--samples-per-rank",
        type=positive_int,
        default=8,
        help="samples each DP rank loads (default 8)",
    )
    p.add_argument(
        "--model",
        default="cpu-main",
        help="model config: a name in scripts/configs or a path (default cpu-main); the flags "
        "below override it",
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="generator seed (spec only)")
    p.add_argument(
        "--token-scale",
        type=float,
        default=None,
        help="scale every token count (spec only; default: the model config's)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=positive_int,
        default=8,
        help="ranks per node for the node-aware locality mapping (default 8)",
    )
    p.add_argument("--calibration", help="calibration JSON of measured per-layer times")
    p.add_argument(
        "--ilp-seconds",
        type=nonneg_float,
        default=3.0,
        help="time limit of the ILP bound per phase (small problems; 0 disables)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    g = p.add_argument_group("model flags (override the config's)")
    for name, typ in _MODEL_FLAGS:
        g.add_argument("--" + name.replace("_", "-"), type=typ, default=None)
    g.add_argument("--swiglu", action="store_true", default=None, help="gated MLP in the LLM")
    return p


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
    """Run the tool; returns the exit status."""
    args = build_parser().parse_args(argv)
    overrides = {
        name.replace("_", "-"): getattr(args, name)
        for name, _ in _MODEL_FLAGS
        if getattr(args, name) is not None
    }
    if "num-query-groups" in overrides:
        overrides["group-query-attention"] = True
    if args.swiglu:
        overrides["swiglu"] = True
    try:
        spec = load_model_config(find_config(args.model), overrides)
        token_scale = args.token_scale
        if token_scale is None:
            token_scale = spec.training.workload_token_scale
        if not token_scale > 0:
            raise ValueError(f"--token-scale must be positive, got {token_scale}")
        calib = Calibration.load(args.calibration) if args.calibration else None
        cost_model = CostModel.build(spec.shape, calib)
        ranks, source = load_rank_samples(
            args.source, args.dp, args.samples_per_rank, args.seed, token_scale
        )
        metadata = GatheredMetadata.from_rank_samples(ranks)
        report = evaluate(
            metadata, cost_model, gpus_per_node=args.gpus_per_node, ilp_seconds=args.ilp_seconds
        )
    except (WorkloadError, InfeasibleCapError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
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


if __name__ == "__main__":
    sys.exit(main())

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""How well each balancing algorithm balances each phase of one global batch.

Usage (from the repository root)::

    python tools/balance_report.py SPEC_OR_JSONL --dp 8 [--samples-per-rank 8]
        [--model cpu-main|omni-84b|slurm-example] [model flags] [--seed S] [--token-scale X]
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

Models (``--model``), built as a ``ModelShape`` the way ``MLLMConfig.shape()`` does; the model
flags below override any field:

* ``cpu-main`` (default): the CPU main job of scripts/pretrain_mllm_cpu.sh: LLM 4 layers x 64
  hidden, 4 heads, FFN 256, vocab 512; vision and audio 2 x 64, 4 heads; vision patch 4 (input
  48), audio features 32; and the main job's token scale 1/32 unless ``--token-scale``.
* ``omni-84b``: an 84B-class three-modality model. LLM: Llama-3-70B (80 layers, hidden 8192,
  FFN 28672 SwiGLU, 64 heads, 8 KV groups, vocab 128256; Meta's config.json). Vision: 48 x 1664,
  16 heads, FFN 8192, patch 14: OpenCLIP ViT-bigG/14 (the shape of the brief's
  "InternViT-6B-ish" 48 x 1664; InternViT-6B itself is 45 x 3200). Audio: Whisper large-v3's
  encoder (32 x 1280, 20 heads, FFN 5120, 128 mel bins). About 74B parameters by this count;
  OrchMLLM's exact 84B configuration was not found (shared/research/orchmllm.md section 7).
* ``slurm-example``: the README's SLURM example (LLM 32 x 4096, 32 heads, vocab 151936;
  vision 32 x 1280, 16 heads; audio 32 x 1280, 20 heads; FFN 4 x hidden; patch 14, 128 mels).

``--json`` prints one JSON object::

    source: {kind, argument, name?, seed?, token_scale?}
    dp, samples_per_rank, gpus_per_node: int
    model: str; cost_unit: "flops" | "seconds"
    plan_iteration_ms: float      # orchestration.plan.plan_iteration, all phases, CPU ms
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
from tool_args import EXIT_ERROR, ToolParser, nonneg_float, nonneg_int, positive_int  # noqa: E402

from orchestration.balance import InfeasibleCapError, balance, max_over_mean  # noqa: E402
from orchestration.bounds import lower_bound  # noqa: E402
from orchestration.calibration import Calibration  # noqa: E402
from orchestration.cost_model import CostModel  # noqa: E402
from orchestration.model_shape import ModelShape, TransformerShape  # noqa: E402
from orchestration.plan import (  # noqa: E402
    GatheredMetadata,
    phase_items,
    plan_iteration,
    sample_phase_costs,
)
from orchestration.workload import (  # noqa: E402
    PHASES,
    SampleMeta,
    WorkloadError,
    WorkloadGenerator,
    WorkloadSpec,
    read_jsonl,
)

ALGORITHMS = ("none", "sample-lpt", "lpt", "kk", "kk+refine", "auto")
"""Rows of the report, in order."""

ILP_MAX_BINS = 16
"""The ILP bound runs only up to this many ranks..."""

ILP_MAX_ITEMS = 400
"""...and this many items."""

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "cpu-main": dict(
        num_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=None,
        ffn_hidden_size=256,
        vocab_size=512,
        swiglu=False,
        vision_num_layers=2,
        vision_hidden_size=64,
        vision_num_attention_heads=4,
        vision_ffn_hidden_size=256,
        vision_patch_size=4,
        audio_num_layers=2,
        audio_hidden_size=64,
        audio_num_attention_heads=4,
        audio_ffn_hidden_size=256,
        audio_feature_dim=32,
        encoder_swiglu=False,
        token_scale=0.03125,
    ),
    "omni-84b": dict(
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_query_groups=8,
        ffn_hidden_size=28672,
        vocab_size=128256,
        swiglu=True,
        vision_num_layers=48,
        vision_hidden_size=1664,
        vision_num_attention_heads=16,
        vision_ffn_hidden_size=8192,
        vision_patch_size=14,
        audio_num_layers=32,
        audio_hidden_size=1280,
        audio_num_attention_heads=20,
        audio_ffn_hidden_size=5120,
        audio_feature_dim=128,
        encoder_swiglu=False,
        token_scale=1.0,
    ),
    "slurm-example": dict(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_query_groups=None,
        ffn_hidden_size=16384,
        vocab_size=151936,
        swiglu=False,
        vision_num_layers=32,
        vision_hidden_size=1280,
        vision_num_attention_heads=16,
        vision_ffn_hidden_size=5120,
        vision_patch_size=14,
        audio_num_layers=32,
        audio_hidden_size=1280,
        audio_num_attention_heads=20,
        audio_ffn_hidden_size=5120,
        audio_feature_dim=128,
        encoder_swiglu=False,
        token_scale=1.0,
    ),
}
"""Named model sizes (see the module doc for their sources)."""


def model_shape(sizes: dict[str, Any]) -> ModelShape:
    """A ModelShape from preset-style sizes, as ``MLLMConfig.shape()`` builds it.

    Encoders with 0 layers are absent. The projector is megatron-core's ``mlp`` type (encoder
    hidden -> LLM FFN -> LLM hidden).
    """
    h, v, ffn = sizes["hidden_size"], sizes["vocab_size"], sizes["ffn_hidden_size"]
    llm = TransformerShape(
        num_layers=sizes["num_layers"],
        hidden_size=h,
        ffn_hidden_size=ffn,
        num_attention_heads=sizes["num_attention_heads"],
        num_query_groups=sizes.get("num_query_groups"),
        gated_mlp=bool(sizes.get("swiglu")),
        causal=True,
        output_flops_per_token=2.0 * h * v,
    )
    encoders = {}
    input_dims = {
        "vision": 3 * sizes["vision_patch_size"] ** 2,
        "audio": sizes["audio_feature_dim"],
    }
    for name in ("vision", "audio"):
        layers = sizes[f"{name}_num_layers"]
        if not layers:
            continue
        eh = sizes[f"{name}_hidden_size"]
        encoders[name] = TransformerShape(
            num_layers=layers,
            hidden_size=eh,
            ffn_hidden_size=sizes[f"{name}_ffn_hidden_size"],
            num_attention_heads=sizes[f"{name}_num_attention_heads"],
            gated_mlp=bool(sizes.get("encoder_swiglu")),
            causal=False,
            input_flops_per_token=2.0 * input_dims[name] * eh,
            output_flops_per_token=2.0 * (eh * ffn + ffn * h),
        )
    return ModelShape(llm=llm, encoders=encoders)


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
        choices=sorted(MODEL_PRESETS),
        help="model size preset (default cpu-main); the flags below override it",
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="generator seed (spec only)")
    p.add_argument(
        "--token-scale",
        type=float,
        default=None,
        help="scale every token count (spec only; default: the model preset's)",
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
    g = p.add_argument_group("model flags (override the preset)")
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
    sizes = dict(MODEL_PRESETS[args.model])
    for name, _ in _MODEL_FLAGS:
        if getattr(args, name) is not None:
            sizes[name] = getattr(args, name)
    if args.swiglu:
        sizes["swiglu"] = True
    token_scale = sizes.pop("token_scale") if args.token_scale is None else args.token_scale
    try:
        if not token_scale > 0:
            raise ValueError(f"--token-scale must be positive, got {token_scale}")
        shape = model_shape(sizes)
        calib = Calibration.load(args.calibration) if args.calibration else None
        cost_model = CostModel.build(shape, calib)
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

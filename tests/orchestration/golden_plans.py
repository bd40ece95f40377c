# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Fingerprints of every balance plan the planner makes for the workload specs.

A fingerprint hashes everything a plan decides (each phase's destinations and positions, the
encoder-output routes, predicted loads, the algorithm kept, the whole-sample plan and the
microbatches of the first ranks), so a restructuring that changes any decision changes it.
``golden/plan_fingerprints.json`` holds the values of commit 73f5d61, before the restructuring
of issue 9; ``test_plan_golden.py`` recomputes them. Their measured costs come from a copy of
the CPU calibration they were computed with (``golden/calibration-cpu.json``), so that a new
calibration of the host changes no fingerprint. Regenerate only when a plan is meant to change:
``python tests/orchestration/golden_plans.py --write``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from orchestration.balance import InfeasibleCapError
from orchestration.calibration import Calibration
from orchestration.cost_model import CostModel
from orchestration.metadata import GatheredMetadata, encode_rank_metadata
from orchestration.microbatches import form_microbatches
from orchestration.phase_plan import plan_iteration
from orchestration.sample_plan import plan_whole_samples
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec, builtin_specs

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden") / "plan_fingerprints.json"
SAMPLES_PER_RANK = 8
DP_SIZES = (8, 64, 512, 2560)
SMALL_DP = (8, 64)
"""Where the other algorithms, the calibrated costs, caps and stage shares are covered too."""


def spec_paths() -> list[str]:
    """Every workload spec: the built-in ones and the paper configs' packed ones (DIP's VLM
    and T2V data; Table 1's text-only and constant-image specs add nothing a planner could get
    wrong that these do not cover)."""
    extra = sorted(
        str(p) for p in (REPO / "scripts" / "configs" / "workloads").glob("*-packed.json")
    )
    return [*builtin_specs(), *extra]


def cost_models() -> dict[str, CostModel]:
    """FLOPs costs of the main job's model, and the CPU calibration's measured costs."""
    from megatron.mllm.config_files import load_run_config

    shape = load_run_config("cpu-main", world_size=2).shape
    cal = Calibration.load(Path(__file__).with_name("golden") / "calibration-cpu.json")
    return {"flops": CostModel.build(shape), "seconds": CostModel.build(shape, cal)}


def _update(h, *arrays) -> None:
    for a in arrays:
        a = np.asarray(a)
        h.update(str(a.dtype.kind).encode() + np.int64(a.size).tobytes())
        h.update(np.ascontiguousarray(a, dtype="<f8" if a.dtype.kind == "f" else "<i8").tobytes())


def fingerprint(md: GatheredMetadata, cost_model: CostModel, algorithm: str,
                caps=None, stage_shares=None) -> str:  # fmt: skip
    """sha256 of every decision of the per-phase, whole-sample and microbatch plans."""
    h = hashlib.sha256()
    plan = plan_iteration(md, cost_model, algorithm=algorithm, caps=caps, gpus_per_node=8)
    h.update(plan.digest.encode())
    for p in plan.phases:
        h.update(f"{p.phase}:{p.algorithm}".encode())
        ex = p.dispatch
        _update(h, ex.src, ex.src_pos, ex.dst, ex.dst_pos, ex.rows, p.costs)
        _update(h, p.loads_before, p.loads_after, [p.lower_bound])
    for enc, ex in sorted(plan.to_llm.items()):
        h.update(enc.encode())
        _update(h, ex.src, ex.src_pos, ex.dst, ex.dst_pos, ex.rows)
    whole = plan_whole_samples(md, cost_model, algorithm=algorithm, stage_shares=stage_shares)
    h.update(f"{whole.digest}:{whole.algorithm}".encode())
    _update(h, whole.dispatch.dst, whole.dispatch.dst_pos, whole.costs)
    _update(h, whole.loads_before, whole.loads_after)
    llm = plan.phase("llm")
    for rank in range(min(md.num_ranks, 4)):
        for costs, tokens in (
            (llm.costs[llm.dispatch.dst_items(rank)], llm.items.tokens[llm.dispatch.dst_items(rank)]),
            (whole.costs[whole.dispatch.dst_items(rank)],
             whole.items.tokens[whole.dispatch.dst_items(rank)]),
        ):  # fmt: skip
            # A packing limit every sample fits, tight enough to shape the microbatches.
            limit = 2 * int(tokens.max()) if tokens.size else None
            mbs = form_microbatches(costs, tokens, 4, limit)
            h.update(repr(mbs.microbatches).encode())
            _update(h, mbs.loads, mbs.tokens)
    return h.hexdigest()


def cases():
    """``(name, metadata, cost model, algorithm, caps, stage shares)`` of every case."""
    models = cost_models()
    for path in spec_paths():
        spec = WorkloadSpec.load(path)
        name = Path(path).stem
        gen = WorkloadGenerator(spec, seed=0, token_scale=1.0)
        samples = [gen.sample(k) for k in range(max(DP_SIZES) * SAMPLES_PER_RANK)]
        for dp in DP_SIZES:
            k = SAMPLES_PER_RANK
            ranks = [[(r * k + j, samples[r * k + j]) for j in range(k)] for r in range(dp)]
            ids = [meta.sample_id for rank in ranks for _, meta in rank]
            md = GatheredMetadata.from_flat([encode_rank_metadata(x) for x in ranks], ids)
            yield f"{name}/dp{dp}/flops/auto", md, models["flops"], "auto", None, None
            if dp not in SMALL_DP:
                continue
            for alg in ("lpt+refine", "kk+refine", "none"):
                yield f"{name}/dp{dp}/flops/{alg}", md, models["flops"], alg, None, None
            yield f"{name}/dp{dp}/seconds/auto", md, models["seconds"], "auto", None, None
            # Tight caps: each phase's mean tokens per rank plus half its largest item; some
            # are infeasible, and the error is part of the behaviour.
            caps = {"llm": int(md.sample_llm.sum() / dp + md.sample_llm.max() / 2)}
            if md.unit_tokens.size:
                caps["vision"] = caps["audio"] = int(
                    md.unit_tokens.sum() / dp + md.unit_tokens.max() / 2
                )
            yield f"{name}/dp{dp}/flops/auto/caps", md, models["flops"], "auto", caps, None
            shares = {"vision": [1.0, 0.0], "audio": [1.0, 0.0], "llm": [0.5, 0.5]}
            yield f"{name}/dp{dp}/flops/auto/shares", md, models["flops"], "auto", None, shares


def compute() -> dict[str, str]:
    """Every case's fingerprint (or the error it raises)."""
    out = {}
    for name, md, cm, alg, caps, shares in cases():
        try:
            out[name] = fingerprint(md, cm, alg, caps, shares)
        except InfeasibleCapError as e:
            out[name] = f"error: {e}"
    return out


if __name__ == "__main__":
    values = compute()
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(values, indent=1, sort_keys=True) + "\n")
    print(json.dumps(values, indent=1, sort_keys=True))

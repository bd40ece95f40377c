#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Which payload should post-balancing move: the decoded encoder inputs, or the encoded media?

On the demo blend (``make demo-data``: ``demo-data/blend.yaml``) with the README's demo flags at
DP=2, every iteration's samples are read as the trainer reads them (metadata from headers), planned as
``--post-balance auto`` plans them with its starting cost model (FLOPs: every phase balanced,
no exchange check, so this counts the most moves), and the bytes of each encoder phase's input
dispatch are counted two ways:

- **decoded** (what the trainer moves today): every moved unit's rows, ``input_dim x 4`` bytes
  per encoder token (fp32 patches or log-mel frames);
- **encoded**: the image or audio file's bytes, once per (item, destination rank) that receives
  any of its units (a destination decodes the whole file, then keeps its units); the decodes
  a split item then costs twice are counted too.

The LLM phase's token ids, the encoder outputs and their gradients are the same either way and
are left out. Bytes do not depend on the host: one pass, no timing. Ends with one line
``encoded_over_decoded_bytes: X`` (below 1: encoded moves less).

Usage: python tools/bench/payload_bytes.py [--data-path DIR] [--iters N] [-- trainer flags]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from cpu_runs import add_demo_data_argument, demo_data_flags

from megatron.mllm.cli.args import quiet_config_files
from megatron.mllm.steps.phase_balanced import payload_bytes
from orchestration.cost_model import CostModel
from orchestration.metadata import GatheredMetadata
from orchestration.packing import microbatch_indices
from orchestration.phase_plan import plan_iteration
from orchestration.workload import ENCODER_OF_MODALITY, MODALITIES

DP = 2


def iteration_bytes(stream, plan_inputs, cost_model, iteration, mbs, num_mb):
    """Per encoder phase: (decoded bytes, encoded bytes, units moved, extra decodes)."""
    rank_samples, encoded = [], []
    for rank in range(DP):
        pairs = []
        for k in (k for mb in microbatch_indices(iteration, rank, DP, mbs, num_mb) for k in mb):
            pairs.append((k, stream.meta(k)))
            encoded.append(stream.encoded_sizes(k))  # canonical order: rank by rank
            stream.discard(k)
        rank_samples.append(pairs)
    md = GatheredMetadata.from_rank_samples(rank_samples)
    metas = [meta for pairs in rank_samples for _, meta in pairs]
    plan = plan_iteration(md, cost_model, algorithm="auto", gpus_per_node=DP)
    out = {}
    for phase in plan.phases:
        if phase.phase == "llm":
            continue
        route, items = phase.dispatch, phase.items
        item_of = {}  # (sample, unit among its units of this encoder) -> (modality, item index)
        for s, meta in enumerate(metas):
            u = 0
            for m in (m for m in MODALITIES if ENCODER_OF_MODALITY[m] == phase.phase):
                for i, item in enumerate(meta.items(m)):
                    for _ in item.units:
                        item_of[s, u] = (m, i)
                        u += 1

        def item(unit):
            s = int(items.sample[unit])
            return (s, *item_of[s, int(items.unit_in_sample[unit])])

        moved = np.flatnonzero(route.src != route.dst)
        decoded = int(route.rows[moved].sum()) * plan_inputs[phase.phase]
        # A whole file travels to each destination that computes any of its units.
        sent = {(item(u), int(route.dst[u])) for u in moved}
        size = sum(encoded[s][m][i] for (s, m, i), _ in sent)
        # An item decoded both at home (some units kept) and at a destination: one more decode.
        kept = {item(u) for u in np.flatnonzero(route.src == route.dst)}
        extra = sum(1 for it, _ in sent if it in kept)
        out[phase.phase] = (decoded, size, int(moved.size), extra)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_data_argument(p)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("extra", nargs="*", help="trainer flags after --")
    args = p.parse_args(argv)
    flags, scratch = demo_data_flags(args.data_path)
    flags += args.extra
    config_files = quiet_config_files()
    loaded = config_files.load_run_config("cpu-main", [" ".join(flags)], world_size=DP)
    from megatron.mllm.data_energon import stream_from_run

    run = loaded.run
    stream = stream_from_run(run)
    cost_model = CostModel.build(loaded.shape)
    inputs = payload_bytes(loaded.model).inputs
    mbs = run.micro_batch_size
    num_mb = run.global_batch_size // (mbs * DP)
    totals: dict[str, np.ndarray] = {}
    print(
        f"DP={DP}, {args.iters} iterations of {run.global_batch_size} samples from {run.data.data_path}"
    )
    print(f"{'iter':>4} {'phase':>6} {'units moved':>11} {'decoded KB':>11} {'encoded KB':>11} "
          f"{'ratio':>6} {'extra decodes':>13}")  # fmt: skip
    for it in range(args.iters):
        for phase, row in iteration_bytes(stream, inputs, cost_model, it, mbs, num_mb).items():
            decoded, encoded, units, extra = row
            totals[phase] = totals.get(phase, np.zeros(4)) + np.array(row, dtype=float)
            ratio = f"{encoded / decoded:6.3f}" if decoded else "     -"
            print(f"{it:>4} {phase:>6} {units:>11} {decoded / 1e3:>11.1f} {encoded / 1e3:>11.1f} "
                  f"{ratio} {extra:>13}")  # fmt: skip
    decoded = sum(t[0] for t in totals.values())
    encoded = sum(t[1] for t in totals.values())
    print("per iteration, mean:")
    for phase, t in totals.items():
        n = args.iters
        print(f"  {phase}: {t[2] / n:.1f} units moved, decoded {t[0] / n / 1e3:.1f} KB, "
              f"encoded {t[1] / n / 1e3:.1f} KB, {t[3] / n:.2f} extra decodes")  # fmt: skip
    if scratch is not None:
        scratch.cleanup()
    if not decoded:
        print("error: nothing moved: no ratio", file=sys.stderr)
        return 2
    print(f"encoded_over_decoded_bytes: {encoded / decoded:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

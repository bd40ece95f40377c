#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""DDP against the distributed optimizer (``--use-distributed-optimizer``) on the main job.

Runs the main job (2 gloo ranks, DP=2) with each optimizer, interleaved (ddp, distributed, ddp,
distributed, ...), on the same data, saving a checkpoint at the end, and prints per optimizer:
the median iteration time (first iterations excluded), the last loss, and the bytes of Adam
moments each rank holds, read from its checkpoint files: DDP's model file carries all of them
(every rank holds the same replica), the distributed optimizer's ``distrib_optim_dp_DDDD.pt``
each rank's slice. The losses must agree (to round-off: the gradients are reduced in another order).

Usage: python tools/bench/optimizer_cpu.py [--rounds 2] [--iters 12] [--warmup 2]
       [-- trainer flags]

Ends with one line ``distopt_moment_bytes_per_rank_ratio: R`` (the distributed optimizer's
largest per-rank share of the moments over DDP's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from cpu_runs import run_main_job

KINDS = {"ddp": [], "distributed": ["--use-distributed-optimizer"]}


MOMENTS = ("exp_avg", "exp_avg_sq")


def _moment_bytes(value) -> int:
    """Bytes of the Adam moments anywhere in a saved state (the state that ZeRO-1 shards; with
    fp32 training the main parameters are the model's own, so they add nothing in memory)."""
    if isinstance(value, dict):
        return sum(
            v.numel() * v.element_size() if k in MOMENTS and isinstance(v, torch.Tensor)
            else _moment_bytes(v)
            for k, v in value.items()
        )  # fmt: skip
    if isinstance(value, (list, tuple)):
        return sum(_moment_bytes(v) for v in value)
    return 0


def moment_bytes_per_rank(checkpoint: Path) -> list[int]:
    """Per DP rank, the bytes of Adam moments that rank holds (from its checkpoint files)."""
    (iteration,) = sorted(checkpoint.glob("iter_*"))
    rank_dir = iteration / "mp_rank_00"
    model = torch.load(rank_dir / "model_optim_rng.pt", weights_only=False)
    common = _moment_bytes(model["optimizer"])
    shards = sorted(rank_dir.glob("distrib_optim_dp_*.pt"))
    if not shards:  # replicated: every rank holds what DP rank 0 saved
        return [common, common]
    return [common + _moment_bytes(torch.load(s, weights_only=False)) for s in shards]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("flags", nargs="*", help="extra trainer flags (after --)")
    args = parser.parse_args()
    times = {k: [] for k in KINDS}
    losses, state = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for kind, flags in KINDS.items():
                ckpt = Path(tmp) / f"{kind}-{r}"
                records = run_main_job(
                    kind,
                    [*flags, *args.flags, "--save", str(ckpt), "--save-interval", str(args.iters)],
                    args.iters,
                )
                times[kind] += [x["iteration_time_s"] for x in records[args.warmup :]]
                losses[kind] = records[-1]["lm_loss"]
                state[kind] = moment_bytes_per_rank(ckpt)
    print("| optimizer | ms/iter (median) | last loss | Adam moments per rank (MiB) |")
    print("|---|---|---|---|")
    for kind in KINDS:
        mib = ", ".join(f"{b / 2**20:.2f}" for b in state[kind])
        ms = 1000 * statistics.median(times[kind])
        print(f"| {kind} | {ms:.1f} | {losses[kind]:.6f} | {mib} |")
    diff = abs(losses["distributed"] - losses["ddp"]) / abs(losses["ddp"])
    print(f"relative loss difference after {args.iters} iterations: {diff:.1e}")
    ratio = max(state["distributed"]) / max(state["ddp"])
    print(f"distopt_moment_bytes_per_rank_ratio: {ratio:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

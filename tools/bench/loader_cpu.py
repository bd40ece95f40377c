#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Is the real-data loader the bottleneck? Its throughput against the trainer's consumption.

On the demo blend (``make demo-data``: ``demo-data/blend.yaml``, built in a temporary directory
when absent) with the README's demo flags at DP=2, each round runs, one after another:

- the loader alone with ``--num-workers 1`` and then 2: two processes at once (DP ranks 0 and
  1, as in training, sharing the host's cores), each reading its own samples of ``--loader-iters``
  iterations as the trainer does (metadata from headers, then the media decoded in the worker
  processes, :mod:`megatron.mllm.decode_pool`); samples per second per rank, the slower rank's.
  The workers' start-up (launch until every one is ready) is waited for before the clock starts,
  as a run starts them while it sets up, and printed per round (the slower rank's);
- the trainer on the same data (``--num-workers 2``, post-balancing on): samples it consumes
  per second per rank over the iterations after the warm-up.

Rounds are interleaved (loader 1, loader 2, trainer, loader 1, ...) because the host's speed
drifts. Each round prints both loader rates, the trainer's, and their ratios; then the median
and spread. Ends with one line ``loader_over_consumption: X`` (median over rounds of the
2-worker loader's rate over the trainer's; above 1: the loader keeps up).

Usage: python tools/bench/loader_cpu.py [--data-path DIR] [--rounds 3] [--iters 12] [--warmup 3]
       [--loader-iters 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from cpu_runs import add_demo_data_argument, demo_data_flags, run_main_job, summarize

DP = 2


def load_rank(path: str, rank: int, workers: int, iters: int) -> dict:
    """Read and decode DP rank ``rank``'s samples of ``iters`` iterations; its rate."""
    from megatron.mllm.cli.args import quiet_config_files
    from megatron.mllm.data_energon import stream_from_run
    from orchestration.packing import microbatch_indices

    flags, _ = demo_data_flags(path)  # the path exists: the parent built it
    flags += ["--num-workers", str(workers)]
    run = quiet_config_files().load_run_config("cpu-main", [" ".join(flags)], world_size=DP).run
    stream = stream_from_run(run)
    startup = stream.workers_ready()  # a run's workers start during its setup: not timed
    mbs = run.micro_batch_size
    num_mb = run.global_batch_size // (mbs * DP)
    start, samples = time.perf_counter(), 0
    for it in range(iters):
        pairs = [(k, stream.meta(k)) for mb in microbatch_indices(it, rank, DP, mbs, num_mb)
                 for k in mb]  # fmt: skip
        stream.payloads(pairs, with_features=True)
        samples += len(pairs)
    elapsed = time.perf_counter() - start
    stream.close()
    return {"rank": rank, "samples": samples, "seconds": elapsed, "startup_s": startup}


def loader_rate(path: str, workers: int, iters: int) -> tuple[float, float]:
    """Samples per second of the slower of two concurrent loader processes (ranks 0 and 1), and
    the longer of their decode pools' start-up seconds."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--as-rank", str(r), "--workers", str(workers),
             "--data-path", path, "--loader-iters", str(iters)],
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
        )  # fmt: skip
        for r in range(DP)
    ]
    rates, startups = [], []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            sys.exit(f"error: a loader process failed (exit {proc.returncode})")
        rec = json.loads(out.strip().splitlines()[-1])
        rates.append(rec["samples"] / rec["seconds"])
        startups.append(rec["startup_s"] or 0.0)
    return min(rates), max(startups)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_demo_data_argument(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=12, help="trainer iterations per run")
    p.add_argument("--loader-iters", type=int, default=40, help="iterations the loader reads")
    p.add_argument("--warmup", type=int, default=3, help="trainer iterations not timed")
    p.add_argument("--as-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.as_rank is not None:
        rec = load_rank(args.data_path, args.as_rank, args.workers, args.loader_iters)
        print(json.dumps(rec))
        return 0
    train, scratch = demo_data_flags(args.data_path)
    path = train[train.index("--data-path") + 1]
    train += ["--num-workers", "2"]
    print(
        f"DP={DP}; the loader reads {args.loader_iters} iterations, the trainer runs "
        f"{args.iters} ({args.warmup} of warm-up); samples/s per rank"
    )
    print(f"{'round':>5} {'loader 1w':>10} {'loader 2w':>10} {'trainer':>8} "
          f"{'2w/1w':>6} {'2w/trainer':>10} {'start 1w s':>10} {'start 2w s':>10}")  # fmt: skip
    ratios, speedups = [], []
    for r in range(args.rounds):
        one, start_one = loader_rate(path, 1, args.loader_iters)
        two, start_two = loader_rate(path, 2, args.loader_iters)
        records = run_main_job("trainer", train, args.iters)
        consumed = summarize(records, args.warmup)["samples_per_s"] / DP
        ratios.append(two / consumed)
        speedups.append(two / one)
        print(f"{r:>5} {one:>10.1f} {two:>10.1f} {consumed:>8.1f} {two / one:>6.3f} "
              f"{two / consumed:>10.2f} {start_one:>10.3f} {start_two:>10.3f}")  # fmt: skip
    if scratch is not None:
        scratch.cleanup()
    print(
        f"2 workers over 1: median {statistics.median(speedups):.3f} "
        f"(min {min(speedups):.3f}, max {max(speedups):.3f})"
    )
    print(
        f"loader (2 workers) over the trainer's consumption: median "
        f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"
    )
    print(f"loader_over_consumption: {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Which payload should post-balancing move: decoded encoder inputs, or the encoded media?

On the demo blend (``make demo-data``: ``demo-data/blend.yaml``) with the README's demo flags at
DP=2, every iteration's samples are read as the trainer reads them (metadata from headers), planned as
``--post-balance auto`` plans them with its starting cost model (FLOPs: every phase balanced,
no exchange check, so this counts the most moves), and the bytes of each encoder phase's input
dispatch are counted three ways:

- **fp32**: every moved unit's rows as float32 features, ``input_dim x 4`` bytes per encoder
  token (what the trainer moved until images' units became pixels);
- **moved** (what the trainer moves): an image unit's raw uint8 pixels (``input_dim`` bytes
  per patch, normalised where the encoder runs), audio's float32 log-mels;
- **encoded**: the image or audio file's bytes, once per (item, destination rank) that receives
  any of its units (a destination decodes the whole file, then keeps its units).

A file moved costs a decode where it lands, on the step's critical path, while the loader
decodes its own samples before the step. So each file sent is decoded here and timed (the
fastest of 3), and the bench prints the link bandwidth below which sending files would cost
less time than sending the units: ``(moved - encoded) bytes / decode seconds``. The LLM
phase's token ids, the encoder outputs and their gradients are the same either way and are
left out. Ends with one line ``encoded_pays_below_mb_per_s: X`` (a link slower than X MB/s
would favour moving files; gloo on one host moves GB/s).

Usage: python tools/bench/payload_bytes.py [--data-path DIR] [--iters N] [-- trainer flags]
"""

from __future__ import annotations

import argparse
import sys
import time

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


COLUMNS = ("fp32", "moved", "encoded", "units", "files", "decode_s", "extra")
"""Per encoder phase and iteration: bytes three ways, units moved, files a destination would
decode, their measured decode seconds, and decodes a split item costs on top."""


def decode_seconds(prep, data: bytes, cache: dict) -> float:
    """The fastest of 3 decodes of one file into its units (cached per file)."""
    key = (id(prep), data)
    if key not in cache:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            prep.features(data)
            times.append(time.perf_counter() - start)
        cache[key] = min(times)
    return cache[key]


def iteration_bytes(stream, preps, moved_bytes, fp32_bytes, cost_model, iteration, mbs, num_mb,
                    cache):  # fmt: skip
    """Per encoder phase: the :data:`COLUMNS` of one iteration."""
    rank_samples, media = [], []
    for rank in range(DP):
        pairs = []
        for k in (k for mb in microbatch_indices(iteration, rank, DP, mbs, num_mb) for k in mb):
            pairs.append((k, stream.meta(k)))
            media.append(stream.encoded_media(k))  # canonical order: rank by rank
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
        rows = int(route.rows[moved].sum())
        # A whole file travels to each destination that computes any of its units.
        sent = {(item(u), int(route.dst[u])) for u in moved}
        size = sum(len(media[s][m][i]) for (s, m, i), _ in sent)
        seconds = sum(decode_seconds(preps[m], media[s][m][i], cache) for (s, m, i), _ in sent)
        # An item decoded both at home (some units kept) and at a destination: one more decode.
        kept = {item(u) for u in np.flatnonzero(route.src == route.dst)}
        extra = sum(1 for it, _ in sent if it in kept)
        out[phase.phase] = (
            rows * fp32_bytes[phase.phase], rows * moved_bytes[phase.phase], size,
            int(moved.size), len(sent), seconds, extra,
        )  # fmt: skip
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
    one = getattr(stream, "streams", [stream])[0]  # every dataset of a blend preprocesses alike
    preps = {m: one.preprocessor(m) for m in ("image", "audio")}
    cost_model = CostModel.build(loaded.shape)
    moved_bytes = payload_bytes(loaded.model, real_data=True).inputs
    fp32_bytes = payload_bytes(loaded.model, real_data=False).inputs  # synthetic data's
    mbs = run.micro_batch_size
    num_mb = run.global_batch_size // (mbs * DP)
    totals: dict[str, np.ndarray] = {}
    cache: dict = {}
    print(
        f"DP={DP}, {args.iters} iterations of {run.global_batch_size} samples from {run.data.data_path}"
    )
    print(f"{'iter':>4} {'phase':>6} {'units':>5} {'fp32 KB':>8} {'moved KB':>8} "
          f"{'encoded KB':>10} {'files':>5} {'decode ms':>9} {'extra':>5}")  # fmt: skip
    for it in range(args.iters):
        got = iteration_bytes(
            stream, preps, moved_bytes, fp32_bytes, cost_model, it, mbs, num_mb, cache
        )
        for phase, row in got.items():
            fp32, moved, encoded, units, files, seconds, extra = row
            totals[phase] = totals.get(phase, np.zeros(len(COLUMNS))) + np.array(row, float)
            print(f"{it:>4} {phase:>6} {units:>5} {fp32 / 1e3:>8.1f} {moved / 1e3:>8.1f} "
                  f"{encoded / 1e3:>10.1f} {files:>5} {seconds * 1e3:>9.2f} {extra:>5}")  # fmt: skip
    if scratch is not None:
        scratch.cleanup()
    n = args.iters
    print("per iteration, mean:")
    for phase, t in totals.items():
        c = dict(zip(COLUMNS, t / n))
        print(f"  {phase}: {c['units']:.1f} units moved; fp32 {c['fp32'] / 1e3:.1f} KB, moved "
              f"{c['moved'] / 1e3:.1f} KB, encoded {c['encoded'] / 1e3:.1f} KB in "
              f"{c['files']:.1f} files ({c['decode_s'] * 1e3:.2f} ms to decode them where they "
              f"land, {c['extra']:.2f} extra decodes)")  # fmt: skip
    c = dict(zip(COLUMNS, sum(totals.values()) if totals else np.zeros(len(COLUMNS))))
    if not c["moved"]:
        print("error: nothing moved: no ratio", file=sys.stderr)
        return 2
    print(f"moved_over_fp32_bytes {c['moved'] / c['fp32']:.4f}, encoded_over_moved_bytes "
          f"{c['encoded'] / c['moved']:.4f}")  # fmt: skip
    # Files pay when the bytes they save take longer on the link than decoding them takes.
    saved = sum(t[1] - t[2] for t in totals.values() if t[1] > t[2])
    seconds = sum(t[5] for t in totals.values() if t[1] > t[2])
    if saved <= 0:
        print("encoded_pays_below_mb_per_s: 0 (the units moved are never larger than the files)")
        return 0
    print(f"encoded_pays_below_mb_per_s: {saved / seconds / 1e6:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

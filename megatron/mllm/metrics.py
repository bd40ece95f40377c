# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What the trainer reports: Megatron-style log lines, per-phase DP imbalance, FLOPs.

The figures come from the iteration's all-gathered metadata (``GlobalBatch.metadata``): the
logger costs each DP rank's share of each phase without communicating again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from orchestration.balance import max_over_mean
from orchestration.metadata import GatheredMetadata
from orchestration.model_shape import ModelShape
from orchestration.packing import padding_runs
from orchestration.workload import PHASES, SampleMeta


def phase_costs(
    shape: ModelShape,
    microbatches: Sequence[Sequence[SampleMeta]],
    pad_to: int | None,
    max_pad_run: int | None = None,
) -> dict[str, float]:
    """Training FLOPs of each phase for one rank's microbatches, as the rank executes them.

    Encoders pay per unit (attention within each unit); the LLM pays per packed sample, plus the
    padding runs when microbatches are padded to ``pad_to`` tokens (PP > 1 baseline).
    """
    costs = {phase: 0.0 for phase in PHASES if phase == "llm" or phase in shape.encoders}
    for mb in microbatches:
        lens = [s.llm_tokens for s in mb]
        lens += padding_runs(sum(lens), pad_to, max_pad_run or pad_to or 1)
        costs["llm"] += shape.phase_flops("llm", lens)
        for s in mb:
            for phase, flops in shape.sample_phase_flops(s).items():
                if phase != "llm":
                    costs[phase] += flops
    return costs


def imbalance(per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
    """Max over mean of each phase's cost across ranks (1.0 is perfect; 0-cost phases give 1)."""
    return {
        phase: max_over_mean(np.array([r[phase] for r in per_rank], dtype=np.float64))
        for phase in per_rank[0]
    }


def iteration_metrics(
    metadata: GatheredMetadata,
    shape: ModelShape,
    micro_batch_size: int,
    pad_to: int | None,
    max_pad_run: int,
) -> dict:
    """Figures of one global batch, as the loader assigned it: samples, real tokens, model
    FLOPs, and the per-phase DP imbalance of Megatron's order (padding included).

    Args:
        metadata: every DP rank's samples, in loading order.
        shape: the model.
        micro_batch_size: samples per loaded microbatch.
        pad_to: the fixed microbatch length the step pads to, None when it packs without.
        max_pad_run: the longest padding run (``--seq-length``).
    """
    per_rank = []
    for rank in range(metadata.num_ranks):
        metas = [metadata.sample_meta(s) for s in metadata.rank_samples(rank)]
        mbs = [metas[i : i + micro_batch_size] for i in range(0, len(metas), micro_batch_size)]
        per_rank.append(mbs)
    samples = [s for rank in per_rank for mb in rank for s in mb]
    costs = [phase_costs(shape, rank, pad_to, max_pad_run) for rank in per_rank]
    return {
        "samples": len(samples),
        "tokens": batch_tokens(samples),
        "flops": shape.batch_flops(samples),
        "imbalance": imbalance(costs) if len(costs) > 1 else {k: 1.0 for k in costs[0]},
    }


@dataclass
class IntervalStats:
    """Accumulates iterations between two log lines."""

    iterations: int = 0
    seconds: float = 0.0
    samples: int = 0
    tokens: int = 0
    flops: float = 0.0
    loss_sum: float = 0.0
    loss_tokens: float = 0.0
    imbalance_sums: dict[str, float] = field(default_factory=dict)
    balanced_sums: dict[str, float] = field(default_factory=dict)
    bytes_moved: int = 0

    def add(
        self,
        seconds: float,
        samples: int,
        tokens: int,
        flops: float,
        imb: dict[str, float],
        balanced: dict[str, float] | None = None,
        bytes_moved: int = 0,
    ):
        """Record one iteration; ``balanced`` is the imbalance after post-balancing."""
        self.iterations += 1
        self.seconds += seconds
        self.samples += samples
        self.tokens += tokens
        self.flops += flops
        for k, v in imb.items():
            self.imbalance_sums[k] = self.imbalance_sums.get(k, 0.0) + v
        for k, v in (balanced or {}).items():
            self.balanced_sums[k] = self.balanced_sums.get(k, 0.0) + v
        self.bytes_moved += bytes_moved


def tflops_per_gpu(flops: float, seconds: float, world_size: int) -> float:
    """Model TFLOP/s per rank (the log line's "throughput per GPU", and TensorBoard's)."""
    return flops / seconds / world_size / 1e12


def format_log_line(
    iteration: int,
    train_iters: int,
    consumed_samples: int,
    stats: IntervalStats,
    world_size: int,
    lr: float,
    global_batch_size: int,
    loss: float | None,
    grad_norm: float | None,
) -> str:
    """One Megatron-style training log line for the interval in ``stats``."""
    n = max(1, stats.iterations)
    ms = 1000.0 * stats.seconds / n
    secs = max(stats.seconds, 1e-12)
    tflops = tflops_per_gpu(stats.flops, secs, world_size)
    parts = [
        f" [{time.strftime('%Y-%m-%d %H:%M:%S')}] iteration {iteration:8d}/{train_iters:8d}",
        f"consumed samples: {consumed_samples:12d}",
        f"elapsed time per iteration (ms): {ms:.1f}",
        f"throughput per GPU (TFLOP/s/GPU): {tflops:.4f}",
        f"samples per second: {stats.samples / secs:.2f}",
        f"tokens per second: {stats.tokens / secs:.1f}",
        f"learning rate: {lr:.6E}",
        f"global batch size: {global_batch_size:5d}",
    ]
    if loss is not None:
        parts.append(f"lm loss: {loss:.6E}")
    if grad_norm is not None:
        parts.append(f"grad norm: {grad_norm:.3f}")
    if stats.imbalance_sums:
        shown = []
        for k, v in stats.imbalance_sums.items():
            if k in stats.balanced_sums:
                shown.append(f"{k} {v / n:.3f}->{stats.balanced_sums[k] / n:.3f}")
            else:
                shown.append(f"{k} {v / n:.3f}")
        parts.append(f"DP imbalance max/mean: {' '.join(shown)}")
    if stats.balanced_sums:
        parts.append(f"bytes moved per iteration: {stats.bytes_moved / n / 1e6:.3f} MB")
    return " | ".join(parts) + " |"


def write_metrics(path: str, record: dict) -> None:
    """Append one JSON record to a JSONL metrics file."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def batch_tokens(samples: Iterable[SampleMeta]) -> int:
    """Real LLM tokens of a batch (no padding)."""
    return sum(s.llm_tokens for s in samples)

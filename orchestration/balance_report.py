# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""How well each balancing algorithm balances each phase of one global batch.

DP rank ``r`` gets samples ``r*k .. r*k+k-1`` of a :class:`~orchestration.workload_spec.
SampleStream` (``k`` samples per rank), as the trainer's loader would give them. For each phase
(vision, audio, llm) and each algorithm, :func:`evaluate` reports max/mean of the ranks'
predicted costs before (items stay where they were loaded) and after balancing, the ratio of
the max load to the lower bound, the planning time (CPU ms) and the fraction of items moved.
Algorithms (:data:`ALGORITHMS`):

* ``none``: the ordinary assignment;
* ``sample-lpt``: LPT over whole samples by their summed cost over all phases, every phase
  following its sample: the reference to beat (what balancers that move whole samples do);
* ``lpt``, ``kk``, ``kk+refine``: one algorithm of :mod:`orchestration.balance` per phase, over
  encoder units and samples;
* ``auto``: what the planner uses (all of them, best max load, then fewest moved items).

The lower bound is the best of :mod:`orchestration.bounds` (average, largest item, pigeonhole
sums, ...) and, for small problems (:data:`ILP_MAX_BINS` ranks and :data:`ILP_MAX_ITEMS` items
at most), the HiGHS ILP's dual bound within ``ilp_seconds`` (0 disables); when the ILP proves
the optimum it is reported. The ``orchweave-balance-report`` tool (``tools/balance_report.py``)
prints :func:`compare_algorithms`.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Sequence, TypeVar

import numpy as np

from orchestration.balance import balance, max_over_mean
from orchestration.bounds import lower_bound
from orchestration.cost_model import CostModel
from orchestration.metadata import GatheredMetadata, phase_items
from orchestration.phase_plan import plan_iteration
from orchestration.sample_plan import sample_phase_costs
from orchestration.workload import PHASES, SampleMeta, WorkloadError
from orchestration.workload_spec import SampleStream

ALGORITHMS = ("none", "sample-lpt", "lpt", "kk", "kk+refine", "auto")
"""Rows of the report, in order."""

ILP_MAX_BINS = 16
"""The ILP bound runs only up to this many ranks..."""

ILP_MAX_ITEMS = 400
"""...and this many items."""

T = TypeVar("T")

Progress = Callable[[Iterable[T], str], Iterable[T]]
"""Wraps a loop's iterable, given a label, e.g. in a progress bar (the tool's
``megatron.mllm.cli.progress.progress``); it must yield the same items."""


def _no_progress(items: Iterable[T], desc: str) -> Iterable[T]:
    return items


def rank_samples(
    stream: SampleStream, dp: int, per_rank: int
) -> tuple[list[list[tuple[int, SampleMeta]]], dict[str, Any]]:
    """Every DP rank's (stream index, metadata) pairs, and a description of the source.

    Args:
        stream: the samples; a JSONL file must hold ``dp x per_rank`` of them.
        dp: data-parallel ranks.
        per_rank: samples each rank loads.

    Returns:
        The ranks' samples and ``{kind, argument}`` (plus ``name, seed, token_scale`` for a
        spec).

    Raises:
        WorkloadError: a JSONL file with too few samples.
    """
    need = dp * per_rank
    gen = stream.generator
    if gen is None:
        samples = stream.file_samples
        if len(samples) < need:
            raise WorkloadError(
                f"{stream.workload} has {len(samples)} samples; --dp {dp} x --samples-per-rank "
                f"{per_rank} needs {need}"
            )
        desc = {"kind": "jsonl", "argument": stream.workload}
    else:
        samples = gen.samples(need)
        desc = {
            "kind": "spec",
            "argument": stream.workload,
            "name": gen.spec.name,
            "seed": gen.seed,
            "token_scale": gen.token_scale,
        }
    ranks = [
        [(r * per_rank + k, samples[r * per_rank + k]) for k in range(per_rank)] for r in range(dp)
    ]
    return ranks, desc


def _cpu_ms(fn: Callable[[], T]) -> tuple[T, float]:
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
    progress: Progress = _no_progress,
) -> dict[str, Any]:
    """Every algorithm on every phase of one gathered batch.

    Args:
        metadata: the batch, as the metadata all-gather gives it.
        cost_model: the per-phase costs.
        gpus_per_node: ranks per node, for the node-aware locality mapping.
        ilp_seconds: time limit of the ILP bound per phase (0 disables).
        algorithms: which rows, from :data:`ALGORITHMS`.
        progress: wraps the loop over the phases (each runs every algorithm and the bound).

    Returns:
        ``{plan_iteration_ms, digest, cost_unit, phases}``: ``phases[phase]`` is ``{items,
        lower_bound: {value, which, proven_optimum, ilp_status}, algorithms: {name:
        {max_over_mean_before, max_over_mean_after, ratio_to_lower_bound, plan_ms,
        moved_fraction}}}``.
    """
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
    # The phases, not the algorithms, get the steps: an algorithm takes milliseconds even at
    # DP 2560, the ILP bound up to ilp_seconds per phase.
    for phase in progress([p for p in PHASES if p in cost_model], "phases"):
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


def compare_algorithms(
    stream: SampleStream,
    dp: int,
    samples_per_rank: int,
    cost_model: CostModel,
    *,
    gpus_per_node: int = 8,
    ilp_seconds: float = 3.0,
    progress: Progress = _no_progress,
) -> dict[str, Any]:
    """:func:`evaluate` on the batch :func:`rank_samples` loads, with its ``source``.

    Raises:
        WorkloadError: too few samples in a JSONL file.
        InfeasibleCapError: a sample the balancer cannot place.
    """
    ranks, source = rank_samples(stream, dp, samples_per_rank)
    metadata = GatheredMetadata.from_rank_samples(ranks)
    report = evaluate(
        metadata, cost_model, gpus_per_node=gpus_per_node, ilp_seconds=ilp_seconds,
        progress=progress,
    )  # fmt: skip
    return {"source": source, **report}

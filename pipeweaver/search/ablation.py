# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""DIP's ablation (arXiv 2504.14145 v2, Table 5) in SEMU: from Megatron to DIP in five steps.

Each step adds one of DIP's techniques to the previous one, on one step's microbatches:

1. ``megatron``: DIP's baseline, Megatron's (interleaved) 1F1B on the parameter-balanced layout
   (:meth:`~pipeweaver.placement.Placement.balanced_stages`: every module's layers, encoders
   first, in P x K consecutive stages), whole microbatches padded to the sequence length as
   Megatron pads, and the least recompute that fits, as a user would choose it: none, else
   Megatron's block recompute of each chunk's first n layers (``--recompute-granularity full
   --recompute-method block --recompute-num-layers n``, n = 1, 2, 4, ...), else every chunk
   recomputed whole (the IR's per-chunk :attr:`Memory.RECOMPUTE`);
2. ``partitioner``: DIP's modality-aware partitioning (:mod:`pipeweaver.search.partition`:
   B_i units per encoder sub-microbatch, K_i chunks per stage, layers split by cost), the
   microbatches unpadded as the runtime runs them and cut into sub-microbatches, still under a
   Megatron order: the interleaved 1F1B over the partitioned layout's pipeline stages (the
   encoder's P x K_v chunks, then the LLM's P x K_l, stage v on rank v mod P; each stage runs
   its chunk for every sub of a microbatch), recompute as needed to fit. DIP's text gives the
   partitioner's gain before any interleaving, so the order here is Megatron's;
3. ``interleaving``: phase 2, greedy dual-queue interleaving
   (:func:`~pipeweaver.interleave.greedy_dual_queue`, SEMU's compute times as durations) under
   the hard limit of :func:`~pipeweaver.search.memory_limit.memory_limit_bytes` (the device's
   memory minus the rank's static bytes), keeping every activation when an order fits so,
   else recomputing every chunk;
4. ``reordering``: phase 1, MCTS over segment priorities
   (:func:`~pipeweaver.search.mcts.search_schedule`) with step 3's phase 2, never worse than it
   (the greedy order is the search's first rollout);
5. ``memory``: phase 3, the per-pair memory ILP (:func:`~pipeweaver.search.memory_plan.
   plan_memory`: keep, recompute, offload on a GPU). As in DIP, phase 2 now plans memory with
   the most frugal strategy (every order fits as if every chunk were recomputed) so that phase
   3 has room to trade memory for time; the search runs again with phase 3 in every rollout
   (``refine_every_rollout``, DIP's loop) or, as the trainer does, phase 3 once on the best
   order and on greedy's. Phase 3 also plans step 4's order, and the fastest plan is kept, so
   the step is never slower than step 4 (in SEMU's pipeline time).

Every schedule passes :func:`pipeweaver.checker.check`; each step reports SEMU's whole step
(pipeline, gradient reduction, optimizer) and its peak memory per rank.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from pipeweaver.checker import check
from pipeweaver.ir import Kind, Memory, ScheduleError
from pipeweaver.schedule import Schedule
from pipeweaver.search.memory_limit import GIB, memory_limit_bytes
from pipeweaver.search.memory_plan import DEFAULT_STRATEGIES, StrategyCosts, plan_memory
from pipeweaver.search.partition import PartitionPlan
from pipeweaver.semu.batches import MicrobatchMeta
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.model import LayerRecompute, ModelSpec
from pipeweaver.semu.scenario import build_step
from pipeweaver.semu.simulator import Semu

DIP_TABLE5_S: tuple[tuple[str, str, float], ...] = (
    ("megatron", "Megatron-LM", 26.13),
    ("partitioner", "+ modality-aware partitioner", 22.27),
    ("interleaving", "+ stage interleaving", 18.81),
    ("reordering", "+ segment reordering", 17.61),
    ("memory", "+ per-layer memory optimisation", 16.05),
)
"""DIP's Table 5 (VLM-S on H800): step name, DIP's label, seconds per iteration."""


@dataclass(frozen=True, slots=True)
class AblationStep:
    """One step of the ablation on one batch."""

    name: str
    """The step (:data:`DIP_TABLE5_S`'s first column)."""

    step_time_s: float
    """SEMU's step time."""

    peak_memory_bytes: tuple[float, ...]
    """Per pipeline rank, SEMU's peak (static bytes plus activations alive)."""

    device_bytes: float | None
    """The memory each device has (the flag's, else the device's; None: no limit, a CPU)."""

    memory: str
    """How activations were kept: ``none``, ``recompute`` (every chunk) or the memory plan's
    share of recomputed and offloaded pairs."""

    schedule: Schedule
    """The step's schedule (it passed the checker)."""

    peak_without_recompute_bytes: tuple[float, ...] | None = None
    """Steps 1-2 when recompute was needed: the per-rank peak without it."""

    wall_s: float = 0.0
    """Host seconds the step took to build and simulate (its search included)."""

    block_recompute_layers: int = 0
    """Steps 1-2: Megatron's block recompute of each chunk's first n layers when that was the
    least recompute that fits (0: none, or :attr:`memory` says every chunk)."""

    mfu: float = 0.0
    """SEMU's model FLOPs utilisation of the step (the samples' FLOPs, not padding or
    recompute, over the step time and every device's peak)."""

    @property
    def fits(self) -> bool:
        """Whether every rank's peak is within the device memory."""
        return self.device_bytes is None or max(self.peak_memory_bytes) <= self.device_bytes


def device_memory_bytes(cluster: ClusterSpec, memory_limit_gb: float | None = None) -> float | None:
    """The memory of each device: ``--pipeline-memory-limit-gb`` when given, else the device's
    (None for a CPU, whose host memory is not the pipeline's to plan)."""
    if memory_limit_gb is not None:
        return float(memory_limit_gb) * GIB
    return None if cluster.device.name == "cpu" else float(cluster.device.hbm_bytes)


def _memory_share(schedule: Schedule) -> str:
    """The strategies of a schedule's F/B pairs, e.g. ``12/96 recompute, 3/96 offload``."""
    counts: dict[Memory, int] = {}
    for r in range(schedule.num_ranks):
        for a in schedule.computes(r):
            if a.kind is Kind.F:
                counts[a.memory] = counts.get(a.memory, 0) + 1
    total = sum(counts.values())
    parts = [
        f"{counts[m]}/{total} {m.value}" for m in (Memory.RECOMPUTE, Memory.OFFLOAD) if m in counts
    ]
    return "planned: " + (", ".join(parts) if parts else "keep all")


class _Steps:
    """The shared pieces of one batch's ablation."""

    def __init__(self, semu: Semu, spec: ModelSpec, cluster: ClusterSpec, device: float | None):
        self.semu, self.spec, self.cluster, self.device = semu, spec, cluster, device
        self.since = time.perf_counter()

    def simulate(self, schedule: Schedule, mbs: Sequence[MicrobatchMeta], semu: Semu | None = None):
        semu = self.semu if semu is None else semu
        return semu.simulate_step([schedule], [list(mbs)], record_events=False)

    def step(
        self,
        name: str,
        schedule: Schedule,
        mbs,
        memory: str,
        final: bool = True,
        semu: Semu | None = None,
        **extra,
    ) -> AblationStep:
        """Check and simulate a step's schedule (with ``semu``, default the ablation's);
        ``final`` ends the step's wall time."""
        check(schedule)
        pred = self.simulate(schedule, mbs, semu)
        now = time.perf_counter()
        wall, self.since = now - self.since, (now if final else self.since)
        return AblationStep(
            name, pred.step_time_s, tuple(pred.peak_memory_bytes), self.device, memory, schedule,
            wall_s=wall, mfu=pred.mfu, **extra,
        )  # fmt: skip

    def megatron_order(self, name: str, **build) -> tuple[AblationStep, list[MicrobatchMeta]]:
        """A Megatron schedule with the least recompute that fits: none, else Megatron's block
        recompute of each chunk's first n layers with the least n below the deepest chunk's
        layer count that fits (:func:`least_fitting`), else every chunk recomputed whole."""
        scheds, mbs, _ = build_step(
            self.spec, self.cluster, memory=Memory.NONE, replicas=1, **build
        )
        kept = self.step(name, scheds[0], mbs[0], "none", final=False)
        if kept.fits:
            self.since = time.perf_counter()
            return kept, mbs[0]
        deepest = max(c.num_layers for m in scheds[0].placement.modules
                      for c in scheds[0].placement.chunks[m])  # fmt: skip
        tried: dict[int, tuple[AblationStep, list[MicrobatchMeta]]] = {}

        def fits(n: int) -> bool:
            spec = _with_block_recompute(self.spec, n)
            scheds_n, mbs_n, _ = build_step(
                spec, self.cluster, memory=Memory.NONE, replicas=1, **build
            )
            tried[n] = self.step(
                name, scheds_n[0], mbs_n[0], f"block recompute of {n} layers per chunk",
                final=False, semu=Semu(spec, self.cluster, self.semu.cost.calibration),
                block_recompute_layers=n, peak_without_recompute_bytes=kept.peak_memory_bytes,
            ), mbs_n[0]  # fmt: skip
            return tried[n][0].fits

        least = least_fitting(fits, deepest - 1)
        if least is not None:
            self.since = time.perf_counter()
            return tried[least]
        scheds, mbs, _ = build_step(
            self.spec, self.cluster, memory=Memory.RECOMPUTE, replicas=1, **build
        )
        out = self.step(
            name, scheds[0], mbs[0], "recompute",
            peak_without_recompute_bytes=kept.peak_memory_bytes,
        )  # fmt: skip
        return out, mbs[0]


def least_fitting(fits: Callable[[int], bool], most: int) -> int | None:
    """The least ``n`` in ``1 .. most`` with ``fits(n)``, for ``fits`` false below some ``n``
    and true from it on (memory falls as Megatron's block recompute takes more of each chunk's
    layers); None when ``most`` is below 1 or does not fit. A bisection: asks ``fits`` at most
    ``log2(most) + 1`` times. How steps 1 and 2, and the benchmarks' baselines, recompute as
    little as fits, as a user who must fit the memory does."""
    if most < 1 or not fits(most):
        return None
    lo, hi = 0, most  # fits(lo) false (0: no recompute, the caller's own run), fits(hi) true
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _with_block_recompute(spec: ModelSpec, n: int) -> ModelSpec:
    """``spec`` with Megatron's ``--recompute-granularity full --recompute-method block
    --recompute-num-layers n``."""
    recompute = LayerRecompute("full", "block", n)
    return dataclasses.replace(
        spec, training=dataclasses.replace(spec.training, recompute=recompute)
    )


def ablation_steps(
    semu: Semu,
    spec: ModelSpec,
    cluster: ClusterSpec,
    plan: PartitionPlan,
    *,
    iteration: int = 0,
    rollouts: int = 32,
    seed: int = 0,
    memory_limit_gb: float | None = None,
    refine_every_rollout: bool = True,
) -> list[AblationStep]:
    """DIP's five ablation steps on one batch (see the module docstring).

    Args:
        semu: the simulator of ``spec`` on ``cluster``.
        spec: the model config (DP follows from the cluster; one replica is simulated).
        cluster: the devices.
        plan: the partitioner's plan for steps 2-5
            (:func:`~pipeweaver.search.partition.plan_partition`).
        iteration: which batch of the workload.
        rollouts: MCTS rollouts beyond the greedy order (steps 4 and 5).
        seed: MCTS seed.
        memory_limit_gb: the memory of each device (``--pipeline-memory-limit-gb``); default
            the device's.
        refine_every_rollout: step 5 runs phase 3 in every rollout (DIP's loop); False: once on
            the search's best order and on greedy's (the trainer's).

    Raises:
        ScheduleError: a step cannot fit its memory even with every chunk recomputed (names
            the rank and the bytes).
    """
    from pipeweaver.search.mcts import OrderEvaluator, search_schedule

    device = device_memory_bytes(cluster, memory_limit_gb)
    steps = _Steps(semu, spec, cluster, device)
    out = []
    base, _ = steps.megatron_order(
        "megatron", schedule="megatron", placement="balanced", iteration=iteration
    )
    out.append(base)
    part, mbs = steps.megatron_order(
        "partitioner",
        schedule="interleaved",
        placement="interleaved",
        partition=plan,
        encoder_sub_microbatch_units=dict(plan.sub_microbatch_units),
        pad=False,
        iteration=iteration,
    )
    out.append(part)
    placement, structure = part.schedule.placement, part.schedule.structure
    limits = memory_limit_bytes(device, semu.static_bytes(placement), memory_limit_gb)
    limited = any(x is not None for x in limits)
    kept = semu.activation_bytes(placement, mbs)

    def evaluator(memory: Memory, frugal: bool = False, refine=None) -> OrderEvaluator:
        options: dict = {"memory": memory, "refine": refine}
        if limited:
            keep_as = Memory.RECOMPUTE if frugal else memory
            options.update(
                memory_limit=limits, activation_bytes=lambda a: kept(a.with_memory(keep_as))
            )
        return OrderEvaluator(placement, structure, mbs, semu, **options)

    memory = Memory.NONE
    ev = evaluator(memory)
    try:
        greedy = ev.schedule(ev.space.default())
    except ScheduleError:  # no order keeps every activation within the limit
        memory = Memory.RECOMPUTE
        ev = evaluator(memory)
        greedy = ev.schedule(ev.space.default())
    out.append(steps.step("interleaving", greedy, mbs, memory.value))
    searched = search_schedule(
        placement, structure, mbs, None, rollouts=rollouts, seed=seed, evaluator=ev
    )
    out.append(steps.step("reordering", searched.schedule, mbs, memory.value))
    if not limited:  # nothing to trade: phase 3 keeps every activation
        out.append(steps.step("memory", searched.schedule, mbs, "planned: keep all"))
        return out
    strategies = DEFAULT_STRATEGIES
    if cluster.device.name != "cpu":
        strategies = (*strategies, Memory.OFFLOAD)
    costs = StrategyCosts.from_semu(semu, placement, mbs)

    def refine(schedule: Schedule) -> Schedule:
        return plan_memory(schedule, costs, limits, strategies=strategies).schedule

    ev3 = evaluator(Memory.NONE, frugal=True, refine=refine if refine_every_rollout else None)
    found = search_schedule(
        placement, structure, mbs, None, rollouts=rollouts, seed=seed, evaluator=ev3
    ).schedule
    # Phase 3 on the best orders of both accountings of phase 2 (as if recomputed, and step
    # 4's own): the planner may keep step 4's order, whose pairs the ILP then still chooses.
    candidates = [found if refine_every_rollout else refine(found), refine(searched.schedule)]
    if not refine_every_rollout:
        candidates.append(refine(ev3.schedule(ev3.space.default())))
    best = min(candidates, key=ev3.time_of)
    out.append(steps.step("memory", best, mbs, _memory_share(best)))
    return out


def format_table(batches: Sequence[Sequence[AblationStep]]) -> list[str]:
    """The ablation table: per step, the mean step time over batches, its ratio to the
    baseline, DIP's figure and ratio, the largest peak per GPU, whether every batch fits, and
    the mean host seconds the step took to plan and simulate."""
    lines = [
        f"{'step':<34}{'SEMU s':>9}{'speedup':>9}{'DIP s':>8}{'DIP x':>7}"
        f"{'peak GiB':>10}{'fits':>6}{'host s':>8}  memory"
    ]
    n = len(batches)
    mean = {
        name: sum(b[i].step_time_s for b in batches) / n
        for i, (name, _, _) in enumerate(DIP_TABLE5_S)
    }
    base = mean["megatron"]
    for i, (name, label, dip_s) in enumerate(DIP_TABLE5_S):
        rows = [b[i] for b in batches]
        peak = max(max(r.peak_memory_bytes) for r in rows) / GIB
        fits = all(r.fits for r in rows)
        memory = rows[0].memory if len({r.memory for r in rows}) == 1 else "varies"
        if rows[0].peak_without_recompute_bytes is not None:
            worst = max(max(r.peak_without_recompute_bytes or (0.0,)) for r in rows) / GIB
            memory += f" (peak without: {worst:.1f} GiB)"
        wall = sum(r.wall_s for r in rows) / n
        lines.append(
            f"{label:<34}{mean[name]:>9.3f}{base / mean[name]:>8.2f}x{dip_s:>8.2f}"
            f"{DIP_TABLE5_S[0][2] / dip_s:>6.2f}x{peak:>10.1f}{'yes' if fits else 'NO':>6}"
            f"{wall:>8.1f}  {memory}"
        )
    return lines

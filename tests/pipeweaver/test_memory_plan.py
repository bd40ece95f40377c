# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Phases 2 and 3 under a memory limit: the greedy's hard limit, the memory ILP against brute
force, and every planned schedule through the static checker and SEMU's own memory replay."""

from __future__ import annotations

import functools
import itertools
import random

import pytest

from megatron.mllm.arguments import ONE_REPLICA
from megatron.mllm.config_files import flag_argv, run_from_flags, set_flags
from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.interleave import flops_durations, greedy_dual_queue
from pipeweaver.ir import Kind, Memory, ScheduleError
from pipeweaver.placement import Placement
from pipeweaver.search.memory_limit import GIB, memory_limit_bytes
from pipeweaver.search.memory_plan import Candidate, StrategyCosts, plan_memory, select_candidates
from pipeweaver.semu.batches import MicrobatchMeta, SubBatch
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.timing import ComputeCost

FLAGS = {
    "num-layers": 4,
    "hidden-size": 64,
    "num-attention-heads": 4,
    "seq-length": 256,
    "max-position-embeddings": 256,
    "vocab-size": 512,
    "vision-num-layers": 4,
    "vision-patch-size": 4,
    "audio-num-layers": 0,
    "micro-batch-size": 1,
    "hidden-dropout": 0,
    "attention-dropout": 0,
    "pipeline-model-parallel-size": 2,
}


@functools.cache
def _semu_spec():
    return run_from_flags(flag_argv(set_flags(FLAGS)), ONE_REPLICA).semu


def _cluster():
    return ClusterSpec.from_json({"device": "h100-sxm", "num_devices": 2, "devices_per_node": 8})


def _instance(m: int, seed: int):
    """P = 2, vision and LLM interleaved over both ranks (one chunk each per rank), ``m``
    microbatches of random sizes, one vision sub each."""
    rng = random.Random(seed)
    pl = Placement.interleaved(2, {"vision": 4, "llm": 4}, {})
    mbs = []
    for _ in range(m):
        units = tuple(rng.choice((16, 32, 64)) for _ in range(rng.randint(1, 2)))
        llm = rng.choice((60, 120, 200))
        mbs.append(MicrobatchMeta((llm,), llm, {"vision": (SubBatch(units, len(units) * 8),)}))
    st = MicrobatchStructure(m, {"vision": (1,) * m})
    return pl, st, mbs


TOY_LAYERS = 4
"""Layers per chunk in the toy costs: first-n candidates for n = 1, 2, 3."""


def _toy_cost(seed: int, offload: bool):
    """Analytic costs of every strategy, with pair sizes drawn per seed: recompute keeps a
    tenth and pays the forward again; offload keeps a twentieth and pays a transfer; selective
    keeps three quarters and pays half a time unit; the first n of 4 layers keep their inputs
    (a sixteenth of a layer's bytes each) and everything of the others, pay n quarters of the
    forward again and rebuild one layer at a time (dyadic fractions: exact sums)."""
    rng = random.Random(seed)
    sizes: dict = {}

    def cost(a) -> ComputeCost:
        key = a.key if a.kind is Kind.F else a.key.partner()
        key = key.with_memory(Memory.NONE)
        if key not in sizes:
            sizes[key] = (rng.randint(2, 9), rng.randint(10, 40))  # time unit, bytes
        t, full = sizes[key]
        if a.memory is Memory.RECOMPUTE:
            if a.kind is Kind.F:
                return ComputeCost(t, full // 10, 0.0)
            return ComputeCost(3 * t, 0.0, full)
        if a.memory is Memory.OFFLOAD and offload:
            return ComputeCost(t + 1.5 if a.kind is Kind.F else 2 * t + 1.5, full // 20, full)
        if a.memory is Memory.SELECTIVE:
            return ComputeCost(t if a.kind is Kind.F else 2 * t + 0.5, full * 0.75, 0.0)
        if a.memory is Memory.LAYERS:
            n, layer = a.recompute_layers, full / TOY_LAYERS
            if a.kind is Kind.F:
                return ComputeCost(t, (TOY_LAYERS - n) * layer + n * layer / 16, 0.0)
            return ComputeCost(2 * t + t * n / TOY_LAYERS, 0.0, layer)
        return ComputeCost(t if a.kind is Kind.F else 2 * t, full, 0.0)

    return cost


def _strategies(memories) -> list[tuple[Memory, int]]:
    """The oracle's strategies: every memory, first-n for each n of the toy chunk's layers."""
    out = []
    for m in memories:
        out += [(m, n) for n in range(1, TOY_LAYERS)] if m is Memory.LAYERS else [(m, 0)]
    return out


def _peak(computes, choice, cost) -> float:
    """The oracle's memory walk: kept bytes of the pairs alive plus the compute's transient."""
    alive, kept, peak = 0.0, {}, 0.0
    for a in computes:
        f = a.key if a.kind is Kind.F else a.key.partner()
        c = cost(a.with_memory(*choice[f]))
        if a.kind is Kind.F:
            kept[f] = c.kept_bytes
            alive += c.kept_bytes
            peak = max(peak, alive + c.transient_bytes)
        else:
            peak = max(peak, alive + c.transient_bytes)
            alive -= kept.pop(f)
    return peak


def _brute_force(computes, strategies, cost, limit=None):
    """``(least compute time within the limit, least peak)`` over every assignment of
    strategies to the rank's pairs (time None when nothing fits)."""
    pairs = [a.key for a in computes if a.kind is Kind.F]
    index = {f: p for p, f in enumerate(pairs)}
    options = _strategies(strategies)
    # The same walk as _peak's, on each pair's costs per strategy looked up once (every
    # assignment is walked: hundreds of thousands on the larger instances).
    table = [
        [(cost(f.with_memory(*s)), cost(f.partner().with_memory(*s))) for s in options]
        for f in pairs
    ]
    walk = [(index[a.key if a.kind is Kind.F else a.key.partner()], a.kind is Kind.F)
            for a in computes]  # fmt: skip
    best, least_peak = None, None
    for combo in itertools.product(range(len(options)), repeat=len(pairs)):
        alive = peak = t = 0.0
        for p, forward in walk:
            cf, cb = table[p][combo[p]]
            if forward:
                alive += cf.kept_bytes
                peak = max(peak, alive + cf.transient_bytes)
                t += cf.time_s
            else:
                peak = max(peak, alive + cb.transient_bytes)
                alive -= cf.kept_bytes
                t += cb.time_s
        least_peak = peak if least_peak is None else min(least_peak, peak)
        if limit is None or peak > limit:
            continue
        best = t if best is None else min(best, t)
    return best, least_peak


@pytest.mark.parametrize(
    "m,seed,offload", [(2, 0, False), (3, 1, False), (2, 2, True), (3, 3, True)]
)
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.7])
def test_memory_ilp_equals_brute_force(m, seed, offload, fraction):
    """Limits between the least peak any choice reaches (fraction 0: exactly it) and the peak
    with nothing recomputed."""
    pl, st, _ = _instance(m, seed)
    cost = _toy_cost(seed, offload)
    sched = greedy_dual_queue(pl, st, lambda a: cost(a).time_s)
    strategies = (Memory.NONE, Memory.SELECTIVE, Memory.LAYERS, Memory.RECOMPUTE)
    strategies += (Memory.OFFLOAD,) if offload else ()
    none = {a.key: (Memory.NONE, 0) for r in range(2) for a in sched.computes(r)}
    limits = []
    for r in range(2):
        least = _brute_force(sched.computes(r), strategies, cost)[1]
        limits.append(least + fraction * (_peak(sched.computes(r), none, cost) - least))
    costs = StrategyCosts(cost, lambda a: TOY_LAYERS)
    exact = plan_memory(sched, costs, limits, strategies=strategies, gap=0.0)
    loose = plan_memory(sched, costs, limits, strategies=strategies)
    used = set()
    for r in range(2):
        computes = sched.computes(r)
        best = _brute_force(computes, strategies, cost, limits[r])[0]
        assert exact.predicted_time_s[r] == pytest.approx(best, rel=1e-9)
        assert best <= loose.predicted_time_s[r] <= best * 1.05 + 1e-9
        chosen = {f: (m, exact.recompute_layers.get(f, 0)) for f, m in exact.choices.items()}
        assert exact.peak_bytes[r] == _peak(computes, chosen, cost) <= limits[r]
        used |= {a.strategy for a in exact.schedule.computes(r)}
    if fraction:
        assert used - {"none"}, "a limit under the peak makes some pair save memory"
    for plan in (exact, loose):
        # Both halves of a pair carry the choice; the lowered schedule passes the checker.
        for r in range(2):
            for a in plan.schedule.computes(r):
                f = a.key if a.kind is Kind.F else a.key.partner()
                assert a.memory is plan.choices[f]
                assert a.recompute_layers == plan.recompute_layers.get(f, 0)
        check(plan.schedule, memory_cap=limits, activation_bytes=lambda a: cost(a).kept_bytes)


def test_semu_costs_plan_fits_and_matches_semu_replay():
    """SEMU's own costs at PP=2: the plan under 60% of the greedy's peak recomputes some
    pairs (some of them only their first layers), not all; SEMU's replay of the planned schedule peaks exactly where the plan says,
    and the rank's compute time is the plan's."""
    spec = _semu_spec()
    pl, st, mbs = _instance(4, 7)
    semu = Semu(spec, _cluster(), reuse=False)
    sched = greedy_dual_queue(pl, st, flops_durations(spec.shape, pl, mbs))
    base = semu.simulate_pipeline(sched, mbs)
    limits = [0.6 * p for p in base.peak_activation]
    plan = plan_memory(sched, StrategyCosts.from_semu(semu, pl, mbs), limits)
    res = semu.simulate_pipeline(plan.schedule, mbs)
    assert res.peak_activation == pytest.approx(list(plan.peak_bytes), rel=1e-12)
    assert all(p <= lim for p, lim in zip(res.peak_activation, limits))
    assert res.busy == pytest.approx(list(plan.predicted_time_s), rel=1e-12)
    used = set(plan.choices.values())
    assert Memory.NONE in used and Memory.LAYERS in used
    # The first-n candidates pay off: no slower than choosing between keeping all and
    # recomputing the whole chunk only (both proven optimal).
    costs = StrategyCosts.from_semu(semu, pl, mbs)
    new = plan_memory(sched, costs, limits, gap=0.0)
    old = plan_memory(sched, costs, limits, strategies=(Memory.NONE, Memory.RECOMPUTE), gap=0.0)
    assert all(n <= o * (1 + 1e-12) for n, o in zip(new.predicted_time_s, old.predicted_time_s))
    assert sum(new.predicted_time_s) < sum(old.predicted_time_s)
    kept = semu.activation_bytes(pl, mbs)
    check(plan.schedule, memory_cap=limits, activation_bytes=kept)
    # Over the limit: the same order with nothing recomputed is rejected by the checker.
    with pytest.raises(ScheduleError, match="over the cap"):
        check(sched, memory_cap=limits, activation_bytes=kept)


def test_a_limit_below_the_most_frugal_choice_is_rejected_naming_the_rank():
    pl, st, _ = _instance(3, 1)
    cost = _toy_cost(1, False)
    sched = greedy_dual_queue(pl, st, lambda a: cost(a).time_s)
    strategies = (Memory.NONE, Memory.RECOMPUTE)
    least = [_brute_force(sched.computes(r), strategies, cost)[1] for r in range(2)]
    # Rank 1 fits with its least peak, rank 0 gets one byte less than its own.
    with pytest.raises(ScheduleError, match=r"^rank 0: .*over the rank's memory limit") as e:
        plan_memory(sched, StrategyCosts(cost), [least[0] - 1, least[1]])
    assert e.value.rank == 0 and f"needs {least[0]:.0f} bytes" in str(e.value)
    plan = plan_memory(sched, StrategyCosts(cost), least)
    assert list(plan.peak_bytes) == least


@pytest.mark.parametrize("m,seed", [(3, 4), (6, 5)])
def test_greedy_hard_limit_is_respected_and_exact_at_the_boundary(m, seed):
    """The hard limit: the schedule passes the checker with the limit as its cap; the least
    limit it accepts is the largest microbatch's kept bytes on a rank (a microbatch's first
    backward needs all its forwards), and one byte less is rejected naming the rank."""
    pl, st, _ = _instance(m, seed)
    cost = _toy_cost(seed, False)
    dur = lambda a: cost(a).time_s  # noqa: E731
    kept = lambda a: cost(a).kept_bytes  # noqa: E731
    free = greedy_dual_queue(pl, st, dur)
    peak = check(free, activation_bytes=kept).peak_activation_bytes
    # The soft mode is unchanged by the new argument's default.
    assert greedy_dual_queue(pl, st, dur, memory_limit=None).actions == free.actions
    need = [0.0, 0.0]
    for r in range(2):
        per_mb = [0.0] * m
        for a in free.computes(r):
            if a.kind is Kind.F:
                per_mb[a.microbatch] += kept(a)
        need[r] = max(per_mb)
    for limits in ([max(0.7 * p, n) for p, n in zip(peak, need)], need):
        s = greedy_dual_queue(pl, st, dur, memory_limit=limits, activation_bytes=kept)
        report = check(s, memory_cap=limits, activation_bytes=kept)
        assert all(p <= lim for p, lim in zip(report.peak_activation_bytes, limits))
    with pytest.raises(ScheduleError, match=r"^rank 1 .*over the rank's memory limit") as e:
        greedy_dual_queue(pl, st, dur, memory_limit=[need[0], need[1] - 1], activation_bytes=kept)
    assert e.value.rank == 1 and f"{need[1]:.0f} activation bytes" in str(e.value)


def test_memory_limit_bytes_from_flag_device_and_cpu():
    static = [{"weights": 2.0, "gradients": 4.0, "optimizer": 8.0, "params": 1.0}, 10.0]
    assert memory_limit_bytes(100.0, static) == [86.0, 90.0]
    assert memory_limit_bytes(100.0, static, flag_gb=1.0) == [GIB - 14.0, GIB - 10.0]
    assert memory_limit_bytes(None, static, flag_gb=2.0) == [2 * GIB - 14.0, 2 * GIB - 10.0]
    assert memory_limit_bytes(None, static) == [None, None]  # CPU without the flag
    with pytest.raises(ScheduleError, match=r"^rank 1: .* 10 bytes"):
        memory_limit_bytes(10.0, [1.0, 10.0])
    with pytest.raises(ScheduleError, match="--pipeline-memory-limit-gb must be > 0"):
        memory_limit_bytes(None, static, flag_gb=0.0)


def test_candidates_keep_the_fastest_the_most_frugal_and_one_per_bucket():
    rng = random.Random(3)
    # A Pareto front (time falls as memory grows) plus dominated points.
    front = [Candidate(Memory.NONE, 1.0, 10.0 - k, float(k), 0.0, 0.0) for k in range(30)]
    dominated = [Candidate(Memory.NONE, 2.0, 10.0 - k, float(k) + 0.5, 0.0, 0.0)
                 for k in range(30)]  # fmt: skip
    pool = front + dominated
    rng.shuffle(pool)
    kept = select_candidates(pool, 10)
    assert len(kept) == 10 and all(c in front for c in kept)
    assert min(front, key=lambda c: c.time_s) in kept  # fastest
    assert min(front, key=lambda c: c.kept_bytes) in kept  # most frugal
    # Sorted by kept bytes, most first; each of the 8 buckets between holds one.
    assert [c.kept_bytes for c in kept] == sorted((c.kept_bytes for c in kept), reverse=True)
    inner = sorted(c.kept_bytes for c in kept)[1:-1]
    assert [int(b / (29 / 8)) for b in inner] == list(range(8))
    assert select_candidates(front[:4], 10) == sorted(front[:4], key=lambda c: -c.kept_bytes)

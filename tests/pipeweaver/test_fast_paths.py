# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The incremental greedy scheduler, lowering and checker give exactly what the scanning ones
gave (the oracles in ``reference_*.py``, the code before issue 13), on random instances:
the same schedules, the same reports, the same error messages."""

from __future__ import annotations

import random

import reference_checker
import reference_interleave
import reference_lowering

from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure, all_computes, consumers, data_flow, data_inputs
from pipeweaver.fuzz import random_invalid_schedule, random_valid_schedule
from pipeweaver.interleave import greedy_dual_queue
from pipeweaver.ir import Memory
from pipeweaver.lowering import lower
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule
from pipeweaver.search.segments import SegmentSpace, order_priority


def _instance(rng: random.Random) -> tuple[Placement, MicrobatchStructure]:
    p = rng.randint(1, 4)
    layers = {"vision": rng.randint(p, 3 * p), "audio": rng.randint(p, 2 * p)}
    if rng.random() < 0.3:
        del layers["audio"]
    layers["llm"] = rng.randint(p, 3 * p)
    chunks = {m: rng.randint(1, max(1, min(2, n // p))) for m, n in layers.items()}
    m = rng.randint(1, 6)
    subs = {e: tuple(rng.randint(0, 3) for _ in range(m)) for e in layers if e != "llm"}
    return Placement.interleaved(p, layers, chunks), MicrobatchStructure(m, subs)


def _outcome(fn, *args, **kwargs) -> str:
    """The result as text, or the error's type and message."""
    try:
        return str(fn(*args, **kwargs))
    except Exception as e:  # the oracle and the fast path must fail alike
        return f"{type(e).__name__}: {e}"


def test_data_flow_equals_the_per_compute_rules_on_random_instances():
    # data_flow assembles steps from shared per-microbatch pieces: each entry must still be
    # what data_inputs and consumers say, in all_computes' order.
    rng = random.Random(5)
    for _ in range(120):
        placement, structure = _instance(rng)
        flow = data_flow(placement, structure)
        computes = tuple(all_computes(placement, structure))
        assert flow.computes == computes
        assert list(flow.inputs) == list(computes) == list(flow.outputs)
        for a in computes:
            assert flow.inputs[a] == tuple(data_inputs(a, placement, structure))
            assert flow.outputs[a] == tuple(consumers(a, placement, structure))


def test_greedy_dual_queue_equals_the_scanning_oracle_on_random_instances():
    rng = random.Random(13)
    kinds = set()
    for _ in range(120):
        placement, structure = _instance(rng)
        times = {}  # equal durations are frequent: ties must break alike

        def duration(a, times=times):
            return times.setdefault(a.key, float(rng.choice([1, 2, 2.5, 3])))

        def kept(a):
            return 1.0 + a.chunk + a.sub

        kw = {"p2p_time": rng.choice([0.0, 0.5]), "memory": rng.choice(list(Memory))}
        case = rng.choice(["plain", "soft cap", "hard limit", "order priority"])
        kinds.add(case)
        if case == "soft cap":
            kw.update(memory_cap=rng.choice([2.0, 5.0]), activation_bytes=kept)
        elif case == "hard limit":
            kw.update(memory_limit=rng.choice([6.0, 12.0, 40.0]), activation_bytes=kept)
        elif case == "order priority":
            groups = list(SegmentSpace(placement, structure).groups)
            rng.shuffle(groups)
            kw["priority"] = order_priority(groups)
        want = _outcome(
            reference_interleave.greedy_dual_queue, placement, structure, duration, **kw
        )
        got = _outcome(greedy_dual_queue, placement, structure, duration, **kw)
        assert got == want, (case, kw)
    assert kinds == {"plain", "soft cap", "hard limit", "order priority"}


def test_lowering_equals_the_oracle_on_random_orders_and_broken_ones():
    rng = random.Random(7)
    for n in range(80):
        placement, structure = _instance(rng)
        order = [
            list(r) for r in random_valid_schedule(placement, structure, rng).compute_only().actions
        ]
        if n % 3 == 1:  # a compute missing: its consumers' inputs are not scheduled
            r = rng.choice([r for r in range(len(order)) if order[r]])
            order[r].pop(rng.randrange(len(order[r])))
        elif n % 3 == 2:  # a compute twice
            r = rng.choice([r for r in range(len(order)) if order[r]])
            order[r].insert(rng.randrange(len(order[r]) + 1), rng.choice(order[r]))
        schedule = Schedule(placement, structure, tuple(tuple(o) for o in order))
        assert _outcome(lower, schedule) == _outcome(reference_lowering.lower, schedule)


def _report(fn, schedule, **kw) -> str:
    try:
        r = fn(schedule, **kw)
        return f"{r.num_actions} {r.rounds} {r.peak_activation_bytes}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def test_checker_equals_the_oracle_on_random_valid_and_invalid_schedules():
    rng = random.Random(3)
    failures = 0
    for n in range(120):
        placement, structure = _instance(rng)
        if n % 2:
            schedule = random_valid_schedule(placement, structure, rng)
        else:
            schedule, _ = random_invalid_schedule(placement, structure, rng)
        kw = {}
        if n % 4 == 1:
            kw = {"memory_cap": rng.choice([3, 10, 100]), "activation_bytes": lambda a: 1 + a.chunk}
        want = _report(reference_checker.check, schedule, **kw)
        assert _report(check, schedule, **kw) == want
        failures += want.startswith("ScheduleError")
    assert failures >= 60  # every invalid schedule, and some over the cap


def test_checker_reports_the_same_with_and_without_the_lowerings_guarantee():
    # A schedule lower() made from a complete order on the chunks' ranks is checked without
    # confirming its comms again; the same actions in a new Schedule (no guarantee) are checked
    # in full: same report, same error, also for orders whose computes break the rules
    # (shuffled ranks, mismatched memory strategies) and orders lower() cannot vouch for.
    from pipeweaver.lowering import COMMS_BY_CONSTRUCTION

    rng = random.Random(11)
    vouched = 0
    for n in range(120):
        placement, structure = _instance(rng)
        order = [
            list(r) for r in random_valid_schedule(placement, structure, rng).compute_only().actions
        ]
        r = rng.randrange(len(order))
        if n % 4 == 1:
            rng.shuffle(order[r])
        elif n % 4 == 2 and order[r]:
            i = rng.randrange(len(order[r]))
            memory = rng.choice(list(Memory))  # a first-n strategy needs its layer count
            order[r][i] = order[r][i].with_memory(memory, 1 if memory is Memory.LAYERS else 0)
        elif n % 4 == 3 and len(order) > 1 and order[r]:  # a compute off its chunk's rank
            order[(r + 1) % len(order)].append(order[r].pop())
        try:
            lowered = lower(Schedule(placement, structure, tuple(tuple(o) for o in order)))
        except Exception:
            continue
        vouched += getattr(lowered, COMMS_BY_CONSTRUCTION, False)
        anew = Schedule(placement, structure, lowered.actions)
        assert not getattr(anew, COMMS_BY_CONSTRUCTION, False)
        assert (
            _report(check, lowered)
            == _report(check, anew)
            == _report(reference_checker.check, anew)
        )
    assert vouched >= 60


def test_the_collector_comes_back_only_after_the_last_overlapping_pause():
    # Two threads' simulations overlap (A enters, B enters, A leaves, B leaves): the collector
    # stays off until B leaves, then is on again, as it was before A.
    import gc
    import threading

    from pipeweaver.semu.reuse import collector_paused

    assert gc.isenabled()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with collector_paused():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with collector_paused():
            b_in.set()
            a_out.wait(10)
            seen["after a left"] = gc.isenabled()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"after a left": False}
    assert gc.isenabled()

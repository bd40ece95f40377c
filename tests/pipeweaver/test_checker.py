# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Generated schedules pass the static checker; hand-made invalid ones are rejected."""

from __future__ import annotations

import itertools

import pytest

from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure, all_computes
from pipeweaver.generators import (
    dataflow,
    interleaved_one_f_one_b,
    megatron_schedule_table,
    no_pipelining,
    one_f_one_b,
)
from pipeweaver.ir import Comm, Compute, Memory, ScheduleError
from pipeweaver.lowering import lower
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule

LAYERS = {"vision": 4, "audio": 2, "llm": 8}


def _structure(m: int, with_subs: bool) -> MicrobatchStructure:
    if not with_subs:
        return MicrobatchStructure.uniform(m, {"vision": 1, "audio": 1})
    # 0, 1 and several subs per encoder, varying over microbatches.
    return MicrobatchStructure(
        m,
        {
            "vision": tuple((mb * 7) % 4 for mb in range(m)),
            "audio": tuple(mb % 2 for mb in range(m)),
        },
    )


def _all_computes_once(s: Schedule) -> None:
    ran = sorted(a.key for rank in s.actions for a in rank if isinstance(a, Compute))
    assert ran == sorted(all_computes(s.placement, s.structure))


@pytest.mark.parametrize("p,m,subs", itertools.product([1, 2, 3, 4], [1, 2, 5, 8], [False, True]))
def test_1f1b_passes(p, m, subs):
    s = one_f_one_b(Placement.baseline(p, LAYERS), _structure(m, subs))
    check(s)
    _all_computes_once(s)
    if p == 1:
        check(no_pipelining(Placement.baseline(1, LAYERS), _structure(m, subs)))


@pytest.mark.parametrize(
    "p,k,m,subs", itertools.product([2, 4], [2, 3], [3, 4, 5, 6, 8, 12], [False, True])
)
def test_interleaved_passes(p, k, m, subs):
    layers = dict(LAYERS, llm=p * k * 2)
    pl = Placement.baseline(p, layers, k)
    if m < p or 0 < m % p < p:
        with pytest.raises(ScheduleError, match="P="):
            interleaved_one_f_one_b(pl, _structure(m, subs))
        return
    s = interleaved_one_f_one_b(pl, _structure(m, subs))
    check(s)
    _all_computes_once(s)


@pytest.mark.parametrize(
    "p,m,k,subs", itertools.product([1, 2, 3, 4], [1, 3, 6], [1, 2], [False, True])
)
def test_dataflow_any_placement_passes(p, m, k, subs):
    layers = {"vision": 2 * p * k, "audio": p, "llm": 2 * p * k}
    pl = Placement.interleaved(p, layers, {"vision": k, "llm": k})
    s = dataflow(pl, _structure(m, subs), memory=Memory.RECOMPUTE)
    check(s)
    _all_computes_once(s)


def test_megatron_schedule_table_matches_its_docstring_example():
    # megatron-core's comment: PP2 N3M5 with VP2 -> microbatch 0 1 2 0 1 2 3 4 3 4.
    table = megatron_schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_1f1b_warmup_matches_megatron():
    s = one_f_one_b(Placement.baseline(4, {"llm": 4}), MicrobatchStructure(6))
    for r in range(4):
        kinds = [a.kind.value for a in s.computes(r)]
        warm = kinds.index("B")
        assert warm == min(4 - r - 1, 6) + 1  # warm-up forwards, then one steady forward


def _small():
    """P=2, one LLM chunk per rank, one microbatch: the smallest pipelined schedule."""
    pl = Placement.baseline(2, {"llm": 2})
    return pl, MicrobatchStructure(1)


def test_valid_hand_written_schedule():
    pl, st = _small()
    s = Schedule.from_strings(pl, st, ["l0F0 s1:l0F0 r1:l1B0 l0B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"])
    check(s)
    assert s.actions == lower(s.compute_only()).actions


def _rejection(ranks: list[str], match: str | None = None) -> ScheduleError:
    """What the checker says of the two-rank schedule ``ranks`` (it must reject it)."""
    pl, st = _small()
    with pytest.raises(ScheduleError, match=match) as e:
        check(Schedule.from_strings(pl, st, ranks))
    return e.value


def test_missing_recv_is_rejected():
    err = _rejection(["l0F0 s1:l0F0 r1:l1B0 l0B0", "l1F0 l1B0 s0:l1B0"])
    assert err.rank == 1 and err.index == 0 and err.action == "l1F0"
    assert "no receive" in str(err) and "'l1F0'" in str(err)


def test_cyclic_wait_is_rejected():
    # Rank 0 waits for the gradient before sending the activation rank 1 needs to produce it.
    err = _rejection(["l0F0 r1:l1B0 s1:l0F0 l0B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"], "deadlock")
    assert err.rank == 0 and err.action == "r1:l1B0"
    assert "rank 1 at action 0 'r0:l0F0'" in str(err)


def _swap_first_two(s: Schedule, rank: int, sends: bool) -> tuple[Schedule, int]:
    """``s`` with ``rank``'s first two sends (or receives) swapped, and the first's index."""
    actions = [list(a) for a in s.actions]
    comms = [k for k, a in enumerate(actions[rank]) if isinstance(a, Comm) and a.is_send == sends]
    i, j = comms[0], comms[1]
    actions[rank][i], actions[rank][j] = actions[rank][j], actions[rank][i]
    return Schedule(s.placement, s.structure, tuple(tuple(a) for a in actions)), i


def test_swapped_send_order_is_rejected():
    pl = Placement.baseline(2, {"llm": 2})
    s = one_f_one_b(pl, MicrobatchStructure(3))
    bad, i = _swap_first_two(s, 0, sends=True)  # s1:l0F1 now precedes l0F1's ... and s1:l0F0
    with pytest.raises(ScheduleError) as e:
        check(bad)
    assert e.value.rank == 0 and e.value.index == i and e.value.action == "s1:l0F1"
    # Sends of tensors in produced order but received out of order: a FIFO mismatch.
    bad, _ = _swap_first_two(s, 1, sends=False)
    with pytest.raises(ScheduleError) as e:
        check(bad)
    assert "no receive" in str(e.value) or "match in order" in str(e.value)


def test_compute_before_its_dependency_is_rejected():
    err = _rejection(
        ["l0B0 l0F0 s1:l0F0 r1:l1B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"], "before its forward"
    )
    assert (err.rank, err.index, err.action) == (0, 0, "l0B0")
    pl2 = Placement.baseline(1, {"vision": 1, "llm": 1})
    st2 = MicrobatchStructure(1, {"vision": (1,)})
    s2 = Schedule.from_strings(pl2, st2, ["l0F0 v0F0.0 l0B0 v0B0.0"])
    with pytest.raises(ScheduleError, match="runs before v0F0.0") as e:
        check(s2)
    assert e.value.action == "l0F0"


def test_structural_errors_name_the_action():
    pl, st = _small()
    cases = {
        "placed on rank 1": ["l0F0 s1:l0F0 r1:l1B0 l0B0 l1F0", "r0:l0F0 l1F0 l1B0 s0:l1B0"],
        "missing": ["l0F0 s1:l0F0 r1:l1B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"],
        "already ran": ["l0F0 l0F0 s1:l0F0 r1:l1B0 l0B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"],
        "sent to rank 1 twice": ["l0F0 s1:l0F0 s1:l0F0 r1:l1B0 l0B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"],
        "no matching send": ["l0F0 r1:l1B0 l0B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"],
        "before the compute": ["s1:l0F0 l0F0 r1:l1B0 l0B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"],
        "no microbatch 1": ["l0F1 l0F0 s1:l0F0 r1:l1B0 l0B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"],
        "one strategy": ["l0F0+r s1:l0F0 r1:l1B0 l0B0", "r0:l0F0 l1F0 l1B0 s0:l1B0"],
        "uses memory strategy layers1, this backward layers2": [
            "l0F0+l1 s1:l0F0 r1:l1B0 l0B0+l2",
            "r0:l0F0 l1F0 l1B0 s0:l1B0",
        ],
        "uses memory strategy selective, this backward none": [
            "l0F0 s1:l0F0 r1:l1B0 l0B0",
            "r0:l0F0 l1F0+s l1B0 s0:l1B0",
        ],
    }
    for needle, ranks in cases.items():
        with pytest.raises(ScheduleError, match=needle):
            check(Schedule.from_strings(pl, st, ranks))


def test_per_layer_strategies_pass_when_paired():
    pl, st = _small()
    ranks = ["l0F0+l1 s1:l0F0 r1:l1B0 l0B0+l1", "r0:l0F0 l1F0+s l1B0+s s0:l1B0"]
    kept = {"layers": 3, "selective": 7}
    report = check(Schedule.from_strings(pl, st, ranks), activation_bytes=lambda a: kept[a.memory])
    assert report.peak_activation_bytes == [3, 7]


def test_memory_cap_and_rendezvous():
    pl = Placement.baseline(2, {"llm": 2})
    s = one_f_one_b(pl, MicrobatchStructure(4))
    report = check(s, activation_bytes=lambda a: 10)
    assert report.peak_activation_bytes == [20, 10]  # 1F1B keeps P - r microbatches
    check(s, memory_cap=25, activation_bytes=lambda a: 10, static_bytes=[5, 5])
    with pytest.raises(ScheduleError, match="over the cap") as e:
        check(s, memory_cap=25, activation_bytes=lambda a: 10, static_bytes=[6, 0])
    assert e.value.rank == 0 and e.value.action == "l0F1"
    # A blocking-send runtime would deadlock on 1F1B's crossing sends; the checker says so.
    with pytest.raises(ScheduleError, match="deadlock"):
        check(s, semantics="rendezvous")

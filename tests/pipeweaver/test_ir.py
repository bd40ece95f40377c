# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The schedule IR: string form, placement, data flow, schedules as JSON."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeweaver.dataflow import MicrobatchStructure, consumers, dependencies
from pipeweaver.generators import one_f_one_b
from pipeweaver.ir import Comm, CommOp, Compute, Kind, Memory, ScheduleError, parse, parse_actions
from pipeweaver.placement import ChunkPlacement, Placement, split_layers
from pipeweaver.schedule import Schedule

computes = st.builds(
    lambda module, chunk, kind, mb, sub, mem, layers: Compute(
        module, chunk, kind, mb, 0 if module == "llm" else sub, mem,
        layers if mem is Memory.LAYERS else 0,
    ),
    st.sampled_from(["vision", "audio", "llm"]),
    st.integers(0, 99),
    st.sampled_from([Kind.F, Kind.B]),
    st.integers(0, 999),
    st.integers(0, 50),
    st.sampled_from(list(Memory)),
    st.integers(1, 40),
)  # fmt: skip


@st.composite
def comms(draw):
    tensor = draw(computes).key
    part = None
    if tensor.module == "llm" and tensor.chunk == 0 and tensor.kind is Kind.B:
        part = (draw(st.sampled_from(["vision", "audio"])), draw(st.integers(0, 9)))
    return Comm(draw(st.sampled_from(list(CommOp))), draw(st.integers(0, 63)), tensor, part)


@given(st.one_of(computes, comms()))
@settings(max_examples=200, deadline=None)
def test_string_round_trip(action):
    assert parse(str(action)) == action
    assert str(parse(str(action))) == str(action)


def test_string_examples():
    assert parse("v1F3.0") == Compute("vision", 1, Kind.F, 3, 0)
    assert parse("l0B2") == Compute("llm", 0, "B", 2)
    assert parse("l0B2+r").memory is Memory.RECOMPUTE
    assert parse("a2F0.1+o").memory is Memory.OFFLOAD
    assert parse("s1:v1F3.0") == Comm(CommOp.SEND, 1, Compute("vision", 1, Kind.F, 3, 0))
    c = parse("r0:l0B2@v.1")
    assert c.op is CommOp.RECV and c.peer == 0 and c.part == ("vision", 1)
    assert str(Compute("llm", 3, Kind.F, 7)) == "l3F7"
    assert str(Compute("audio", 0, Kind.B, 7, 2, Memory.RECOMPUTE)) == "a0B7.2+r"


def test_per_layer_strategies_print_parse_and_pair():
    s = parse("l0B2+s")
    assert s.memory is Memory.SELECTIVE and s.recompute_layers == 0 and str(s) == "l0B2+s"
    f = parse("v1F3.0+l2")
    assert f == Compute("vision", 1, Kind.F, 3, 0, Memory.LAYERS, 2) and str(f) == "v1F3.0+l2"
    assert f.strategy == "layers2" and s.strategy == "selective"
    # Both halves carry the layer count; the key drops it, and the count tells pairs apart.
    assert f.partner() == Compute("vision", 1, Kind.B, 3, 0, Memory.LAYERS, 2)
    assert f.partner().partner() == f
    assert f.key == Compute("vision", 1, Kind.F, 3, 0) and s.key == Compute("llm", 0, Kind.B, 2)
    assert f != f.with_memory(Memory.LAYERS, 1) and len({f, f.with_memory("layers", 1)}) == 2
    assert f.with_memory(Memory.SELECTIVE) == parse("v1F3.0+s")
    assert Comm(CommOp.SEND, 1, f).tensor == f.key
    with pytest.raises(ScheduleError, match="recompute_layers must be"):
        Compute("llm", 0, Kind.F, 0, memory=Memory.LAYERS)
    with pytest.raises(ScheduleError, match="applies to memory strategy layers only"):
        Compute("llm", 0, Kind.F, 0, memory=Memory.RECOMPUTE, recompute_layers=2)


@pytest.mark.parametrize(
    "bad",
    ["", "x0F1", "l0F", "l0X1", "v1F3.0+z", "s:l0F1", "q1:l0F1", "l0F1.2", "l0F1+l", "l0F1+l0",
     "l0F1+s2", "l0F1+r1"],
)  # fmt: skip
def test_parse_rejects(bad):
    with pytest.raises(ScheduleError):
        parse(bad)


def test_comm_drops_memory_and_checks_parts():
    c = Comm(CommOp.SEND, 1, Compute("llm", 0, Kind.F, 0, memory=Memory.RECOMPUTE))
    assert c.tensor.memory is Memory.NONE
    with pytest.raises(ScheduleError, match="parts"):
        Comm(CommOp.SEND, 1, Compute("llm", 0, Kind.B, 0))
    with pytest.raises(ScheduleError, match="parts"):
        Comm(CommOp.SEND, 1, Compute("llm", 1, Kind.B, 0), ("vision", 0))


def test_split_layers_and_placements():
    assert split_layers(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(ScheduleError):
        split_layers(3, 4)
    base = Placement.baseline(4, {"vision": 6, "audio": 0, "llm": 8})
    assert base.encoders == ("vision",)
    assert base.chunks["vision"] == (ChunkPlacement(0, 0, 6),)
    assert [base.rank_of("llm", j) for j in range(4)] == [0, 1, 2, 3]
    assert base.layer_range("llm", 2) == (4, 6)
    vpp = Placement.baseline(2, {"llm": 8}, llm_chunks_per_rank=2)
    assert [vpp.rank_of("llm", j) for j in range(4)] == [0, 1, 0, 1]
    dip = Placement.interleaved(2, {"vision": 8, "audio": 4, "llm": 8}, {"vision": 2})
    assert dip.num_chunks("vision") == 4 and dip.num_chunks("audio") == 2
    assert [dip.rank_of("vision", j) for j in range(4)] == [0, 1, 0, 1]
    assert dip.chunks_on(1) == [("vision", 1), ("vision", 3), ("audio", 1), ("llm", 1)]
    with pytest.raises(ScheduleError, match="contiguous"):
        Placement(1, {"llm": (ChunkPlacement(0, 0, 2), ChunkPlacement(0, 3, 4))})
    with pytest.raises(ScheduleError, match="rank 5"):
        Placement(2, {"llm": (ChunkPlacement(5, 0, 2),)})


def test_dependencies_follow_the_data_flow():
    pl = Placement.interleaved(2, {"vision": 4, "audio": 2, "llm": 4}, {})
    st_ = MicrobatchStructure(2, {"vision": (2, 0), "audio": (1, 1)})
    deps = dependencies(Compute("llm", 0, Kind.F, 0), pl, st_)
    assert set(deps) == {
        Compute("vision", 1, Kind.F, 0, 0),
        Compute("vision", 1, Kind.F, 0, 1),
        Compute("audio", 1, Kind.F, 0, 0),
    }
    # microbatch 1 has no vision units: only audio feeds the LLM.
    assert dependencies(Compute("llm", 0, Kind.F, 1), pl, st_) == (
        Compute("audio", 1, Kind.F, 1, 0),
    )
    assert dependencies(Compute("vision", 1, Kind.B, 0, 1), pl, st_) == (
        Compute("vision", 1, Kind.F, 0, 1),
        Compute("llm", 0, Kind.B, 0),
    )
    assert dependencies(Compute("llm", 1, Kind.B, 0), pl, st_) == (Compute("llm", 1, Kind.F, 0),)
    assert dependencies(Compute("vision", 0, Kind.F, 0, 1), pl, st_) == ()
    parts = {p for _, p in consumers(Compute("llm", 0, Kind.B, 0), pl, st_)}
    assert parts == {("vision", 0), ("vision", 1), ("audio", 0)}
    with pytest.raises(ScheduleError, match="no sub 0"):
        dependencies(Compute("vision", 0, Kind.F, 1, 0), pl, st_)
    with pytest.raises(ScheduleError, match="no chunk 2"):
        dependencies(Compute("audio", 2, Kind.F, 0, 0), pl, st_)


def test_schedule_json_round_trip_and_text():
    pl = Placement.baseline(2, {"vision": 2, "llm": 4})
    st_ = MicrobatchStructure(3, {"vision": (1, 0, 2)})
    s = one_f_one_b(pl, st_)
    again = Schedule.from_json(s.to_json())
    assert again.actions == s.actions and again.placement == s.placement
    lines = s.format().splitlines()
    assert lines[0].startswith("rank 0: v0F0.0 l0F0 s1:l0F0")
    assert (
        Schedule.from_strings(pl, st_, [line.split(": ", 1)[1] for line in lines]).actions
        == s.actions
    )
    assert parse_actions("l0F0 s1:l0F0") == [Compute("llm", 0, Kind.F, 0), parse("s1:l0F0")]

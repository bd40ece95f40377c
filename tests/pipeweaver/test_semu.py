# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU: analytic cases and invariants (never wall time), reuse, traces."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron.mllm.arguments import ONE_REPLICA
from megatron.mllm.config_files import flag_argv, run_from_flags, set_flags
from orchestration.calibration import Calibration, LayerTimeModel
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec
from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.generators import dataflow, generate, interleaved_one_f_one_b, one_f_one_b
from pipeweaver.ir import Kind
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import MicrobatchMeta, SubBatch, step_microbatches, structure_of
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.model import ModelSpec
from pipeweaver.semu.reuse import ReuseCache
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.timing import ComputeCost, TimeModel
from pipeweaver.semu.trace import chrome_trace, summary, write_png

CPU_FLAGS = {
    "num-layers": 4,
    "hidden-size": 64,
    "num-attention-heads": 4,
    "seq-length": 256,
    "max-position-embeddings": 256,
    "vocab-size": 512,
    "vision-num-layers": 2,
    "vision-patch-size": 4,
    "audio-num-layers": 2,
    "audio-feature-dim": 32,
    "workload-token-scale": 0.03125,
    "micro-batch-size": 2,
    "global-batch-size": 16,
    "hidden-dropout": 0,
    "attention-dropout": 0,
}


@functools.cache
def _parsed(flags: tuple[tuple[str, Any], ...]) -> ModelSpec:
    return run_from_flags(flag_argv(set_flags(dict(flags))), ONE_REPLICA).semu


def model_spec(flags: dict[str, Any]) -> ModelSpec:
    """SEMU's spec of trainer flags, read by the trainer's parser as one model replica
    (TP x PP processes: these tests simulate without a cluster config). Cached, as a parse
    costs a fraction of a second and the specs are frozen."""
    return _parsed(tuple(sorted(flags.items())))


def _cluster(n: int, free_comm: bool = False, device: str = "h100-sxm") -> ClusterSpec:
    obj = {"device": device, "num_devices": n, "devices_per_node": 8}
    if free_comm:
        obj["device_overrides"] = {
            "intra_node_bandwidth": 1e30,
            "inter_node_bandwidth": 1e30,
            "intra_node_latency_s": 0.0,
            "inter_node_latency_s": 0.0,
        }
    return ClusterSpec.from_json(obj)


def _uniform_mbs(m: int, llm=(100,), enc=None) -> list[MicrobatchMeta]:
    enc = enc or {}
    return [MicrobatchMeta(tuple(llm), sum(llm), enc, 1.0) for _ in range(m)]


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 5), (4, 8), (4, 3), (8, 16)])
@pytest.mark.parametrize("f,b", [(1.0, 2.0), (1.0, 1.0), (0.3, 0.7)])
def test_1f1b_uniform_bubble_closed_form(p, m, f, b):
    """Equal F and B on every stage, free communication: bubble = (p-1)/(m+p-1) exactly."""
    spec = model_spec(
        {**CPU_FLAGS, "vision-num-layers": 0, "audio-num-layers": 0, "num-layers": 2 * p,
         "pipeline-model-parallel-size": p}  # fmt: skip
    )

    def const(_placement, a, _mb):
        return ComputeCost(f if a.kind is Kind.F else b, 0.0, 0.0)

    semu = Semu(spec, _cluster(p, free_comm=True), compute_cost_fn=const)
    pl = Placement.baseline(p, spec.layers())
    s = one_f_one_b(pl, MicrobatchStructure(m))
    res = semu.simulate_pipeline(s, _uniform_mbs(m))
    assert res.makespan == pytest.approx((m + p - 1) * (f + b), rel=1e-12)
    assert res.bubble_ratio == pytest.approx((p - 1) / (m + p - 1), rel=1e-12, abs=1e-15)
    # The compute-only order simulates to the same timeline as the lowered one.
    res2 = Semu(spec, _cluster(p, free_comm=True), compute_cost_fn=const).simulate_pipeline(
        s.compute_only(), _uniform_mbs(m)
    )
    assert res2.makespan == res.makespan and res2.rank_end == res.rank_end


def test_no_cross_rank_dependencies_take_the_max_of_per_rank_sums():
    """PP = 1, DP = 3: independent ranks; the pipeline part is the slowest rank's sum."""
    spec = model_spec(CPU_FLAGS)
    semu = Semu(spec, _cluster(3, free_comm=True))
    gen = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=5, token_scale=1 / 32)
    enc = list(spec.shape.encoders)
    mbs = step_microbatches(gen.sample, 0, 3, 2, 2, enc)
    pl = Placement.baseline(1, spec.layers())
    scheds = [generate("none", pl, structure_of(x, enc)) for x in mbs]
    res = semu.simulate_step(scheds, mbs)
    sums = []
    for sched, x in zip(scheds, mbs):
        sums.append(
            sum(semu.compute_cost(pl, a, x[a.microbatch]).time_s for a in sched.computes(0))
        )
    assert res.breakdown["pipeline"] == pytest.approx(max(sums), rel=1e-12)
    assert res.critical_replica == max(range(3), key=sums.__getitem__)
    assert res.bubble_ratio == pytest.approx(0.0, abs=1e-12)


mb_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(1, 300), min_size=1, max_size=3),  # LLM sample lengths
        st.lists(st.integers(1, 200), min_size=1, max_size=3),  # vision units of sub 0
        st.lists(st.integers(1, 200), min_size=1, max_size=2),  # audio units of sub 0
    ),
    min_size=2,
    max_size=5,
)


def _metas(raw):
    return [
        MicrobatchMeta(
            tuple(llm),
            sum(llm),
            {
                "vision": (SubBatch(tuple(v), max(1, sum(v) // 4)),),
                "audio": (SubBatch(tuple(a), len(a)),),
            },
            0.0,
        )
        for llm, v, a in raw
    ]


@given(mb_strategy, st.integers(0, 2), st.integers(0, 4), st.integers(1, 50), st.booleans())
@settings(max_examples=60, deadline=None)
def test_more_work_never_predicts_less_time(raw, which, mb_pick, extra, calibrated):
    spec = model_spec({**CPU_FLAGS, "pipeline-model-parallel-size": 2})
    cal = None
    if calibrated:
        table = LayerTimeModel(1e-4, 2e-6, 1e-9, 2.0, 1e-7, per_sequence_s=5e-5)
        cal = Calibration("test", {"vision": table, "llm": table}, host={"stage_s": 1e-4})
    semu = Semu(spec, _cluster(2, device="cpu"), cal, reuse=False)
    mbs = _metas(raw)
    pl = Placement.baseline(2, spec.layers())
    sched = one_f_one_b(pl, structure_of(mbs, ["vision", "audio"]))
    base = semu.simulate_step(sched, [mbs]).step_time_s
    i = mb_pick % len(mbs)
    mb = mbs[i]
    if which == 0:  # a longer LLM sample
        lens = (mb.llm_seq_lens[0] + extra,) + mb.llm_seq_lens[1:]
        bigger = dataclasses.replace(mb, llm_seq_lens=lens)
    elif which == 1:  # one more vision unit
        sub = mb.encoders["vision"][0]
        bigger = dataclasses.replace(
            mb, encoders={**mb.encoders, "vision": (SubBatch(sub.units + (extra,), sub.rows + 1),)}
        )
    else:  # a longer audio unit
        sub = mb.encoders["audio"][0]
        units = (sub.units[0] + extra,) + sub.units[1:]
        bigger = dataclasses.replace(
            mb, encoders={**mb.encoders, "audio": (SubBatch(units, sub.rows),)}
        )
    mbs2 = mbs[:i] + [bigger] + mbs[i + 1 :]
    assert semu.simulate_step(sched, [mbs2]).step_time_s >= base


def _omni_step(pp: int, dp: int, schedule: str, sub_tokens=None):
    flags = {**CPU_FLAGS, "pipeline-model-parallel-size": pp, "global-batch-size": 8 * dp,
             "vision-num-layers": max(2, pp), "audio-num-layers": max(2, pp)}  # fmt: skip
    spec = model_spec(flags)
    cluster = _cluster(pp * dp)
    gen = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=3, token_scale=1 / 32)
    enc = list(spec.shape.encoders)
    m = spec.training.num_microbatches(dp)
    pad = 256 * 2 if pp > 1 else None
    mbs = step_microbatches(gen.sample, 1, dp, 2, m, enc, pad, 256, sub_tokens,
                            lambda s: sum(spec.shape.sample_phase_flops(s).values()))  # fmt: skip
    if schedule == "dataflow":
        pl = Placement.interleaved(pp, spec.layers(), {})
    else:
        pl = Placement.baseline(pp, spec.layers())
    scheds = [generate(schedule, pl, structure_of(x, enc)) for x in mbs]
    return spec, cluster, scheds, mbs


@pytest.mark.parametrize(
    "pp,dp,schedule,subs",
    [(1, 2, "none", None), (2, 1, "1f1b", None), (2, 2, "1f1b", 1), (2, 1, "dataflow", 8),
     (4, 1, "dataflow", None)],  # fmt: skip
)
def test_reuse_changes_no_result(pp, dp, schedule, subs):
    spec, cluster, scheds, mbs = _omni_step(pp, dp, schedule, subs)
    plain = Semu(spec, cluster, reuse=False).simulate_step(scheds, mbs).to_json(with_events=True)
    plain.pop("reuse", None)
    shared = ReuseCache()
    for run in range(3):  # cold, then warm caches shared by new simulator instances
        semu = Semu(spec, cluster, cache=shared)
        got = semu.simulate_step(scheds, mbs).to_json(with_events=True)
        got.pop("reuse")
        assert got == plain
        if run == 0:  # spatial reuse inside one step: equal chunks and shapes
            assert shared.hits["subgraph"] > 0
    assert shared.hits["timeline"] >= 2 * dp  # temporal: the same step again
    # Another cost model sharing the cache never hits the first one's entries.
    other_flags = {**CPU_FLAGS, "hidden-size": 128, "pipeline-model-parallel-size": pp}
    other_flags["global-batch-size"] = 8 * dp
    other = Semu(model_spec(other_flags), cluster, cache=shared)
    before = shared.hits["timeline"]
    other.simulate_step(scheds, mbs)
    assert shared.hits["timeline"] == before


def test_interleaved_and_memory_figures():
    spec = model_spec({**CPU_FLAGS, "pipeline-model-parallel-size": 2, "bf16": True})
    pl = Placement.baseline(2, spec.layers(), llm_chunks_per_rank=2)
    mbs = _uniform_mbs(4, llm=(200, 56), enc={"vision": (SubBatch((64, 64), 32),)})
    sched = interleaved_one_f_one_b(pl, structure_of(mbs, ["vision", "audio"]))
    check(sched)
    semu = Semu(spec, _cluster(2))
    res = semu.simulate_step(sched, [mbs])
    assert len(res.peak_memory_bytes) == 2
    for r in range(2):
        s = res.static_bytes[r]
        assert res.peak_memory_bytes[r] == pytest.approx(
            s["weights"] + s["gradients"] + s["optimizer"] + res.peak_activation_bytes[r]
        )
        assert s["weights"] == pytest.approx(2 * s["params"])  # bf16
        assert s["optimizer"] == pytest.approx(12 * s["params"])  # fp32 master + Adam moments
    total = sum(s["params"] for s in res.static_bytes)
    assert total == pytest.approx(spec.shape.total_params())
    assert 0 < res.mfu < 1 and 0 <= res.bubble_ratio < 1


def test_chrome_trace_and_png(tmp_path):
    spec, cluster, scheds, mbs = _omni_step(2, 1, "1f1b")
    res = Semu(spec, cluster).simulate_step(scheds, mbs)
    tr = chrome_trace(res)
    text = json.dumps(tr)
    obj = json.loads(text)
    assert isinstance(obj["traceEvents"], list) and obj["traceEvents"]
    for e in obj["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0 and "cat" in e
    names = {e["name"] for e in obj["traceEvents"]}
    assert {"l0F0", "l1B0", "optimizer"} <= names
    png = tmp_path / "t.png"
    write_png(res, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "step time" in summary(res)


def test_png_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    spec, cluster, scheds, mbs = _omni_step(2, 1, "1f1b")
    res = Semu(spec, cluster).simulate_step(scheds, mbs)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'orchweave\[plots\]'"):
        write_png(res, tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()


def test_reuse_across_replicas_with_shared_microbatches():
    """Equal microbatches inside different step structures (regression: graph ids)."""
    spec = model_spec({**CPU_FLAGS, "pipeline-model-parallel-size": 2})
    a = MicrobatchMeta((100,), 100, {"vision": (SubBatch((16,), 4),)}, 1.0, 1)
    b = MicrobatchMeta((80,), 80, {"audio": (SubBatch((30,), 8),)}, 1.0, 1)
    c = MicrobatchMeta((60, 20), 80, {}, 1.0, 2)
    replicas = [[a, b, a], [a, c, b], [c, a, a]]
    pl = Placement.baseline(2, spec.layers())
    for name in ("1f1b", "dataflow"):
        scheds = [generate(name, pl, structure_of(x, ["vision", "audio"])) for x in replicas]
        for compute_only in (False, True):
            sc = [s.compute_only() for s in scheds] if compute_only else scheds
            plain = Semu(spec, _cluster(6), reuse=False).simulate_step(sc, replicas).to_json(True)
            got = Semu(spec, _cluster(6)).simulate_step(sc, replicas).to_json(True)
            plain.pop("reuse"), got.pop("reuse")
            assert got == plain


def test_comm_and_compute_cost_formulas():
    from pipeweaver.semu.timing import CommModel, TimeModel

    cl = _cluster(16)
    comm = CommModel(cl)
    dev, eff = cl.device, cl.efficiency
    bw_in, bw_out = (
        dev.intra_node_bandwidth * eff.intra_node,
        dev.inter_node_bandwidth * eff.inter_node,
    )
    assert comm.p2p(1e6, True) == pytest.approx(dev.intra_node_latency_s + 1e6 / bw_in)
    assert comm.p2p(1e6, False) == pytest.approx(dev.inter_node_latency_s + 1e6 / bw_out)
    assert comm.all_reduce(1e9, 1, True) == 0.0
    ar = comm.all_reduce(8e8, 8, True)
    assert ar == pytest.approx(14 * dev.intra_node_latency_s + 2 * 7 / 8 * 8e8 / bw_in)
    assert comm.reduce_scatter(8e8, 8, True) == pytest.approx(ar / 2)
    # All-to-all: 16 devices over 2 nodes; traffic to the other node rides the NIC.
    inside = [[1e6 if (i // 8 == j // 8 and i != j) else 0.0 for j in range(16)] for i in range(16)]
    across = [[1e6 if i // 8 != j // 8 else 0.0 for j in range(16)] for i in range(16)]
    assert comm.all_to_all(inside) == pytest.approx(7e6 / bw_in + dev.intra_node_latency_s)
    assert comm.all_to_all(across) == pytest.approx(8e6 / bw_out + dev.inter_node_latency_s)
    # Any matrix: each device's busier direction, its node's peers and the others' bytes summed
    # apart (a loop over the peers is the oracle; the vectorised sums add in the same order).
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(2, 40))
        m = rng.random((n, n)) * 1e7 * (rng.random((n, n)) < 0.4)
        ranks = sorted(rng.choice(16, n, replace=False).tolist()) if n <= 16 else None
        r = ranks or list(range(n))
        worst = 0.0
        for i in range(n):
            for row in (m[i], m[:, i]):
                intra = inter = 0.0
                for j in range(n):
                    if j != i and cl.node_of(r[i]) == cl.node_of(r[j]):
                        intra += row[j]
                    elif j != i:
                        inter += row[j]
                t_in = intra / bw_in + (dev.intra_node_latency_s if intra else 0)
                t_out = inter / bw_out + (dev.inter_node_latency_s if inter else 0)
                worst = max(worst, t_in, t_out)
        assert comm.all_to_all(m, ranks) == worst
        assert comm.all_to_all(m.tolist(), ranks) == worst
    # Stage costs: roofline, TP collectives, recompute, offload.
    spec = model_spec({**CPU_FLAGS, "bf16": True})
    cm = TimeModel(spec, cl)
    f = cm.compute_cost("llm", 1, 3, "F", "none", [200, 56])
    b = cm.compute_cost("llm", 1, 3, "B", "none", [200, 56])
    br = cm.compute_cost("llm", 1, 3, "B", "recompute", [200, 56])
    fr = cm.compute_cost("llm", 1, 3, "F", "recompute", [200, 56])
    assert br.time_s == pytest.approx(b.time_s + f.time_s)
    assert fr.kept_bytes < f.kept_bytes and br.transient_bytes == pytest.approx(f.kept_bytes)
    off = cm.compute_cost("llm", 1, 3, "F", "offload", [200, 56])
    assert off.time_s > f.time_s and off.kept_bytes < f.kept_bytes
    w = cm.costs.compute_work("llm", 1, 3, "F", "none", [200, 56])
    expected = max(w.linear_flops / cm.flops_rate, w.linear_bytes / cm.memory_rate) + max(
        w.attention_flops / cm.attention_rate, w.attention_bytes / cm.memory_rate
    )
    assert f.time_s == pytest.approx(expected)
    tp2 = TimeModel(model_spec({**CPU_FLAGS, "bf16": True, "tensor-model-parallel-size": 2}), cl)
    f2 = tp2.compute_cost("llm", 1, 3, "F", "none", [200, 56])
    w2 = tp2.costs.compute_work("llm", 1, 3, "F", "none", [200, 56])
    assert w2.tp_collectives == 4 and w2.linear_flops == pytest.approx(w.linear_flops / 2)
    assert f2.time_s > 0


def test_balancer_traffic_and_memory_cap_from_costs():
    spec, cluster, scheds, mbs = _omni_step(1, 2, "none")
    semu = Semu(spec, cluster)
    base = semu.simulate_step(scheds, mbs)
    moved = semu.simulate_step(
        scheds, mbs, balancer_bytes={"vision": 1e9, "llm": [[0, 5e8], [5e8, 0]]}
    )
    a2a = 2 * semu.cost.comm.all_to_all_total(1e9, 2, True) + 2 * semu.cost.comm.all_to_all(
        [[0, 5e8], [5e8, 0]], [0, 1]
    )
    assert moved.breakdown["a2a"] == pytest.approx(a2a)
    assert moved.step_time_s == pytest.approx(base.step_time_s + a2a)
    # The checker's memory cap with the cost description's activation bytes.
    spec, cluster, scheds, mbs = _omni_step(2, 1, "1f1b")
    semu = Semu(spec, cluster)
    sched, mb = scheds[0], mbs[0]
    kept = semu.activation_bytes(sched.placement, mb)
    static = [
        int(s["weights"] + s["gradients"] + s["optimizer"])
        for s in semu.static_bytes(sched.placement)
    ]
    report = check(sched, activation_bytes=kept, static_bytes=static)
    res = semu.simulate_step(sched, [mb])
    assert report.peak_activation_bytes[1] == pytest.approx(res.peak_activation_bytes[1], rel=1e-6)
    with pytest.raises(Exception, match="over the cap"):
        check(sched, memory_cap=static[0] + report.peak_activation_bytes[0] - 1,
              activation_bytes=kept, static_bytes=static)  # fmt: skip


def test_compute_only_and_lowered_orders_simulate_alike():
    """Encoders interleaved over all ranks, several subs: LLM chunk 0's gradient goes back in
    parts over the same links; both forms of the schedule give the same timeline."""
    spec = model_spec({**CPU_FLAGS, "pipeline-model-parallel-size": 2, "vision-num-layers": 4})
    pl = Placement.interleaved(2, spec.layers(), {"vision": 2})
    mbs = [
        MicrobatchMeta((120, 30), 150, {"vision": (SubBatch((16, 16), 8), SubBatch((64,), 16)),
                                       "audio": (SubBatch((50,), 25),)}, 1.0, 2),  # fmt: skip
        MicrobatchMeta((90,), 90, {"vision": (SubBatch((32,), 8),)}, 1.0, 1),
        MicrobatchMeta((60,), 60, {"audio": (SubBatch((40,), 20), SubBatch((10,), 5))}, 1.0, 1),
    ]
    sched = dataflow(pl, structure_of(mbs, ["vision", "audio"]))
    check(sched)
    semu = Semu(spec, _cluster(2, device="cpu"), reuse=False)
    lowered = semu.simulate_pipeline(sched, mbs)
    plain = semu.simulate_pipeline(sched.compute_only(), mbs)
    assert lowered.events == plain.events and lowered.peak_activation == plain.peak_activation


@pytest.mark.parametrize("calibrated", [False, True])
def test_per_pair_strategies_cost_what_the_runs_recompute_flags_cost(calibrated):
    """A pair's selective or first-n recompute is the run's ``--recompute-*`` flags applied to
    that pair alone: the same time and memory as ``none`` under those flags."""
    plain = {**CPU_FLAGS, "num-layers": 8}
    flags = {
        "selective": {"recompute-granularity": "selective"},
        "layers3": {"recompute-granularity": "full", "recompute-method": "block",
                    "recompute-num-layers": 3},
    }  # fmt: skip
    cal = None
    if calibrated:
        t = LayerTimeModel(1e-4, 1e-7, 1e-9, 2.0, 1e-5, act_bytes_per_token=300.0,
                           act_bytes_per_token_sq=2.0)  # fmt: skip
        cal = Calibration("cpu", {"llm": t})
    cl = _cluster(8)
    cm = TimeModel(model_spec(plain), cl, cal)
    seqs = [200, 56]
    costs = {}
    for memory, extra in flags.items():
        run = TimeModel(model_spec({**plain, **extra}), cl, cal)
        for kind in "FB":
            mine = cm.compute_cost("llm", 1, 7, kind, memory, seqs)
            assert mine == run.compute_cost("llm", 1, 7, kind, "none", seqs), (memory, kind)
            costs[memory, kind] = mine
    for n in (1, 2, 3, 5):
        costs[f"layers{n}", "F"] = cm.compute_cost("llm", 1, 7, "F", f"layers{n}", seqs)
        costs[f"layers{n}", "B"] = cm.compute_cost("llm", 1, 7, "B", f"layers{n}", seqs)
    for memory in ("none", "recompute"):
        for kind in "FB":
            costs[memory, kind] = cm.compute_cost("llm", 1, 7, kind, memory, seqs)
    # More layers recomputed: less kept, a longer backward; all of them beat keeping all.
    order = ["none", "layers1", "layers2", "layers3", "layers5"]
    for a, b in zip(order, order[1:]):
        assert costs[b, "F"].kept_bytes < costs[a, "F"].kept_bytes
        assert costs[b, "B"].time_s > costs[a, "B"].time_s
    assert costs["selective", "F"].kept_bytes < costs["none", "F"].kept_bytes
    assert costs["selective", "B"].time_s > costs["none", "B"].time_s
    assert costs["layers5", "F"].kept_bytes > costs["recompute", "F"].kept_bytes
    # The forward is the same forward whatever it keeps.
    assert len({round(costs[m, "F"].time_s, 15) for m in order + ["selective"]}) == 1

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU's DP communication of Megatron-FSDP and of the overlapped parameter gather
(``pipeweaver/semu/fsdp_comm.py``): hand-computed streams, the ring formula, free links."""

from __future__ import annotations

import json

import pytest

from megatron.mllm.config_files import flag_argv, run_from_flags, set_flags
from pipeweaver.generators import generate
from pipeweaver.ir import Kind
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import MicrobatchMeta, structure_of
from pipeweaver.semu.fsdp_comm import GATHER, REDUCE, UnitUse, ring_bytes_per_rank, run_stream
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.timing import ComputeCost

FLAGS = {
    "num-layers": 2, "hidden-size": 64, "num-attention-heads": 4, "seq-length": 256,
    "max-position-embeddings": 256, "vocab-size": 512, "vision-num-layers": 0,
    "audio-num-layers": 0, "micro-batch-size": 1, "hidden-dropout": 0, "attention-dropout": 0,
    "bf16": True,
}  # fmt: skip


def _spec(dp: int, sharding: str = "none", **flags):
    overrides = {"data_parallel_sharding": sharding} if sharding != "none" else None
    argv = flag_argv(set_flags({**FLAGS, **flags}))
    return run_from_flags(argv, dp, parallel_overrides=overrides).semu


def _cluster(dp: int, bw: float = 1e30) -> ClusterSpec:
    """One node; ``bw`` bytes/s over NVLink at full efficiency, no latency (1e30: free)."""
    return ClusterSpec.from_json({
        "device": "h100-sxm", "num_devices": dp, "devices_per_node": 8,
        "device_overrides": {"intra_node_bandwidth": bw, "intra_node_latency_s": 0.0},
        "efficiency": {"intra_node": 1.0},
    })  # fmt: skip


def _const(_placement, a, _mb):
    return ComputeCost(1.0 if a.kind is Kind.F else 2.0, 0.0, 0.0)


def _step(spec, cluster, **kw):
    placement = Placement.baseline(1, spec.layers())
    mb = [MicrobatchMeta((100,), 100, {}, 1.0)]
    sched = generate("none", placement, structure_of(mb, []))
    semu = Semu(spec, cluster, compute_cost_fn=_const, **kw)
    return semu, semu.simulate_step(sched, [mb] * semu.dp)


def test_two_unit_stream_by_hand():
    """Units 0 and 1 (gather 0.5 s, reduce-scatter 0.25 s): F0 0-1, F1 1-2, B1 2-4, B0 4-6.
    F0 waits its gather (0-0.5), which prefetches F1's (0.5-1.0); F1 asks at 1.5 and prefetches
    B1's (1.5-2.0); B1 at 2.5 prefetches B0's (2.5-3.0) and reduces at 4.5-4.75; B0 runs 4.5-6.5
    and reduces 6.5-6.75. Exposed: the first gather and the last reduce-scatter."""
    uses = [
        UnitUse("llm", 0, 1.0, 0.0, 1.0, False),
        UnitUse("llm", 1, 1.0, 1.0, 2.0, False),
        UnitUse("llm", 1, 1.0, 2.0, 4.0, True),
        UnitUse("llm", 0, 1.0, 4.0, 6.0, True),
    ]
    got = run_stream(uses, lambda p: 0.5 * p, lambda p: 0.25 * p)
    assert [(op.kind, op.use.layer, op.start, op.end) for op in got.ops] == [
        (GATHER, 0, 0.0, 0.5), (GATHER, 1, 0.5, 1.0), (GATHER, 1, 1.5, 2.0),
        (GATHER, 0, 2.5, 3.0), (REDUCE, 1, 4.5, 4.75), (REDUCE, 0, 6.5, 6.75),
    ]  # fmt: skip
    assert got.starts == [0.5, 1.5, 2.5, 4.5]
    assert got.shift == 0.5 and got.end == 6.75  # 6.0 of compute + 0.5 + 0.25 exposed
    # The distributed optimizer's overlapped gather: only each unit's first forward.
    dist = run_stream(uses, lambda p: 0.5 * p, None, first_forward_only=True)
    assert [(op.use.layer, op.start, op.end) for op in dist.ops] == [(0, 0.0, 0.5), (1, 0.5, 1.0)]
    assert dist.starts == [0.5, 1.5, 2.5, 4.5]


def test_orchweaves_gathers_all_issued_as_the_forward_starts_by_hand():
    """Three forwards of 1 s whose gathers take 0.1, 0.1 and 3 s. megatron-core's chain issues
    the third when the second unit's forward starts (1.1 s): it ends at 4.1 and the third
    forward waits 2 s. OrchWeave's trainer issues all three as the first forward starts: the
    third ends at 3.2, and the wait is 1.1 s."""
    uses = [UnitUse("llm", k, p, k * 1.0, k + 1.0, False) for k, p in enumerate((0.1, 0.1, 3.0))]
    chain = run_stream(uses, lambda p: p, None, first_forward_only=True)
    ahead = run_stream(uses, lambda p: p, None, first_forward_only=True, gathers_at_once=True)
    ops = [[(op.use.layer, round(op.start, 9), round(op.end, 9)) for op in s.ops]
           for s in (chain, ahead)]  # fmt: skip
    assert ops[0] == [(0, 0.0, 0.1), (1, 0.1, 0.2), (2, 1.1, 4.1)]
    assert ops[1] == [(0, 0.0, 0.1), (1, 0.1, 0.2), (2, 0.2, 3.2)]
    assert chain.starts == pytest.approx([0.1, 1.1, 4.1])
    assert ahead.starts == pytest.approx([0.1, 1.1, 3.2])


@pytest.mark.parametrize("balance,at_once", [("none", False), ("auto", True)])
def test_the_cli_gathers_as_the_trainer_it_simulates(monkeypatch, balance, at_once):
    """With --post-balance (OrchWeave's steps) the gathers go at once; Megatron's own step
    stands for upstream Megatron-LM's chain."""
    from megatron.mllm.cli import semu as semu_cli

    made = []

    def spy(*args, **kwargs):
        made.append(kwargs["gathers_at_once"])
        return Semu(*args, **kwargs)

    monkeypatch.setattr(semu_cli, "Semu", spy)
    argv = ["--model", "cpu-main", "--cluster", "cpu-2ranks", "--json", "--set",
            "use-distributed-optimizer=true", "--overlap-grad-reduce", "--overlap-param-gather",
            "--post-balance", balance]  # fmt: skip
    assert semu_cli.main(argv) == 0
    assert made == [at_once]


def test_free_links_fsdp_step_equals_the_distributed_optimizers():
    """With zero latency and unbounded bandwidth FSDP's collectives cost nothing: the step is
    the distributed optimizer's (same sharded optimizer), i.e. compute plus the optimizer."""
    fsdp, got = _step(_spec(4, "optim_grads_params"), _cluster(4))
    _, ref = _step(_spec(4, **{"use-distributed-optimizer": True}), _cluster(4))
    assert got.step_time_s == pytest.approx(ref.step_time_s, abs=1e-12)
    assert got.breakdown["pipeline"] == pytest.approx(3.0)  # F 1 s + B 2 s, no stall
    kinds = [e.category for e in got.events]
    # 2 layers: gathered before each forward and each backward, reduced after each backward.
    assert kinds.count("allgather") == 4 and kinds.count("reducescatter") == 2
    assert fsdp.dp_comm is not None


@pytest.mark.parametrize("dp", [2, 4])
def test_unit_collectives_move_the_ring_bytes(dp):
    """Each unit's all-gather moves its weight bytes / DP x (DP - 1) per rank, its
    reduce-scatter its fp32 gradient bytes / DP x (DP - 1), at the link's bandwidth."""
    bw = 1e9
    semu, got = _step(_spec(dp, "optim_grads_params"), _cluster(dp, bw))
    params = [semu.cost.costs.chunk_params("llm", i, i + 1) for i in (0, 1)]
    for e in got.events:
        if e.category not in ("allgather", "reducescatter"):
            continue
        p = params[int(e.name[-1])]
        per = 2.0 if e.category == "allgather" else 4.0  # bf16 weights, fp32 main gradients
        assert ring_bytes_per_rank(p * per, dp) == pytest.approx(p * per / dp * (dp - 1))
        assert e.end - e.start == pytest.approx(ring_bytes_per_rank(p * per, dp) / bw)


def test_exposed_comm_of_two_units_by_hand():
    """2 layers, F 1 s (0.5 s a layer), B 2 s (1 s a layer) on DP 2: every gather and
    reduce-scatter but the first gather and the last reduce-scatter hide behind a layer, so
    the step is longer than on free links by exactly those two."""
    bw = 1e8
    spec = _spec(2, "optim_grads_params")
    semu, slow = _step(spec, _cluster(2, bw))
    _, free = _step(spec, _cluster(2))
    p0 = semu.cost.costs.chunk_params("llm", 0, 1)  # with the input layer
    p1 = semu.cost.costs.chunk_params("llm", 1, 2)  # with the head
    g0, g1, r0 = p0 * 2 / 2 / bw, p1 * 2 / 2 / bw, p0 * 4 / 2 / bw
    assert max(g0, g1, p1 * 4 / 2 / bw) < 0.5  # the others hide (checked by hand above)
    loss = semu.cost.comm.all_reduce(8.0, 2, True)  # the trainer's loss all-reduce (8 bytes)
    assert slow.step_time_s - free.step_time_s == pytest.approx(g0 + r0 + loss, rel=1e-9)


def test_fsdp_peak_below_ddp_by_the_static_model():
    """Same activations; the peak differs by the static bytes: 18 B/param against 18/d, plus
    the gathered and prefetched layer."""
    _, ddp = _step(_spec(4), _cluster(4))
    _, fsdp = _step(_spec(4, "optim_grads_params"), _cluster(4))
    static = [sum(v for k, v in s.items() if k != "params") for s in ddp.static_bytes]
    sharded = [sum(v for k, v in s.items() if k != "params") for s in fsdp.static_bytes]
    assert fsdp.peak_memory_bytes[0] == pytest.approx(
        ddp.peak_memory_bytes[0] - static[0] + sharded[0]
    )
    params = ddp.static_bytes[0]["params"]
    assert static[0] == pytest.approx(18 * params)
    assert fsdp.peak_memory_bytes[0] < ddp.peak_memory_bytes[0]


def test_optim_grads_gathers_once_after_the_optimizer():
    """``optim_grads``: no gathers in the compute; the reduce-scatters in the backward and
    one all-gather of the rank's weights after the optimizer."""
    bw = 1e8
    semu, got = _step(_spec(2, "optim_grads"), _cluster(2, bw))
    _, free = _step(_spec(2, "optim_grads"), _cluster(2))
    names = [e.name for e in got.events if e.category in ("allgather", "reducescatter")]
    assert names == ["dp reduce-scatter llm1", "dp reduce-scatter llm0"]
    params = semu.cost.costs.chunk_params("llm", 0, 2)
    r0 = semu.cost.costs.chunk_params("llm", 0, 1) * 4 / 2 / bw
    gather = params * 2 / 2 / bw
    loss = semu.cost.comm.all_reduce(8.0, 2, True)
    assert got.step_time_s - free.step_time_s == pytest.approx(r0 + gather + loss, rel=1e-9)


def test_overlap_param_gather_hides_the_distributed_optimizers_gather():
    """``--overlap-param-gather``: the weights' all-gather leaves the step's tail for the
    forward, where only the first unit's gather is exposed."""
    bw = 1e8
    spec = _spec(2, **{"use-distributed-optimizer": True})
    semu, plain = _step(spec, _cluster(2, bw))
    _, over = _step(spec, _cluster(2, bw), overlap_param_gather=True)
    costs = semu.cost.costs
    whole = costs.chunk_params("llm", 0, 2) * 2 / 2 / bw
    first = costs.chunk_params("llm", 0, 1) * 2 / 2 / bw
    assert plain.step_time_s - over.step_time_s == pytest.approx(whole - first, rel=1e-9)


def test_timelines_show_the_communication_stream(tmp_path):
    """The trace puts the collectives on a thread of their own beside the compute; the PNG
    draws them."""
    from pipeweaver.semu.trace import chrome_trace, write_png

    _, got = _step(_spec(2, "optim_grads_params"), _cluster(2, 1e8))
    trace = chrome_trace(got)["traceEvents"]
    comm = [e for e in trace if e.get("ph") == "X" and e["tid"] == 1]
    assert len(comm) == 6 and {e["cat"] for e in comm} == {"allgather", "reducescatter"}
    assert any(e.get("args", {}).get("name") == "DP communication" for e in trace)
    pytest.importorskip("matplotlib")
    write_png(got, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


def test_cli_sharding_and_overlap_param_gather(capsys):
    """``tools/semu.py --data-parallel-sharding-strategy`` runs FSDP's collectives (the
    weights sharded over DP in the static bytes); ``--overlap-param-gather`` needs a sharded
    optimizer, as Megatron's."""
    from megatron.mllm.cli import semu as semu_cli

    base = ["--model", "cpu-main", "--cluster", "cpu-2ranks", "--json"]
    assert semu_cli.main([*base, "--data-parallel-sharding-strategy", "optim_grads_params"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["data_parallel_sharding"] == "optim_grads_params"
    static = out["static_bytes"][0]
    assert static["weights"] == pytest.approx(static["params"] * 4 / 2)  # fp32, DP 2
    assert semu_cli.main([*base, "--overlap-param-gather"]) == 2
    assert "--overlap-param-gather needs --use-distributed-optimizer" in capsys.readouterr().err
    # Megatron-FSDP's mesh is DP x TP of the whole world: no pipeline to simulate.
    pp2 = [*base, "--set", "pipeline-model-parallel-size=2"]
    assert semu_cli.main([*pp2, "--data-parallel-sharding-strategy", "optim_grads"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --data-parallel-sharding-strategy optim_grads: megatron-core 0.19.2's "
        "Megatron-FSDP builds its device mesh as DP x TP of the whole world, so it cannot run "
        "with --pipeline-model-parallel-size 2 (--set pipeline-model-parallel-size=1)"
    ]

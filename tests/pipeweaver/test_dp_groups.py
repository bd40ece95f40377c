# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU's DP groups with ``--num-distributed-optimizer-instances`` (HSDP, the partial
distributed optimizer; ``pipeweaver/semu/dp_groups.py``): ring times by hand, the shard's
all-reduce after the last backward only, the state sharded within a group, one error line for
what Megatron refuses."""

from __future__ import annotations

import pytest
from test_fsdp_comm import FLAGS  # the same two-layer model

from megatron.mllm.config_files import flag_argv, run_from_flags, set_flags
from pipeweaver.generators import generate
from pipeweaver.ir import Kind
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import MicrobatchMeta, structure_of
from pipeweaver.semu.dp_groups import DataParallelGroups
from pipeweaver.semu.fsdp_comm import GATHER, OUTER, REDUCE, UnitUse, run_stream
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.model import ModelConfigError
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.timing import CommModel, ComputeCost


def _two_nodes() -> ClusterSpec:
    return ClusterSpec.from_json({"device": "h100-sxm", "num_devices": 16, "devices_per_node": 8})


def test_ring_times_by_hand():
    """TP 2, DP 8 over 2 nodes of 8, 4 instances: a shard group is 2 DP ranks (4 devices, one
    node: NVLink); the 4 copies of a shard span both nodes (the NIC)."""
    cl = _two_nodes()
    comm = CommModel(cl)
    g = DataParallelGroups.for_layout(comm, 8, 4, 2, 8, sharded=True)
    assert (g.shard, g.shard_intra, g.outer_intra) == (2, True, False)
    dev, eff = cl.device, cl.efficiency
    bw_in, bw_out = (
        dev.intra_node_bandwidth * eff.intra_node,
        dev.inter_node_bandwidth * eff.inter_node,
    )
    n = 1e9
    gather = dev.intra_node_latency_s + 1 / 2 * n / bw_in
    outer = 2 * 3 * dev.inter_node_latency_s + 2 * 3 / 4 * (n / 2) / bw_out
    assert g.gather_s(n) == pytest.approx(gather) and g.reduce_scatter_s(n) == pytest.approx(gather)
    assert g.outer_all_reduce_s(n) == pytest.approx(outer)
    assert g.reduce_s(n) == pytest.approx(gather + outer)
    # One instance is the whole DP group, as without the flag.
    one = DataParallelGroups.for_layout(comm, 8, 1, 2, 8, sharded=True)
    assert one.shard == 8 and one.outer_all_reduce_s(n) == 0.0
    assert one.reduce_s(n) == comm.reduce_scatter(n, 8, False)
    assert one.all_reduce_s(n) == comm.all_reduce(n, 8, False)


def test_megatrons_refusals_name_the_flag():
    comm = CommModel(_two_nodes())
    with pytest.raises(ModelConfigError, match="instances 3 must divide the data-parallel size 8"):
        DataParallelGroups.for_layout(comm, 8, 3, 2, 8, sharded=True)
    with pytest.raises(ModelConfigError, match="instances 2 copies a sharded optimizer"):
        DataParallelGroups.for_layout(comm, 8, 2, 2, 8, sharded=False)


def test_shard_all_reduced_after_each_units_last_backward_only():
    """Two microbatches through units 0 and 1 (gather 0.5 s, reduce-scatter 0.25 s, the
    shard's all-reduce 0.125 s): every backward reduce-scatters, only the last one of each unit
    is followed by the all-reduce across the copies (megatron-core's is_last_microbatch)."""
    uses = []
    t = 0.0
    for _ in range(2):
        for layer, backward, width in ((0, False, 1.0), (1, False, 1.0), (1, True, 2.0),
                                       (0, True, 2.0)):  # fmt: skip
            uses.append(UnitUse("llm", layer, 1.0, t, t + width, backward))
            t += width
    got = run_stream(uses, lambda p: 0.5 * p, lambda p: 0.25 * p, False, lambda p: 0.125 * p)
    kinds = [(op.kind, op.use.layer) for op in got.ops if op.kind != GATHER]
    assert kinds == [(REDUCE, 1), (REDUCE, 0), (REDUCE, 1), (OUTER, 1), (REDUCE, 0), (OUTER, 0)]
    last = got.ops[-1]
    assert last.kind == OUTER and last.end - last.start == pytest.approx(0.125)
    plain = run_stream(uses, lambda p: 0.5 * p, lambda p: 0.25 * p)
    assert got.end == pytest.approx(plain.end + 0.125)  # the last all-reduce is exposed


def _step(dp: int, sharding: str, instances: int):
    overrides = {"data_parallel_sharding": sharding} if sharding != "none" else None
    flags = {**FLAGS, "num-distributed-optimizer-instances": instances}
    if sharding == "none":
        flags["use-distributed-optimizer"] = True
    spec = run_from_flags(flag_argv(set_flags(flags)), dp, parallel_overrides=overrides).semu
    cluster = ClusterSpec.from_json(
        {"device": "h100-sxm", "num_devices": dp, "devices_per_node": 4}
    )
    placement = Placement.baseline(1, spec.layers())
    mbs = [[MicrobatchMeta((100,), 100, {}, 1.0)] * 2] * dp
    sched = generate("none", placement, structure_of(mbs[0], []))

    def const(_placement, a, _mb):
        return ComputeCost(1.0 if a.kind is Kind.F else 2.0, 0.0, 0.0)

    semu = Semu(spec, cluster, compute_cost_fn=const)
    return semu.simulate_step(sched, mbs)


@pytest.mark.parametrize("sharding", ["none", "optim_grads_params"])
def test_state_sharded_within_a_group_and_copied_across(sharding):
    """DP 8, 4 instances: the optimizer states (FSDP's gradients and weights too) are split
    over the group's 2 ranks, not over 8; HSDP adds one all-reduce per unit on each rank."""
    whole, hsdp = _step(8, sharding, 1), _step(8, sharding, 4)
    a, b = whole.static_bytes[0], hsdp.static_bytes[0]
    assert a["params"] == b["params"]
    assert b["optimizer"] == pytest.approx(a["optimizer"] * 4)
    if sharding == "optim_grads_params":
        assert b["weights"] == pytest.approx(a["weights"] * 4)
        assert b["gradients"] == pytest.approx(a["gradients"] * 4)
        kinds = [e.category for e in hsdp.events]
        assert kinds.count("allreduce") - [e.category for e in whole.events].count("allreduce") == 2
    else:
        assert b["weights"] == pytest.approx(a["weights"])


def test_cli_reads_megatrons_flag_and_refuses_what_megatron_does(capsys):
    from megatron.mllm.cli import semu as semu_cli

    base = ["--model", "cpu-main", "--cluster", "cpu-2ranks", "--json"]
    assert semu_cli.main([*base, "--set", "num-distributed-optimizer-instances=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --num-distributed-optimizer-instances 2 copies a sharded optimizer: add "
        "--use-distributed-optimizer (or Megatron-FSDP's sharding)"
    ]
    fsdp = [*base, "--data-parallel-sharding-strategy", "optim_grads_params"]
    assert semu_cli.main([*fsdp, "--set", "num-distributed-optimizer-instances=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --num-distributed-optimizer-instances 3 must divide the data-parallel size 2"
    ]
    assert semu_cli.main([*fsdp, "--set", "num-distributed-optimizer-instances=2"]) == 0
    out = capsys.readouterr().out
    assert '"weights"' in out

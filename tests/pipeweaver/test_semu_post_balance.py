# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU's full OrchWeave mode and Megatron's overlapped gradient reduction.

The post-balanced steps are checked against the trainer itself: its loader (one per DP rank,
all-gathering the metadata through an in-process collective) and its balanced step objects'
planning methods give each rank's microbatches, which must be exactly SEMU's (same samples,
same order). The overlapped reduction is checked against times worked out by hand.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import numpy as np
import pytest
import torch

from megatron.mllm.cli import semu as semu_cli
from megatron.mllm.cli import semu_balance
from megatron.mllm.config_files import flag_argv, run_from_flags, set_flags
from megatron.mllm.data import BatchLoader, SyntheticTask
from megatron.mllm.steps.base import PackedStep
from megatron.mllm.steps.phase_balanced import PhaseBalancedStep
from megatron.mllm.steps.sample_balanced import SampleBalancedStep
from orchestration.cost_feedback import CostFeedback
from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.locality import group_ranks_per_node
from orchestration.microbatches import overlap_order
from orchestration.workload import SampleMeta
from orchestration.workload_spec import SampleStream
from pipeweaver.generators import generate
from pipeweaver.ir import Kind
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import MicrobatchMeta, structure_of
from pipeweaver.semu.grad_reduce import GradBucket, overlapped_reduction, rank_buckets
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.packed_baseline import pack_first_fit_decreasing
from pipeweaver.semu.scenario import build_step
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.timing import ComputeCost

FLAGS = {
    "num-layers": 4,
    "hidden-size": 64,
    "num-attention-heads": 4,
    "seq-length": 512,
    "max-position-embeddings": 512,
    "vocab-size": 512,
    "vision-num-layers": 2,
    "vision-patch-size": 4,
    "audio-num-layers": 2,
    "audio-feature-dim": 32,
    "workload": "omni-three-modality",
    "workload-token-scale": 0.03125,
    "micro-batch-size": 2,
    "global-batch-size": 24,
    "hidden-dropout": 0,
    "attention-dropout": 0,
    "post-balance": "auto",
    # Both would ask torch.distributed for the world size in the steps' constructors; neither
    # changes the plan of the first iterations (the fit starts after its warm-up).
    "no-plan-ahead": True,
    "no-cost-fit": True,
    "gpus-per-node": 2,
}


def _cluster(n: int, per_node: int = 2) -> ClusterSpec:
    return ClusterSpec.from_json({"device": "h100-sxm", "num_devices": n, "devices_per_node": 2})


class _ThreadWorld:
    """An all-gather between threads, one per DP rank (the loader's only collective)."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list = [None] * world

    def gather(self, rank: int, value):
        self.barrier.wait()
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class _ThreadDispatcher(Dispatcher):
    """The trainer's dispatcher with its all-gathers between threads instead of processes."""

    def __init__(self, world: _ThreadWorld, rank: int, gpus_per_node: int):  # no process group
        self.group, self.timers, self.group_ranks = None, None, tuple(range(world.world))
        self.rank, self.world, self._threads = rank, world.world, world
        self.node_wise = False
        self.gpus_per_node = group_ranks_per_node(self.group_ranks, gpus_per_node)
        self.bytes_moved, self.exchanges = 0, []

    def all_gather_arrays(self, local, what="array all-gather"):
        return self._threads.gather(self.rank, local.copy())

    def all_gather_strings(self, local, what="string all-gather"):
        return [s for part in self._threads.gather(self.rank, list(local)) for s in part]


def _trainer_batches(loaded, dp: int, iteration: int):
    """Every DP rank's loaded batch of ``iteration``, from the trainer's loader."""
    run, mllm = loaded.run, loaded.model
    w = run.workload
    world = _ThreadWorld(dp)
    dispatchers = [_ThreadDispatcher(world, d, run.balance.gpus_per_node) for d in range(dp)]
    task = SyntheticTask(
        vocab_size=run.vocab_size,
        num_classes=w.synthetic_num_classes,
        input_dims={n: e.input_dim for n, e in mllm.encoders.items()},
        seed=w.workload_seed,
    )
    out: list = [None] * dp

    def load(d):
        stream = SampleStream(w.workload, w.workload_seed, w.workload_token_scale)
        loader = BatchLoader(stream, task, dispatchers[d], run.micro_batch_size,
                             run.num_microbatches, run.seq_length, with_features=False,
                             encoders=tuple(mllm.encoders))  # fmt: skip
        out[d] = loader.load(iteration)

    threads = [threading.Thread(target=load, args=(d,)) for d in range(dp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, dispatchers


def _ids(microbatches) -> list[list[str]]:
    return [[s.sample_id for s in mb] for mb in microbatches]


@pytest.mark.parametrize("iteration,packed", [(0, False), (3, False), (3, True)])
def test_phase_balanced_microbatches_are_the_trainers(iteration, packed):
    """PP = 1, DP = 4: each rank's encoder units and LLM microbatches are the trainer's (with
    ``--pack-sequences``, the fewest LLM microbatches within the packing limit)."""
    dp = 4
    loaded = run_from_flags(flag_argv(set_flags({**FLAGS, "pack-sequences": packed})), dp)
    semu = Semu(loaded.semu, _cluster(dp))
    _, batches, info = semu_balance.phase_balanced_step(
        semu, loaded, None, workload=None, seed=None, token_scale=None, iteration=iteration,
        memory=None, record_events=False,
    )  # fmt: skip
    assert info["replicas_simulated"] == dp
    gathered, dispatchers = _trainer_batches(loaded, dp, iteration)
    cost_model = CostModel.build(loaded.model.shape(), None)
    moved, counts = False, []
    for d in range(dp):
        md = gathered[d].metadata
        step = PhaseBalancedStep(loaded.run, loaded.model, dispatchers[d], cost_model, None,
                                 torch.device("cpu"))  # fmt: skip
        step.num_microbatches = loaded.run.num_microbatches  # as after its first call
        plan = step.plan_for(md)
        llm = plan.phase("llm")
        mine = llm.dispatch.dst_items(d)
        samples = [(int(llm.items.sample[i]), None, None) for i in mine.tolist()]
        mb_plan = step.llm_microbatches(plan, samples, md.sample_ids)
        counts.append(len(mb_plan.microbatches))
        # The step runs them around the exchanges: those needing other ranks' encoder outputs
        # between the two halves of the others.
        home = plan.home_samples(d)
        mbs = [[samples[i][0] for i in mb] for mb in mb_plan.microbatches]
        order = overlap_order([all(s in home for s in mb) for mb in mbs])
        want = [[md.sample_ids[s] for s in mbs[i]] for part in order for i in part]
        assert batches.overlap[d] == tuple(len(part) for part in order)
        assert _ids(batches.samples[d]) == want
        # SEMU's samples are those it drew; the trainer's rank rebuilds them from the gathered
        # table: equal, but for the spec component the table does not carry.
        rebuilt = [[md.sample_meta(s) for s in mbs[i]] for part in order for i in part]
        drawn = [[dataclasses.replace(s, component=None) for s in mb] for mb in batches.samples[d]]
        assert drawn == rebuilt
        own = [s.meta.sample_id for s in gathered[d].samples]
        moved |= sorted(s for mb in want for s in mb) != sorted(own)
        for p in plan.phases:
            if p.phase == "llm":
                continue
            units = tuple(int(x) for x in p.items.tokens[p.dispatch.dst_items(d)])
            work = batches.encoder_work[d].encoders.get(p.phase, ())
            assert (work[0].units if work else ()) == units
        # The simulated microbatches are those samples, packed.
        for mb, metas in zip(batches.microbatches[d], batches.samples[d]):
            assert mb.real_tokens == sum(s.llm_tokens for s in metas)
    assert moved  # balancing moved samples: the comparison is not of the loader's order
    # Packed, every rank's LLM samples fit one microbatch here; else Megatron's count each.
    assert counts == [1 if packed else loaded.run.num_microbatches] * dp


@pytest.mark.parametrize(
    "schedule,packed", [("dynamic", False), ("1f1b", False), ("dynamic", True)]
)
def test_sample_balanced_microbatches_are_the_trainers(schedule, packed):
    """PP = 2, DP = 2: each DP group's microbatches are the trainer's whole-sample plan's (with
    ``--pack-sequences``, the fewest within the packing limit)."""
    dp, pp, iteration = 2, 2, 1
    flags = {**FLAGS, "pipeline-model-parallel-size": pp, "pack-sequences": packed}
    loaded = run_from_flags(flag_argv(set_flags(flags)), dp * pp)
    semu = Semu(loaded.semu, _cluster(dp * pp))
    held: dict = {}
    balance = semu_balance.sample_balancer(semu, loaded, None, iteration, held)
    schedules, mbs, info = build_step(loaded.semu, _cluster(dp * pp), schedule=schedule,
                                      pad=schedule == "1f1b", iteration=iteration,
                                      balance=balance)  # fmt: skip
    batches = held["batches"]
    assert mbs == batches.microbatches and len(schedules) == dp
    gathered, dispatchers = _trainer_batches(loaded, dp, iteration)
    cost_model = CostModel.build(loaded.model.shape(), None)
    moved, counts = False, []
    for d in range(dp):
        md = gathered[d].metadata
        engine = PackedStep(
            None, None, "engine", pack_limit=loaded.run.packing_limit if packed else None
        )
        step = SampleBalancedStep(engine, loaded.run, loaded.model, dispatchers[d], cost_model,
                                  None, False, torch.device("cpu"))  # fmt: skip
        plan = step.plan_for(md)
        want = step.group_microbatches(plan, md, loaded.run.num_microbatches)
        assert _ids(batches.samples[d]) == _ids(want)
        counts.append(len(want))
        assert schedules[d].structure == structure_of(mbs[d], list(loaded.semu.shape.encoders))
        moved |= plan.dispatch.moved_items > 0
    assert moved
    # Packed, each group's samples fit fewer microbatches than Megatron's count.
    assert (max(counts) < loaded.run.num_microbatches) == packed, counts
    result = semu.simulate_step(schedules, mbs, start_delay=batches.exchange_s)
    assert result.breakdown["a2a"] == pytest.approx(max(batches.exchange_s))
    assert max(batches.exchange_s) > 0


def test_cli_full_mode_and_its_errors(capsys):
    """``--post-balance`` runs both modes; flags it cannot honour are one ``error:`` line."""
    base = ["--model", "cpu-main", "--cluster", "cpu-2ranks"]
    assert semu_cli.main(base + ["--post-balance", "auto", "--json"]) == 0
    assert "per-phase post-balancing" in capsys.readouterr().out
    # The trainer overlaps the DP reduction in both modes, so SEMU simulates both.
    pp2 = ["--set", "pipeline-model-parallel-size=2", "--post-balance", "auto"]
    assert semu_cli.main(base + [*pp2, "--overlap-grad-reduce", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["overlap_grad_reduce"]
    assert semu_cli.main(base + ["--post-balance", "auto", "--replicas", "1"]) == 2
    assert "--replicas" in capsys.readouterr().err
    assert semu_cli.main(base + ["--ddp-bucket-size", "100"]) == 2
    assert "--ddp-bucket-size" in capsys.readouterr().err


def test_the_per_phase_step_reduces_buckets_during_the_encoders_backward(capsys):
    """With --overlap-grad-reduce in small buckets, the LLM's buckets reduce beside the
    encoders' backward (the trainer's grad_overlap), so less of the reduction is left after the
    step's last compute; the computes themselves are the same."""
    base = ["--model", "cpu-main", "--cluster", "cpu-2ranks", "--post-balance", "auto", "--json"]
    steps = {}
    for name, flags in {"after": [], "overlapped": ["--overlap-grad-reduce",
                                                    "--ddp-bucket-size", "20000"]}.items():  # fmt: skip
        assert semu_cli.main(base + flags) == 0
        steps[name] = json.loads(capsys.readouterr().out)
    after, overlapped = (steps[k]["breakdown"] for k in ("after", "overlapped"))
    assert overlapped["pipeline"] == pytest.approx(after["pipeline"])
    assert overlapped["allreduce_and_optimizer"] < 0.8 * after["allreduce_and_optimizer"]
    assert steps["overlapped"]["step_time_s"] < steps["after"]["step_time_s"]


def test_rank_buckets_by_hand():
    """Rank 0's first model chunk is bucketed per layer; rank 1's chunk is one bucket."""
    placement = Placement.baseline(2, {"llm": 4})

    def params(module, start, stop):
        return 10.0 * (stop - start)

    # Replica 0's last backward of chunk 0 runs 1.0-3.0, replica 1's 1.5-2.5.
    windows = [{("llm", 0): (1.0, 3.0)}, {("llm", 0): (1.5, 2.5)}]
    got = rank_buckets(placement, 0, params, windows, [3.0, 2.5], bucket_params=10)
    # Layer 1 is done halfway through each (2.0, 2.0), layer 0 at each end (3.0, 2.5).
    assert got == [GradBucket(10.0, 2.0), GradBucket(10.0, 3.0)]
    # Rank 1: one bucket of both layers; replica 1 ran no backward there: its end counts.
    windows = [{("llm", 1): (0.5, 1.5)}, {}]
    got = rank_buckets(placement, 1, params, windows, [1.5, 4.0], bucket_params=10)
    assert got == [GradBucket(20.0, 4.0)]
    # One stream: 2.0-3.0, then 3.0-4.0 (each bucket 0.1 s per parameter).
    red = overlapped_reduction([GradBucket(10.0, 2.0), GradBucket(10.0, 3.0)], lambda n: n / 10)
    assert [(r.start_s, r.end_s) for r in red] == [(2.0, 3.0), (3.0, 4.0)]
    # A bucket that is ready while the previous one still runs waits for it.
    red = overlapped_reduction([GradBucket(30.0, 1.0), GradBucket(10.0, 2.0)], lambda n: n / 10)
    assert [(r.start_s, r.end_s) for r in red] == [(1.0, 4.0), (4.0, 5.0)]


def test_overlapped_step_by_hand():
    """PP = 1, DP = 2, one microbatch (F 1 s, B 2 s) of a 4-layer LLM, a bucket per layer:
    the buckets reduce at 1.5, 2.0, 2.5 and 3.0 s into the backward, one after the other."""
    flags = {k: v for k, v in FLAGS.items() if k not in ("post-balance", "global-batch-size")}
    flags.update({"vision-num-layers": 0, "audio-num-layers": 0, "micro-batch-size": 1})
    loaded = run_from_flags(flag_argv(set_flags(flags)), 2)
    spec = loaded.semu
    bw = 1e6  # bytes/s over NVLink: reductions of a few tenths of a second
    cluster = ClusterSpec.from_json({
        "device": "h100-sxm", "num_devices": 2, "devices_per_node": 8,
        "device_overrides": {"intra_node_bandwidth": bw, "intra_node_latency_s": 0.0},
        "efficiency": {"intra_node": 1.0},
    })  # fmt: skip

    def const(_placement, a, _mb):
        return ComputeCost(1.0 if a.kind is Kind.F else 2.0, 0.0, 0.0)

    placement = Placement.baseline(1, spec.layers())
    mb = [MicrobatchMeta((100,), 100, {}, 1.0)]
    sched = generate("none", placement, structure_of(mb, []))
    off = Semu(spec, cluster, compute_cost_fn=const)
    layer = off.cost.costs.chunk_params("llm", 1, 2)
    on = Semu(spec, cluster, compute_cost_fn=const, overlap_grad_reduce=True, bucket_params=layer)
    base = off.simulate_step(sched, [mb, mb])
    over = on.simulate_step(sched, [mb, mb])
    grads = [on.cost.costs.chunk_params("llm", i, i + 1) * 4 for i in (3, 2, 1, 0)]
    # A ring all-reduce over 2 ranks without latency moves 2 (n-1)/n = 1 x the bytes.
    t = [g / bw for g in grads]
    end = 1.5 + t[0]
    end = max(end, 2.0) + t[1]
    end = max(end, 2.5) + t[2]
    end = max(end, 3.0) + t[3]
    total = sum(grads) / bw
    # Without overlap the whole reduction starts at 3.0 s; with it, the chain ends at `end`.
    assert base.step_time_s - over.step_time_s == pytest.approx(3.0 + total - max(end, 3.0))
    assert over.step_time_s < base.step_time_s


def _meta(sample_id: str, tokens: int) -> SampleMeta:
    return SampleMeta(sample_id, tokens)


def test_overlapped_exchanges_timeline_by_hand():
    """Two ranks' five runs (encoders forward, three groups of LLM microbatches, encoders
    backward): the outputs' exchange starts when the last rank posts it and runs beside the
    first group, the gradients' beside the last; node-wise, each starts where the step waits."""
    from types import SimpleNamespace

    from pipeweaver.semu.post_balance import _overlapped_starts

    def runs(*lengths):
        return [[("m", None, 0, SimpleNamespace(time_s=t))] for t in lengths]

    both = [runs(1.0, 2.0, 1.0, 1.0, 1.0), runs(2.0, 0.5, 1.0, 0.5, 1.0)]
    starts, blocked = _overlapped_starts(both, 0.0, 1.5, 1.0, overlapped=True)
    # Posted at 1.0 and 2.0: arrives at 3.5; rank 0's first group ends at 3.0, rank 1's at 2.5.
    # Gradients posted at 4.5 by both: back at 5.5; rank 1's last group ends at 5.0.
    assert starts == [[0.0, 1.0, 3.5, 4.5, 5.5], [0.0, 2.0, 3.5, 4.5, 5.5]]
    assert blocked == pytest.approx([0.5, 1.5])
    starts, blocked = _overlapped_starts(both, 0.0, 1.5, 1.0, overlapped=False)
    assert starts == [[0.0, 1.0, 4.5, 5.5, 7.5], [0.0, 2.0, 4.5, 5.5, 7.5]]
    assert blocked == pytest.approx([2.5, 3.5])
    starts, blocked = _overlapped_starts(both, 0.0, 0.0, 0.0, overlapped=True)
    assert starts == [[0.0, 1.0, 3.0, 4.0, 5.0], [0.0, 2.0, 2.5, 3.5, 4.0]]  # nothing moves
    assert blocked == [0.0, 0.0]


def test_packed_sequences_first_fit_decreasing_by_hand():
    """6 -> new, 5 -> new, 4 -> new, 3 joins 5 (8), 2 joins 6 (8); too long is an error."""
    samples = [_meta(f"s{i}", n) for i, n in enumerate([5, 3, 4, 2, 6])]
    bins = pack_first_fit_decreasing(samples, 8)
    assert [[s.sample_id for s in b] for b in bins] == [["s4", "s3"], ["s0", "s1"], ["s2"]]
    with pytest.raises(ValueError, match="'s4' has 6 LLM tokens"):
        pack_first_fit_decreasing(samples, 4)


def test_packed_baseline_runs_each_ranks_samples_once(capsys):
    """``--pad packed``: every rank's Megatron-order samples, packed, each padded to the fixed
    length; fewer microbatches than samples."""
    flags = {k: v for k, v in FLAGS.items() if k not in ("post-balance",)}
    flags.update({"pipeline-model-parallel-size": 2, "micro-batch-size": 1})
    loaded = run_from_flags(flag_argv(set_flags(flags)), 4)
    spec, cluster = loaded.semu, _cluster(4)
    semu = Semu(spec, cluster)
    hook = semu_balance.packed_baseline(semu, spec, 0)
    _, packed, info = build_step(spec, cluster, balance=hook)
    _, plain, _ = build_step(spec, cluster)
    for p, q in zip(packed, plain):
        assert sum(mb.real_tokens for mb in p) == sum(mb.real_tokens for mb in q)
        assert sum(mb.num_samples for mb in p) == sum(mb.num_samples for mb in q) == len(q)
        assert len(p) < len(q)
        assert all(sum(mb.llm_seq_lens) == spec.training.seq_length for mb in p)
    assert info["num_microbatches"] == max(len(p) for p in packed)


@pytest.mark.parametrize("node_wise", [False, True])
def test_exchange_routed_as_the_dispatcher_by_hand(node_wise):
    """4 ranks, 2 per node; rank 0 sends B bytes to rank 3 (the other node). Direct: one
    inter-node message. Node-wise: 0 -> 1 (its node's proxy for node 1), 1 -> 2 (node 1's
    rank for node 0), 2 -> 3: two NVLink hops and one network hop."""
    from orchestration.exchange_cost import PayloadBytes
    from pipeweaver.semu.post_balance import PostBalanceSetup, exchange_seconds

    flags = {k: v for k, v in FLAGS.items() if k != "post-balance"}
    spec = run_from_flags(flag_argv(set_flags(flags)), 4).semu
    intra, inter = 4e9, 1e9
    cluster = ClusterSpec.from_json({
        "device": "h100-sxm", "num_devices": 4, "devices_per_node": 2,
        "efficiency": {"intra_node": 1.0, "inter_node": 1.0},
        "device_overrides": {"intra_node_bandwidth": intra, "inter_node_bandwidth": inter,
                             "intra_node_latency_s": 0.0, "inter_node_latency_s": 0.0},
    })  # fmt: skip
    semu = Semu(spec, cluster)
    setup = PostBalanceSetup("auto", 512, PayloadBytes({}, {}), gpus_per_node=2,
                             node_wise=node_wise)  # fmt: skip
    nbytes = 8e9
    matrix = np.zeros((4, 4))
    matrix[0, 3] = nbytes
    got = exchange_seconds(semu, matrix, [0, 1, 2, 3], setup)
    want = 2 * nbytes / intra + nbytes / inter if node_wise else nbytes / inter
    assert got == pytest.approx(want)
    assert exchange_seconds(semu, np.diag([nbytes] * 4), [0, 1, 2, 3], setup) == 0.0


def _phase_plan_moves(exchange_latency_s: float | None, unit: str) -> bool:
    """Whether SEMU's per-phase plan (DP 4) moves any data, with an exchange check of this
    latency (None: no check) and the FLOPs cost model in ``unit`` (seconds: scaled)."""
    from orchestration.cost_model import CostModel as Costs
    from orchestration.exchange_cost import ExchangeCost
    from pipeweaver.semu.post_balance import gathered_metadata, phase_balanced_batches
    from pipeweaver.semu.scenario import sample_source

    dp = 4
    loaded = run_from_flags(flag_argv(set_flags(FLAGS)), dp)
    spec = loaded.semu
    semu = Semu(spec, _cluster(dp))
    setup = semu_balance.setup_of(loaded)
    if exchange_latency_s is not None:
        check = ExchangeCost(exchange_latency_s, 0.0, setup.payload)
        setup = dataclasses.replace(setup, exchange=check)
    flops = CostModel.build(loaded.model.shape(), None)
    scale = 1e-12 if unit == "seconds" else 1.0  # seconds at 1 PFLOP/s: same plan, in seconds
    costs = Costs({p: dataclasses.replace(c, linear=c.linear * scale, quadratic=c.quadratic * scale,
                                          per_output_token=c.per_output_token * scale, unit=unit)
                   for p, c in flops.phases.items()})  # fmt: skip
    m = spec.training.num_microbatches(dp)
    md, _ = gathered_metadata(sample_source(spec, None, None, None), 0, dp, 2, m)
    flops_of = lambda s: sum(spec.shape.sample_phase_flops(s).values())  # noqa: E731
    got = phase_balanced_batches(semu, md, costs, setup, m, flops_of)
    return any(not p.dispatch.moves_nothing for p in got.plan.phases)


def test_phase_plan_keeps_the_ordinary_assignment_when_exchanges_cost_more_than_the_gain():
    """The trainer's gain-versus-exchange check in SEMU's per-phase plan: an exchange far
    above any gain (an hour) keeps every phase's ordinary assignment; a free one moves data;
    costs in FLOPs skip the check, as the trainer's before its fit gives seconds."""
    assert not _phase_plan_moves(3600.0, "seconds")
    assert _phase_plan_moves(0.0, "seconds")
    assert _phase_plan_moves(None, "seconds")
    assert _phase_plan_moves(3600.0, "flops")


def test_after_the_fits_warm_up_semu_plans_with_costs_fitted_to_its_own_times():
    """--cost-fit replayed on SEMU's times (pipeweaver.semu.fitted_costs): before the warm-up
    the plan is the starting one (FLOPs); after it, the trainer's fits, fed SEMU's per-rank
    phase seconds in the trainer's order, predict those seconds, and the exchange check weighs
    each phase's gain against the fitted exchange time (here a tiny model on H100s, whose
    imbalance is worth microseconds: no phase pays for an all-to-all)."""
    from pipeweaver.semu.fitted_costs import replay_cost_fit
    from pipeweaver.semu.post_balance import phase_seconds

    dp = 4
    flags = {k: v for k, v in FLAGS.items() if k != "no-cost-fit"}
    loaded = run_from_flags(flag_argv(set_flags(flags)), dp)
    warmup = loaded.run.balance.cost_fit_warmup
    semu = Semu(loaded.semu, _cluster(dp))

    def step(iteration):
        return semu_balance.phase_balanced_step(
            semu, loaded, None, workload=None, seed=None, token_scale=None, iteration=iteration,
            memory=None, record_events=False,
        )[1:]  # fmt: skip

    cold, info = step(warmup)  # the fits have observed iterations 0 .. warmup - 2: not warm
    assert {p.unit for p in cold.plan.phases} == {"flops"} and "cost_fit" not in info
    assert cold.plan.describe_decisions() == ""
    nofit = run_from_flags(flag_argv(set_flags(FLAGS)), dp)
    same = semu_balance.phase_balanced_step(
        semu, nofit, None, workload=None, seed=None, token_scale=None, iteration=warmup,
        memory=None, record_events=False,
    )[1]  # fmt: skip
    assert _ids(same.samples[0]) == _ids(cold.samples[0]) and same.plan.digest == cold.plan.digest
    for iteration in (warmup + 2, warmup + 6):
        warm, info = step(iteration)
        assert {p.unit for p in warm.plan.phases} == {"seconds"} and "llm:" in info["cost_fit"]
        measured = phase_seconds(semu, warm)
        for p in warm.plan.phases:
            want = np.array([measured[d][p.phase] for d in range(dp)])
            np.testing.assert_allclose(p.loads_after, want, rtol=0.02)
            assert p.decision == "kept" and p.exchange_cost > 0
    # The trainer's timeline: the plan of iteration i sees the times of iterations <= i - 2.
    fit = CostFeedback.starting(CostModel.build(loaded.model.shape(), None),
                                semu_balance.setup_of(loaded).payload, 64, warmup)  # fmt: skip
    seen = []
    replay_cost_fit(semu, fit, lambda it, *a: seen.append(it) or cold, 5)
    assert (
        seen == [0, 1, 2, 3, 4] and fit.costs.state_dict()["phases"]["llm"]["last_iteration"] == 3
    )

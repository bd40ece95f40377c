# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker for test_dispatcher.py: exchanges on 4 ranks simulating 2 nodes x 2."""

import sys

import numpy as np
import torch
import torch.distributed as dist

from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.metadata import GatheredMetadata
from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.phase_plan import plan_iteration
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec

COST = CostModel.build(
    ModelShape(
        llm=TransformerShape(2, 32, 64, 4, causal=True),
        encoders={
            "vision": TransformerShape(1, 32, 64, 4),
            "audio": TransformerShape(1, 32, 64, 4),
        },
    )
)
from orchestration.metadata import PlanDigestMismatch


def rows(pairs, counts: np.ndarray) -> torch.Tensor:
    """Rows encoding (src, dst, index) of every (src, dst) block, so a misrouting is visible."""
    out = [[s, d, i, s * 1000 + d * 100 + i] for s, d in pairs for i in range(counts[s, d])]
    return torch.tensor(out, dtype=torch.float64).view(-1, 4)


def rows_for(rank: int, counts: np.ndarray) -> torch.Tensor:
    """What ``rank`` sends: its blocks in destination order."""
    return rows([(rank, d) for d in range(counts.shape[0])], counts)


def expected_for(rank: int, counts: np.ndarray) -> torch.Tensor:
    """What ``rank`` receives: every block for it, in source order."""
    return rows([(s, rank) for s in range(counts.shape[0])], counts)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    direct = Dispatcher(None)
    nodewise = Dispatcher(None, node_wise=True, gpus_per_node=2)
    rng = np.random.default_rng(0)
    for trial in range(20):
        counts = rng.integers(0, 4, size=(world, world))
        if trial == 0:
            counts[:] = 0  # nobody sends anything: every rank still joins
        if trial == 1:
            counts[:, 1] = 0  # a rank that receives nothing
        x = rows_for(rank, counts)
        want = expected_for(rank, counts)
        for disp in (direct, nodewise):
            got = disp.all_to_all(x, counts)
            assert torch.equal(got, want), (trial, rank, got, want)
        # autograd: the backward of y = exchange(x) under loss sum(w * y) returns w to its source
        for disp in (direct, nodewise):
            xg = x.clone().requires_grad_(True)
            y = disp.all_to_all(xg, counts, differentiable=True)
            w = y[:, 3:4] * 2.0 + 1.0
            (y * w.detach()).sum().backward()
            assert torch.equal(xg.grad, (x[:, 3:4] * 2.0 + 1.0).expand_as(x)), (trial, rank)
        # Packed: three parts of different dtypes and widths in one all-to-all arrive as if
        # each had travelled alone; an exchange that keeps every row home sends nothing.
        counts_b = rng.integers(0, 3, size=(world, world))
        counts_c = counts.T.copy()
        parts = [
            (x, counts),
            (rows_for(rank, counts_b)[:, 3].to(torch.int64), counts_b),
            (rows_for(rank, counts_c)[:, :2].to(torch.float32), counts_c),
        ]
        wants = [
            want,
            expected_for(rank, counts_b)[:, 3].to(torch.int64),
            expected_for(rank, counts_c)[:, :2].to(torch.float32),
        ]
        for disp in (direct, nodewise):
            before = disp.bytes_moved
            got = disp.exchange_many(parts, label="packed")
            for g, w, (sent, _) in zip(got, wants, parts):
                assert g.dtype == sent.dtype and torch.equal(g, w), (trial, rank, g, w)
            moved = sum(
                p.element_size() * int(np.prod(p.shape[1:])) * int(c.sum() - np.trace(c))
                for p, c in parts
            )  # fmt: skip
            assert disp.bytes_moved - before == moved, (trial, disp.bytes_moved - before, moved)
        # Started, overlapped with other work, then waited for: the rows that change rank
        # arrive (source order, home left out) and the home rows never travel: they are a view
        # of the rows handed in, usable before the wait.
        for disp in (direct, nodewise):
            before = disp.bytes_moved
            pending = disp.start_exchange(parts, label="started")
            homes = [pending.layout.home(p, rows) for p, (rows, _) in enumerate(parts)]
            busy = torch.randn(64, 64)
            for _ in range(20):
                busy = torch.tanh(busy @ busy)
            remote = pending.wait()
            assert pending.wait() is remote  # waiting again returns the same arrivals
            for p, (w, (sent, c), home, got) in enumerate(zip(wants, parts, homes, remote)):
                start = int(c[rank, :rank].sum())
                assert home.data_ptr() == sent[start:].data_ptr() or not home.numel()
                assert torch.equal(pending.layout.assemble(p, got, home), w), (trial, rank, p)
                assert got.shape[0] == int(c[:, rank].sum() - c[rank, rank])
            assert disp.bytes_moved - before == moved, (trial, disp.bytes_moved - before)
            assert disp.exchanges[-1][0] == "started"
        home = np.diag(counts.diagonal())
        x_home = rows_for(rank, home)
        assert direct.exchange_many([(x_home, home)])[0] is x_home
        pending = direct.start_exchange([(x_home, home)])
        assert [r.shape[0] for r in pending.wait()] == [0]  # nothing moved, nothing sent
        # Two exchanges in flight at once complete in the order they started.
        first = direct.start_exchange([(x, counts)], label="first")
        second = direct.start_exchange([(x, counts)], label="second")
        remote_want = want[want[:, 0] != rank]
        assert torch.equal(first.wait()[0], remote_want), (trial, rank)
        assert torch.equal(second.wait()[0], remote_want), (trial, rank)
    local = np.arange(rank * 3, dtype=np.int64) + 100 * rank  # ranks hold different lengths
    gathered = direct.all_gather_arrays(local)
    assert [g.tolist() for g in gathered] == [
        (np.arange(r * 3) + 100 * r).tolist() for r in range(world)
    ]
    # The metadata all-gather rebuilds the table every rank plans from, ids included, and a
    # route moves each local item's rows to its destination, in arrival order.
    gen = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=3, token_scale=0.05)
    ranks = [[(k, gen.sample(k)) for k in range(r * 5, r * 5 + 2 + r)] for r in range(world)]
    md = direct.gather_metadata(ranks[rank])
    assert md.digest() == GatheredMetadata.from_rank_samples(ranks).digest()
    assert md.sample_ids == tuple(m.sample_id for r in ranks for _, m in r)
    llm = plan_iteration(md, COST, algorithm="lpt+refine").phase("llm")
    sizes = llm.items.tokens[llm.dispatch.src_items(rank)]
    mine = [k for k, _ in ranks[rank]]
    rows = torch.tensor(np.repeat(mine, sizes), dtype=torch.float64).view(-1, 1)
    for disp in (direct, nodewise):
        got = disp.move(llm.dispatch, rows, sizes)
        order = llm.dispatch.arrival_order(rank)
        want = np.repeat(md.sample_stream[llm.items.sample[order]], llm.dispatch.rows[order])
        assert got[:, 0].tolist() == want.tolist(), (rank, got, want)
    counts = np.full((world, world), 2)
    direct.reset_counters()
    direct.all_to_all(rows_for(rank, counts), counts)
    assert direct.bytes_moved == 2 * (world * world - world) * 4 * 8
    direct.check_digest("same")
    try:
        direct.check_digest("odd" if rank == 3 else "same")
    except PlanDigestMismatch as e:
        assert "ranks [3] vs rank 0" in str(e), str(e)
        print(f"rank {rank}: mismatch detected: {e}", flush=True)
    else:
        raise AssertionError("digest mismatch not detected")
    dist.barrier()
    print(f"rank {rank}: ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker: many steps of every bucket's parameter all-gather in flight at once on one
gloo group, dispatched as ``OrderedParamGather`` does on gloo, beside compute, an all-to-all on
another group and the reductions' coalesced reduce-scatters on the same group (megatron-core's
pattern).

Usage: ``bucket_gather_worker.py STEPS``. Each step every rank writes its shard of every bucket
(as the optimizer step does), dispatches all the gathers, computes, waits for each bucket in
turn and checks every element against what each rank wrote; then it reduces gradients bucket
by bucket. It prints ``gathered STEPS steps`` on rank 0 and exits 0, else exits 1 naming the
step and bucket whose values differ.
"""

import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

from megatron.mllm.distributed import share_gloo_device
from megatron.mllm.param_gather import gathers_per_bucket, start_bucket_gathers

BUCKETS, GROUPS = 32, 32
"""Buckets of about 4,000 parameters, each its own bucket group, as megatron-core makes them for
the tests' small buckets (``--ddp-bucket-size 4000``, one optimizer instance)."""


def bucket_groups(pg) -> list:
    """Bucket groups of megatron-core's shape (what ``start_bucket_gathers`` reads) over
    ``pg``, their parameter buffers of unequal sizes."""
    rank, size = pg.rank(), pg.size()
    config = SimpleNamespace(
        use_distributed_optimizer=True, reuse_grad_buf_for_mxfp8_param_ag=False
    )
    groups = []
    for g in range(GROUPS):
        buckets = [
            SimpleNamespace(param_data=torch.zeros(size * (2000 + 32 * ((g + b) % 5))))
            for b in range(BUCKETS // GROUPS)
        ]
        groups.append(SimpleNamespace(
            ddp_config=config, buckets=buckets, param_gather_handle=None,
            param_gather_dispatched=False, intra_distributed_optimizer_instance_group=pg,
            intra_distributed_optimizer_instance_size=size,
            intra_distributed_optimizer_instance_rank=rank,
        ))  # fmt: skip
    return groups


def main() -> None:
    steps = int(sys.argv[1])
    share_gloo_device()
    dist.init_process_group("gloo")
    pg = dist.new_group([0, 1])
    other = dist.new_group([0, 1])  # the step's own exchanges (OrchWeave's DP group)
    rank, size = pg.rank(), pg.size()
    groups = bucket_groups(pg)
    assert all(gathers_per_bucket(g) for g in groups)
    weight = torch.randn(128, 128)
    for step in range(steps):
        for g in groups:
            for b in g.buckets:
                b.param_data.view(size, -1)[rank].fill_(step * size + rank)
            start_bucket_gathers(g)
        x = torch.randn(32, 128)
        for i, g in enumerate(groups):
            x = torch.tanh(x @ weight)  # the layers before this bucket's
            if i % 8 == 0:  # an exchange of the step's, beside the gathers
                dist.all_to_all_single(torch.empty(64 * size), torch.randn(64 * size), group=other)
            g.param_gather_handle.wait()
            g.param_gather_handle = None
            for j, b in enumerate(g.buckets):
                n = b.param_data.numel() // size
                want = torch.cat([torch.full((n,), float(step * size + r)) for r in range(size)])
                if not torch.equal(b.param_data, want):
                    print(f"error: rank {rank} step {step} group {i} bucket {j}: wrong values")
                    sys.exit(1)
        reductions = []
        for g in groups:
            with dist._coalescing_manager(pg, async_ops=True) as cm:
                for b in g.buckets:
                    out = torch.empty(b.param_data.numel() // size)
                    dist.reduce_scatter_single(out, b.param_data.clone(), group=pg, async_op=True)
            reductions.append(cm)
        for cm in reductions:
            cm.wait()
    if rank == 0:
        print(f"gathered {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

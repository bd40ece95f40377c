# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker: train each configuration in turn, with reduced gradients for any optimizer.

Usage: ``optim_worker.py OUT_DIR NAME FLAGS... [--- NAME FLAGS...]``. As ``train_worker.py``:
each configuration trains with a fresh trainer, writes its metrics to ``OUT_DIR/NAME.jsonl``
and ``OUT_DIR/NAME/rank{R}.pt`` (the last iteration's gradients and the final parameters by
global name). With the distributed optimizer a DP rank's gradient buffers hold the reduced
gradients of its own slice only, so the slices are gathered first: every rank then has what
DDP's all-reduce leaves. A configuration whose trainer refuses its checkpoint writes each
rank's message to ``OUT_DIR/NAME.rank{R}.error`` instead. With ``--overlap-grad-reduce`` the
file also holds the bucket count and how many buckets started early in the last step, and
with ``--overlap-param-gather`` how many of its gathers a forward waited for.
"""

import os
import sys

import torch
import torch.distributed as dist
from grad_worker import configurations
from train_worker import fresh_trainer

from megatron.mllm.checkpointing import CheckpointError


def gather_reduced_grads(trainer) -> None:
    """Make every DP rank's gradient buffers hold the reduced gradients of every slice, as
    megatron-core's reduce-scatter cut them (bucket by bucket, ``dp`` equal slices)."""
    if not trainer.run.ddp.use_distributed_optimizer:
        return
    group = trainer.pg_collection.dp
    for buffer in trainer.ddp_model.buffers:
        for bucket in buffer.buckets:
            mine = bucket.grad_data.chunk(group.size())[group.rank()].clone()
            dist.all_gather_into_tensor(bucket.grad_data, mine, group=group)


def main() -> None:
    out_dir = sys.argv[1]
    for name, flags in configurations(sys.argv[2:]):
        try:
            trainer = fresh_trainer(
                [*flags, "--metrics-jsonl", os.path.join(out_dir, f"{name}.jsonl")]
            )
        except CheckpointError as e:
            with open(os.path.join(out_dir, f"{name}.rank{dist.get_rank()}.error"), "w") as f:
                f.write(str(e))
            continue
        trainer.train()
        gather_reduced_grads(trainer)
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        overlap, gather = trainer.grad_reduce, trainer.param_gather
        names = trainer.model.global_param_names()
        by_param = {p: names[n] for n, p in trainer.model.named_parameters()}
        torch.save(
            {
                "grads": trainer.main_grads(),
                "params": trainer.parameters_by_name(),
                "loss": None,
                # --overlap-grad-reduce: the buckets, and how many started before the end of
                # the last step's backward.
                "overlap": (
                    None if overlap is None else (overlap.num_buckets, overlap.started_early)
                ),
                # The global names in each bucket, in the order their reductions start.
                "bucket_order": (
                    None
                    if overlap is None
                    else [sorted(by_param[p] for p in g.params) for g in overlap._groups]
                ),
                # The global names in each bucket, in the order their gathers are dispatched.
                "gather_order": (
                    None
                    if gather is None
                    else [sorted(by_param[p] for p in g.params) for g in gather._groups]
                ),
                # --overlap-param-gather: the buckets, and how many of the last step's gathers
                # a forward waited for.
                "param_gather": (
                    None if gather is None else (gather.num_buckets, gather.waited_in_forward)
                ),
            },
            os.path.join(out_dir, name, f"rank{dist.get_rank()}.pt"),
        )
        del trainer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

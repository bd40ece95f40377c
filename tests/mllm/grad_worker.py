# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker: one forward/backward of iteration 0's global batch, grads saved by name.

Runs whatever the flags select (baseline or post-balanced, any layout).

Usage: grad_worker.py OUT_DIR [trainer flags...]. Writes OUT_DIR/rank{R}.pt with the
finalized main gradients (layout-independent names), the loss sum and token count.
"""

import os
import sys

import torch
import torch.distributed as dist

from megatron.mllm.arguments import parse_arguments
from megatron.mllm.training import Trainer


def main() -> None:
    out_dir, argv = sys.argv[1], sys.argv[2:]
    trainer = Trainer(parse_arguments(argv))
    losses = trainer.run_iteration(0)
    loss = None
    if losses:
        loss = torch.stack([d["lm loss"] for d in losses]).sum(0)
        dist.all_reduce(loss, group=trainer.pg_collection.dp)
    torch.save(
        {"grads": trainer.main_grads(), "loss": loss, "params": trainer.parameters_by_name()},
        os.path.join(out_dir, f"rank{dist.get_rank()}.pt"),
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

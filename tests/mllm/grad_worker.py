# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker: one forward/backward of iteration 0's global batch per configuration.

Usage: ``grad_worker.py OUT_DIR NAME FLAGS... [--- NAME FLAGS...]``. For each configuration
(same world size; any layout, schedule or balancing) it builds a fresh trainer in the same
processes, runs one iteration's forward and backward and writes
``OUT_DIR/NAME/rank{R}.pt`` with the finalized main gradients and the initial parameters (by
layout-independent name) and the loss sum and token count. Running several configurations in
one launch saves the processes' start-up (seconds of imports each).

A configuration whose name starts with ``memory-`` also records ``peak_saved_bytes``: the peak of
the activation bytes autograd kept during its forward and backward, counted as
``tools/bench/semu_memory_probe.py`` counts them (the others skip the hooks' cost).
"""

import os
import sys

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.mllm.arguments import parse_arguments
from megatron.mllm.calibration.probes import SavedTensorTracker
from megatron.mllm.run_config import RunConfig
from megatron.mllm.training import Trainer


def configurations(argv: list[str]) -> list[tuple[str, list[str]]]:
    """Split ``NAME FLAGS... --- NAME FLAGS...``."""
    out, current = [], []
    for token in [*argv, "---"]:
        if token == "---":
            if current:
                out.append((current[0], current[1:]))
            current = []
        else:
            current.append(token)
    return out


def main() -> None:
    out_dir = sys.argv[1]
    for name, flags in configurations(sys.argv[2:]):
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        trainer = Trainer(RunConfig.from_args(parse_arguments(flags)))
        tracker = SavedTensorTracker(trainer.model.parameters())
        if name.startswith("memory-"):
            with tracker.hooks():
                losses, _ = trainer.forward_backward(0)
        else:
            losses, _ = trainer.forward_backward(0)
        loss = None
        if losses:
            loss = torch.stack([d["lm loss"] for d in losses]).sum(0)
            dist.all_reduce(loss, group=trainer.pg_collection.dp)
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        torch.save(
            {
                "grads": trainer.main_grads(),
                "loss": loss,
                "params": trainer.parameters_by_name(),
                "peak_saved_bytes": tracker.peak,
            },
            os.path.join(out_dir, name, f"rank{dist.get_rank()}.pt"),
        )
        del trainer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

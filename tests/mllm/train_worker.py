# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker: train each configuration in turn in the same processes.

Usage: ``train_worker.py OUT_DIR NAME FLAGS... [--- NAME FLAGS...]``. Each configuration trains
for its ``--train-iters`` with a fresh trainer and writes its metrics to ``OUT_DIR/NAME.jsonl``
(the trainer's own ``--metrics-jsonl``) and ``OUT_DIR/NAME/rank{R}.pt``: the last iteration's
main gradients and the parameters after the last optimizer step, by layout-independent name
(the form of ``grad_worker.py``'s files, for ``equivalence.merge``), and how many gloo transport
threads the process has after the run. One launch saves the processes' start-up.
"""

import os
import sys

import torch
import torch.distributed as dist
from grad_worker import configurations

from megatron.core import parallel_state
from megatron.mllm.arguments import parse_arguments
from megatron.mllm.run_config import RunConfig
from megatron.mllm.training import Trainer


def fresh_trainer(flags: list[str]) -> Trainer:
    """A trainer of ``flags`` in this process, after any earlier one's parallel state."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    return Trainer(RunConfig.from_args(parse_arguments(flags)))


def gloo_transport_threads() -> int:
    """This process's gloo transport threads (``gloo_tcp_loop``) now."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                count += f.read().strip() == "gloo_tcp_loop"
        except (FileNotFoundError, ProcessLookupError):  # the thread ended since the listing
            continue
    return count


def main() -> None:
    out_dir = sys.argv[1]
    for name, flags in configurations(sys.argv[2:]):
        metrics = os.path.join(out_dir, f"{name}.jsonl")
        trainer = fresh_trainer([*flags, "--metrics-jsonl", metrics])
        trainer.train()
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        torch.save(
            {
                "grads": trainer.main_grads(),
                "params": trainer.parameters_by_name(),
                "loss": None,
                "gloo_transport_threads": gloo_transport_threads(),
            },
            os.path.join(out_dir, name, f"rank{dist.get_rank()}.pt"),
        )
        del trainer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

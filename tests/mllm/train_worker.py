# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker: train each configuration in turn in the same processes.

Usage: ``train_worker.py OUT_DIR NAME FLAGS... [--- NAME FLAGS...]``. Each configuration trains
for its ``--train-iters`` with a fresh trainer and writes its metrics to ``OUT_DIR/NAME.jsonl``
(the trainer's own ``--metrics-jsonl``). One launch saves the processes' start-up.
"""

import os
import sys

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


def main() -> None:
    out_dir = sys.argv[1]
    for name, flags in configurations(sys.argv[2:]):
        metrics = os.path.join(out_dir, f"{name}.jsonl")
        fresh_trainer([*flags, "--metrics-jsonl", metrics]).train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

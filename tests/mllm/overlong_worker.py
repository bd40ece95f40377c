# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker of the ``--overlong-samples`` test: several runs in one launch.

Usage: ``overlong_worker.py OUT_DIR NAME FLAGS... [--- NAME FLAGS...]``. Each run trains and
its last rank writes ``OUT_DIR/NAME.json``: per iteration the loss sum, its token count and the
samples truncated and dropped; it prints ``== NAME`` before the run's log lines.
"""

import json
import os
import sys

import torch.distributed as dist
from grad_worker import configurations
from train_worker import fresh_trainer


def main() -> None:
    out_dir = sys.argv[1]
    for name, flags in configurations(sys.argv[2:]):
        trainer = fresh_trainer(flags)
        last = dist.get_rank() == dist.get_world_size() - 1
        if last:
            print(f"== {name}", flush=True)
        results = trainer.train()
        if last:
            record = [
                [r.loss_sum, r.loss_tokens, r.batch.truncated_samples, r.batch.dropped_samples]
                for r in results
            ]
            with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
                json.dump(record, f)
        del trainer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker: what the timers cost in calls, at each --timing-log-level.

Usage: ``timer_count_worker.py OUT_DIR FLAGS...``. Trains 2 iterations at level 0, then at
level 1, counting the calls the timers make (clock readings and synchronisations of
``StepTimers``, its per-iteration gather, the clock-offset estimate) and every
torch.distributed collective; rank 0 writes ``OUT_DIR/counts.json``.
"""

import json
import os
import sys
from collections import Counter

import torch.distributed as dist
from train_worker import fresh_trainer

from megatron.mllm import distributed
from megatron.mllm.timers import StepTimers

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_to_all_single", "barrier",
               "broadcast", "send", "recv", "isend", "irecv")  # fmt: skip

counts: Counter = Counter()


def counting(name, fn):
    def wrapper(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)

    return wrapper


def main() -> None:
    out_dir, flags = sys.argv[1], sys.argv[2:]
    for name in COLLECTIVES:
        setattr(dist, name, counting(f"dist.{name}", getattr(dist, name)))
    for name in ("all_gather_objects", "clock_offsets"):
        setattr(distributed, name, counting(f"timers.{name}", getattr(distributed, name)))
    StepTimers._now = counting("timers.clock", StepTimers._now)
    result = {}
    for level in (0, 1):
        counts.clear()
        fresh_trainer([*flags, "--timing-log-level", str(level)]).train()
        result[level] = dict(counts)
    if dist.get_rank() == 0:
        with open(os.path.join(out_dir, "counts.json"), "w", encoding="utf-8") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

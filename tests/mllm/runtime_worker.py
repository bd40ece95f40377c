# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Worker for test_runtime.py: the runtime under fuzzed schedules, and a rank that dies.

``runtime_worker.py fuzz OUT_DIR N FLAGS...``: runs iteration 0 under N random valid schedules
(the same on every rank), checks that every run's gradients equal the first run's, saves the
first run's gradients for comparison with one process, then hands the runtime an invalid
schedule and checks it is rejected before any stage runs.

``runtime_worker.py die STAGE MICROBATCH FLAGS...``: the given stage exits in the middle of
the step, at its first LLM forward of that microbatch.
"""

import os
import random
import sys

import torch
import torch.distributed as dist

from megatron.mllm.arguments import parse_arguments
from megatron.mllm.run_config import RunConfig
from megatron.mllm.training import Trainer
from pipeweaver.fuzz import random_invalid_schedule, random_valid_schedule
from pipeweaver.ir import ScheduleError


def fuzz(out_dir: str, count: int, flags: list[str]) -> None:
    trainer = Trainer(RunConfig.from_args(parse_arguments(flags)))
    runtime = trainer.step.runtime
    first = None
    worst = 0.0
    for n in range(count):
        rng = random.Random(n)
        runtime.schedule_fn = lambda p, s, mbs: random_valid_schedule(p, s, rng)
        trainer.forward_backward(0)
        grads = trainer.main_grads()
        if first is None:
            first = grads
            continue
        for name, g in grads.items():
            ref = first[name]
            worst = max(worst, float((g - ref).norm() / ref.norm().clamp_min(1e-30)))
    assert worst <= 1e-5, f"a fuzzed schedule changed the gradients by {worst:.2e}"
    os.makedirs(out_dir, exist_ok=True)
    torch.save({"grads": first, "worst": worst}, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))

    # An invalid schedule never runs: no stage forward may be called.
    calls = []
    for chunk in trainer.model.chunks.values():
        chunk.register_forward_pre_hook(lambda *a: calls.append(1))
    rng = random.Random(12345)
    runtime.schedule_fn = lambda p, s, mbs: random_invalid_schedule(p, s, rng)[0]
    try:
        trainer.forward_backward(0)
    except ScheduleError as e:
        print(f"rank {dist.get_rank()}: rejected: {e}", flush=True)
    else:
        raise AssertionError("an invalid schedule was executed")
    assert not calls, "a stage ran before the schedule was rejected"
    print(
        f"rank {dist.get_rank()}: fuzzed {count} schedules, worst deviation {worst:.2e}", flush=True
    )


def die(stage: int, microbatch: int, flags: list[str]) -> None:
    trainer = Trainer(RunConfig.from_args(parse_arguments(flags)))
    if trainer.pp_rank == stage:
        chunks = trainer.model.placement.chunks_on(trainer.pp_rank)
        module = trainer.model.chunk_module("llm", min(c for m, c in chunks if m == "llm"))
        seen = []

        def hook(mod, args):
            seen.append(1)
            if len(seen) > microbatch:
                print(f"stage {stage}: exiting in the middle of the step", flush=True)
                os._exit(7)

        module.register_forward_pre_hook(hook)
    trainer.forward_backward(0)
    raise AssertionError("the step finished although a rank died")


if __name__ == "__main__":
    if sys.argv[1] == "fuzz":
        fuzz(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        die(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
    dist.destroy_process_group()

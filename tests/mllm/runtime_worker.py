# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Worker for test_runtime.py: the runtime under fuzzed schedules, and a rank that dies.

``runtime_worker.py fuzz OUT_DIR N FLAGS...``: runs iteration 0 under N random valid schedules
(the same on every rank), checks that every run's gradients equal the first run's, saves the
first run's gradients for comparison with one process, runs the greedy order with memory
strategies planned per F/B pair under a limit (phases 2 and 3: keep, recompute and offload mixed
in one schedule) and checks its gradients too, then hands the runtime an invalid schedule and
checks it is rejected before any stage runs.

``runtime_worker.py strategies OUT_DIR N FLAGS...``: the per-pair strategies that run
megatron-core's recompute inside a chunk (selective, first n layers). Runs the run's own order
with every pair under one strategy at a time (none, selective, first layer, whole chunk),
counting the activation bytes autograd keeps (as ``tools/bench/semu_memory_probe.py`` does);
then N fuzzed orders mixing every strategy per pair, and the greedy order with the strategies
the memory ILP chose among all of them under a limit. Saves every run's gradients, loss and
peak bytes.

``runtime_worker.py die STAGE MICROBATCH FLAGS...``: the given stage exits in the middle of
the step, at its first LLM forward of that microbatch.
"""

import contextlib
import os
import random
import sys

import torch
import torch.distributed as dist

from megatron.core.transformer.attention import Attention
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.mllm.arguments import parse_arguments
from megatron.mllm.calibration.probes import SavedTensorTracker
from megatron.mllm.run_config import RunConfig
from megatron.mllm.training import Trainer
from pipeweaver.checker import check
from pipeweaver.fuzz import random_invalid_schedule, random_valid_schedule
from pipeweaver.interleave import greedy_dual_queue
from pipeweaver.ir import Kind, Memory, ScheduleError
from pipeweaver.lowering import lower
from pipeweaver.schedule import Schedule
from pipeweaver.search.memory_plan import StrategyCosts, plan_memory
from pipeweaver.semu.timing import ComputeCost


def planned_schedule(placement, structure, microbatches):
    """The greedy order under a hard limit, then every pair's strategy by the memory ILP, with
    costs in rows of each compute's input (recompute keeps a tenth and pays a forward again,
    offload keeps a twentieth and pays a copy each way); the limit forces all three strategies
    into one schedule. Prints the strategies chosen."""

    def rows(a) -> float:
        mb = microbatches[a.microbatch]
        lens, _ = mb.compute_sequences(a.module, a.sub)
        return float(sum(lens) * (a.chunk + 1))

    def cost(a) -> ComputeCost:
        full = rows(a)
        if a.memory is Memory.RECOMPUTE:
            if a.kind is Kind.F:
                return ComputeCost(full, full / 10, 0.0)
            return ComputeCost(3 * full, 0.0, full)
        if a.memory is Memory.OFFLOAD:
            return ComputeCost(1.6 * full if a.kind is Kind.F else 2.6 * full, full / 20, full)
        return ComputeCost(full if a.kind is Kind.F else 2 * full, full, 0.0)

    kept = lambda a: cost(a).kept_bytes  # noqa: E731
    order = greedy_dual_queue(placement, structure, lambda a: cost(a).time_s)
    peak = check(order, activation_bytes=kept).peak_activation_bytes
    # Phase 2 orders under a looser limit (with every activation kept, a microbatch alone may
    # not fit the tight one); phase 3 fits the tight one by its choice of strategies.
    order = greedy_dual_queue(
        placement,
        structure,
        lambda a: cost(a).time_s,
        memory_limit=[0.9 * p for p in peak],
        activation_bytes=kept,
    )
    # The last stage holds one microbatch at a time in 1F1B, where only selective lowers the
    # peak (a recomputing backward rebuilds what it dropped); the first one holds several.
    limits = [0.6 * p for p in peak[:-1]] + [0.9 * peak[-1]]
    strategies = (Memory.NONE, Memory.RECOMPUTE, Memory.OFFLOAD)
    plan = plan_memory(order, StrategyCosts(cost), limits, strategies=strategies, gap=0.0)
    check(plan.schedule, memory_cap=limits, activation_bytes=kept)
    used = sorted({m.value for m in plan.choices.values()})
    print(f"rank {dist.get_rank()}: planned strategies {used}", flush=True)
    return plan.schedule


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
    runtime.schedule_fn = planned_schedule
    trainer.forward_backward(0)
    planned = trainer.main_grads()
    os.makedirs(out_dir, exist_ok=True)
    torch.save(
        {"grads": first, "planned": planned, "worst": worst},
        os.path.join(out_dir, f"rank{dist.get_rank()}.pt"),
    )

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


UNIFORM = {
    "none": (Memory.NONE, 0),
    "selective": (Memory.SELECTIVE, 0),
    "layers1": (Memory.LAYERS, 1),
    "recompute": (Memory.RECOMPUTE, 0),
}
"""The strategies run on every pair of the run's own order, one at a time."""


def with_strategy(schedule, memory: Memory, layers: int):
    """``schedule`` with every compute under one strategy (lowered again)."""
    order = tuple(
        tuple(a.with_memory(memory, layers) for a in schedule.computes(r))
        for r in range(schedule.num_ranks)
    )
    return lower(Schedule(schedule.placement, schedule.structure, order, schedule.name))


def layered_planned_schedule(placement, structure, microbatches):
    """The greedy order under a limit, every strategy the runtime executes on a CPU a candidate
    for the memory ILP, costs in rows of each compute's input as :func:`planned_schedule`'s:
    selective keeps 0.8, reruns a fifth of a forward and rebuilds a twentieth; the first n of
    L layers keep (L - n) / L plus 1/20 per layer, rerun n / L of a forward and rebuild one
    layer at a time; recompute keeps a tenth, reruns the forward and rebuilds it all. Under the
    limits below the plan mixes them. Prints the strategies chosen."""

    def rows(a) -> float:
        lens, _ = microbatches[a.microbatch].compute_sequences(a.module, a.sub)
        return float(sum(lens) * (a.chunk + 1))

    def cost(a) -> ComputeCost:
        full = rows(a)
        start, stop = placement.layer_range(a.module, a.chunk)
        share = {  # kept, rerun, rebuilt at once in the backward
            Memory.NONE: (1.0, 0.0, 0.0),
            Memory.SELECTIVE: (0.8, 0.2, 0.05),
            Memory.RECOMPUTE: (0.1, 1.0, 1.0),
        }
        if a.memory is Memory.LAYERS:
            n, layers = a.recompute_layers, stop - start
            kept, rerun, rebuilt = (layers - n) / layers + n / 20, n / layers, 1 / layers
        else:
            kept, rerun, rebuilt = share[a.memory]
        if a.kind is Kind.F:
            return ComputeCost(full, full * kept, 0.0)
        return ComputeCost((2 + rerun) * full, 0.0, full * rebuilt)

    kept = lambda a: cost(a).kept_bytes  # noqa: E731
    order = greedy_dual_queue(placement, structure, lambda a: cost(a).time_s)
    peak = check(order, activation_bytes=kept).peak_activation_bytes
    # The last stage holds one microbatch at a time in 1F1B, where only selective lowers the
    # peak (a recomputing backward rebuilds what it dropped); the first one holds several.
    limits = [0.6 * p for p in peak[:-1]] + [0.9 * peak[-1]]
    strategies = (Memory.NONE, Memory.SELECTIVE, Memory.LAYERS, Memory.RECOMPUTE)

    def layers(a) -> int:
        start, stop = placement.layer_range(a.module, a.chunk)
        return stop - start

    plan = plan_memory(order, StrategyCosts(cost, layers), limits, strategies=strategies, gap=0)
    check(plan.schedule, memory_cap=limits, activation_bytes=kept)
    used = sorted({a.strategy for r in range(plan.schedule.num_ranks)
                   for a in plan.schedule.computes(r)})  # fmt: skip
    print(f"rank {dist.get_rank()}: planned strategies {used}", flush=True)
    return plan.schedule


def strategies(out_dir: str, count: int, flags: list[str]) -> None:
    trainer = Trainer(RunConfig.from_args(parse_arguments(flags)))
    runtime = trainer.step.runtime
    own = runtime.schedule_fn
    runs = {}

    def settings() -> list:
        """The recompute settings of every block and attention on this rank (the run's flags)."""
        out = []
        for chunk in trainer.model.chunks.values():
            for m in chunk.modules():
                if isinstance(m, TransformerBlock):
                    c = m.config
                    out.append(
                        (c.recompute_granularity, c.recompute_method, c.recompute_num_layers)
                    )
                elif isinstance(m, Attention):
                    out.append(m.checkpoint_core_attention)
        return out

    flags = settings()

    def run(name: str, tracked: bool = False) -> None:
        tracker = SavedTensorTracker(trainer.model.parameters())
        with tracker.hooks() if tracked else contextlib.nullcontext():
            losses, _ = trainer.forward_backward(0)
        loss = None
        if losses:
            loss = torch.stack([d["lm loss"] for d in losses]).sum(0)
        runs[name] = {"grads": trainer.main_grads(), "loss": loss, "peak": tracker.peak}
        # Each pair's recompute was set for its own computes only: the run's flags are back.
        assert settings() == flags, f"{name} left {settings()}, the run's flags are {flags}"
        used = sorted({a.strategy for a in runtime.last_schedule.computes(trainer.pp_rank)})
        print(f"rank {dist.get_rank()}: ran {name} with {used}", flush=True)

    for name, (memory, layers) in UNIFORM.items():
        runtime.schedule_fn = lambda p, s, mbs: with_strategy(own(p, s, mbs), memory, layers)
        run(name, tracked=True)
    every = (Memory.NONE, Memory.SELECTIVE, Memory.LAYERS, Memory.RECOMPUTE, Memory.OFFLOAD)
    for n in range(count):
        rng = random.Random(n)
        runtime.schedule_fn = lambda p, s, mbs: random_valid_schedule(p, s, rng, every)
        run(f"fuzz{n}")
    runtime.schedule_fn = layered_planned_schedule
    run("planned")
    os.makedirs(out_dir, exist_ok=True)
    torch.save(runs, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))


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
    elif sys.argv[1] == "strategies":
        strategies(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        die(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
    dist.destroy_process_group()

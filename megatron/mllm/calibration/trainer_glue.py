# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The ``trainer`` stage: what a real training step adds to the measured parts.

The trainer is built in this process (world size 1, PP = 1, the megatron schedule, no
post-balancing) on each calibration workload and trains a few iterations. Its parts are timed
where the trainer calls them: the host work before the step (``BatchLoader.load``: payloads
and the metadata all-gather; ``PackedStep.pack``: packing), every ``forward_step`` /
``backward_step`` of megatron-core's schedule, and ``optimizer.step``; each iteration is
normalised by reference passes right before and after it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, Sequence

import torch

from megatron.mllm.calibration.harness import Reference, engine_backward, measurement_run
from megatron.mllm.cli.progress import progress
from orchestration.calibration import Calibration


@contextlib.contextmanager
def _timed(record: dict[str, list[float]], obj, attr: str, key: str):
    """Within the block, every call of ``obj.attr`` appends its seconds to ``record[key]``."""
    original = getattr(obj, attr)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            record.setdefault(key, []).append(time.perf_counter() - t)

    setattr(obj, attr, wrapper)
    try:
        yield
    finally:
        setattr(obj, attr, original)


def measure_trainer(
    model: str,
    cal: Calibration,
    workloads: Sequence[str],
    iters: int,
    warmup: int,
    ref: Reference,
    log: Callable[[str], None],
) -> dict:
    """Short trainer runs on ``workloads``; returns (reference units):

    * ``forward_step_s`` / ``backward_step_s``: megatron-core's ``forward_step`` /
      ``backward_step`` on a microbatch minus the same microbatch run directly through the
      DDP-wrapped stage model (forward, the trainer's loss, the engine backward), measured
      round-robin on the workloads' microbatches: the schedule's glue, free of the fit's errors;
    * ``step_s``: the step minus its host work, schedule calls and optimizer step (zeroing the
      grad buffers, finalize_model_grads, the scheduler, the loss reduction);
    * ``optimizer_context`` / ``host_context``: the optimizer step and the host work as
      measured inside the steps over what the isolated fits in ``cal`` predict for them (in a
      step the optimizer follows the backward and finds colder caches than in isolation); the
      fits' coefficients are scaled by them.

    It also logs how far the fitted chunks are from the measured ``forward_step`` /
    ``backward_step`` times of the workloads (not used: a check of the fit).

    Args:
        model: the model config.
        cal: the calibration so far, in reference units.
        workloads: workloads to train on (not the accuracy benchmark's).
        iters: iterations per workload.
        warmup: leading iterations not counted.
        ref: the reference pass.
        log: receives the stage's one-line summary.
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules
    from megatron.mllm import training
    from megatron.mllm.steps import PackedStep
    from pipeweaver.generators import generate
    from pipeweaver.ir import Compute, Kind
    from pipeweaver.placement import Placement
    from pipeweaver.semu.batches import pack_microbatch, structure_of
    from pipeweaver.semu.hardware import DEVICES, ClusterSpec
    from pipeweaver.semu.simulator import Semu

    record: dict[str, list[float]] = {}
    fit_f, fit_b, step_rest, opt_ratio, host_ratio = [], [], [], [], []
    glue_f, glue_b = [], []
    for workload in progress(workloads, "calibration: trainer"):
        loaded = measurement_run(
            model,
            train_iters=iters,
            post_balance="none",
            pipeline_schedule="megatron",
            workload=workload,
        )
        spec = loaded.semu
        semu = Semu(spec, ClusterSpec(DEVICES["cpu"], 1, devices_per_node=1), cal)
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        trainer = training.Trainer(loaded.run)
        if not isinstance(trainer.step, PackedStep):
            raise RuntimeError(f"expected megatron-core's packed step, got {trainer.step!r}")
        enc = list(spec.shape.encoders)
        placement = Placement.baseline(1, spec.layers())
        static = semu.static_bytes(placement)[0]
        tensors = semu.cost.rank_param_tensors(placement, 0)
        with contextlib.ExitStack() as patched:
            for obj, attr, key in [
                (trainer.loader, "load", "host"),
                (trainer.step, "pack", "host"),
                (trainer.optimizer, "step", "optimizer"),
                (schedules, "forward_step", "forward_step"),
                (schedules, "backward_step", "backward_step"),
            ]:
                patched.enter_context(_timed(record, obj, attr, key))
            for it in progress(range(iters), f"{workload} iterations", leave=False):
                record.clear()
                r0 = ref.time()
                t = time.perf_counter()
                result = trainer.train_step(it)
                total = time.perf_counter() - t
                r = (r0 + ref.time()) / 2
                if it < warmup:
                    continue
                total /= r
                times = {k: [x / r for x in v] for k, v in record.items()}
                mbs = [
                    pack_microbatch([s.meta for s in mb], enc) for mb in result.batch.microbatches
                ]
                sched = generate("none", placement, structure_of(mbs, enc))
                pred = {(j, kind): 0.0 for j in range(len(mbs)) for kind in "FB"}
                for a in sched.actions[0]:
                    if type(a) is Compute:
                        c = semu.compute_cost(placement, a, mbs[a.microbatch]).time_s
                        pred[(a.microbatch, "F" if a.kind is Kind.F else "B")] += c
                for j, (f, b) in enumerate(zip(times["forward_step"], times["backward_step"])):
                    fit_f.append(f / pred[(j, "F")] - 1)
                    fit_b.append(b / pred[(j, "B")] - 1)
                step_rest.append(total - sum(sum(v) for v in times.values()))
                opt_ratio.append(
                    sum(times["optimizer"]) / semu.cost.optimizer_time(static["params"], 1, tensors)
                )
                host_ratio.append(sum(times["host"]) / semu.host_time(mbs, 0))
        gf, gb = _schedule_glue(trainer, iters, reps=5, ref=ref)
        glue_f += gf
        glue_b += gb
        del trainer
    med = statistics.median
    sec = ref.seconds * 1e3  # for the printout: ms at the typical speed so far
    log(
        f"  trainer runs ({', '.join(workloads)}): forward_step glue {med(glue_f) * sec:.2f} ms, "
        f"backward_step glue {med(glue_b) * sec:.2f} ms per microbatch; step rest "
        f"{med(step_rest) * sec:.1f} ms; optimizer in steps x{med(opt_ratio):.2f} the isolated "
        f"fit, microbatch building x{med(host_ratio):.2f}; forward_step/backward_step vs the "
        f"fitted chunks: median {med(fit_f):+.1%}/{med(fit_b):+.1%}"
    )
    return {
        "forward_step_s": float(max(0.0, med(glue_f))),
        "backward_step_s": float(max(0.0, med(glue_b))),
        "step_s": float(max(0.0, med(step_rest))),
        "optimizer_context": float(med(opt_ratio)),
        "host_context": float(med(host_ratio)),
    }


def _schedule_glue(trainer, iteration: int, reps: int, ref: Reference) -> tuple[list, list]:
    """Per microbatch, megatron-core's forward_step/backward_step minus the direct run of the
    same microbatch through the trainer's DDP model (reference units), measured round-robin on
    ``iteration``'s microbatches as the trainer's step packs them."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.mllm.training import forward_step

    config = trainer.mllm.language
    mbs = [trainer.step.pack(m.pairs()) for m in trainer.loader.load(iteration).data_iterator()]

    def via_schedule(mb):
        t0 = time.perf_counter()
        out, _ = schedules.forward_step(
            forward_step, iter([mb]), trainer.ddp_model, len(mbs), None, [], config, 1,
            is_last_stage=True,
        )  # fmt: skip
        t1 = time.perf_counter()
        schedules.backward_step(None, out, None, config)
        return t1 - t0, time.perf_counter() - t1

    def direct(mb):
        t0 = time.perf_counter()
        out, loss_func = forward_step(iter([mb]), trainer.ddp_model)
        loss, _, _ = loss_func(out)
        t1 = time.perf_counter()
        engine_backward(loss, torch.ones_like(loss))
        return t1 - t0, time.perf_counter() - t1

    glue_f, glue_b = [], []
    for _ in range(reps):
        for mb in mbs:
            r = ref.time()
            sf, sb = via_schedule(mb)
            df, db = direct(mb)
            glue_f.append((sf - df) / r)
            glue_b.append((sb - db) / r)
    trainer.ddp_model.zero_grad_buffer()
    return glue_f, glue_b

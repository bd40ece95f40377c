# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The timing harness: runs as the trainer runs them, timed next to a reference pass.

Every measurement of a calibration goes through here: the run config the measurements build
their models from (:func:`measurement_run`), megatron-core's DDP around what is timed
(:func:`ddp_wrap`), the backward as megatron-core's schedule starts it (:func:`engine_backward`),
one timed forward and backward (:func:`timed_pass`), the machine's speed (:class:`Reference`),
round-robin timing of many points (:func:`measure_round_robin`) and the conversion of the
results from reference units to seconds (:func:`scale`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

import torch

from megatron.mllm.batch import thd_params
from megatron.mllm.cli.progress import progress
from megatron.mllm.config_files import LoadedConfig, load_run_config, set_flags
from orchestration.calibration import HOST_TIME_FIELDS, TABLE_TIME_FIELDS, Calibration

TRAINING_FLAGS = {"lr": 4e-3, "min-lr": 4e-4, "lr-warmup-iters": 1, "clip-grad": 1.0,
                  "weight-decay": 0.01}  # fmt: skip
"""The main job's optimizer flags (``scripts/pretrain_mllm_cpu.sh``) beyond the model config:
the costs depend on clipping and weight decay (Megatron's defaults, 1.0 and 0.01, as the
job's)."""

Prepare = Callable[[bool], Callable[[], tuple[torch.Tensor, int]]]
"""A point: ``prepare(measure_memory)`` makes its inputs (untimed: in the trainer they come
from the previous chunk or the batch) and returns ``run() -> (output, bytes saved)``."""


def measurement_run(model: str, world_size: int = 1, pipeline: int = 1, **flags) -> LoadedConfig:
    """The model config as the calibration runs it: TP = 1, the main job's optimizer flags,
    gloo and megatron-core's local transformer implementation.

    Args:
        model: the config file, or its name in ``scripts/configs``.
        world_size: processes.
        pipeline: pipeline-parallel size.
        **flags: more trainer flags (``train_iters=8`` is ``--train-iters 8``).

    Raises:
        ConfigError: the config is missing or its flags cannot work.
    """
    # The stages that do not train still need --train-iters; past the warm-up iteration, as
    # the parser demands.
    extra = {"tensor-model-parallel-size": 1, "pipeline-model-parallel-size": pipeline,
             **TRAINING_FLAGS, "train-iters": 2, "distributed-backend": "gloo",
             "transformer-impl": "local"}  # fmt: skip
    extra.update((k.replace("_", "-"), v) for k, v in flags.items())
    return load_run_config(model, set_flags(extra), world_size=world_size)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (timings on a GPU end when its kernels do)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_backward(out: torch.Tensor, grad: torch.Tensor) -> None:
    """The backward as megatron-core's ``backward_step`` runs it in the trainer.

    The trainer sets ``deallocate_pipeline_outputs``, so ``backward_step`` calls the C++ engine
    directly (``custom_backward``); so does the calibration.
    """
    torch.autograd.Variable._execution_engine.run_backward(
        tensors=(out,),
        grad_tensors=(grad,),
        keep_graph=False,
        create_graph=False,
        inputs=tuple(),
        allow_unreachable=True,
        accumulate_grad=True,
    )


def ddp_wrap(module: torch.nn.Module, run, pg):
    """``module`` in megatron-core's DDP with the run's DDP config, as the trainer wraps its
    model: the parameters get ``main_grad`` buffers and the per-parameter accumulation hooks
    that the trainer's backward runs."""
    from megatron.mllm.distributed import wrap_ddp

    return wrap_ddp(module, module.config, run.ddp, pg)


def timed_pass(
    prepare: Prepare, device: torch.device, measure_memory: bool = False
) -> tuple[float, float, int]:
    """Forward and backward seconds of one point, and the bytes it saves for backward."""
    run = prepare(measure_memory)
    sync(device)
    t0 = time.perf_counter()
    out, saved = run()
    sync(device)
    t1 = time.perf_counter()
    grad = torch.ones_like(out)
    sync(device)
    t2 = time.perf_counter()
    engine_backward(out, grad)
    sync(device)
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2, saved


class Reference:
    """The machine's speed, tracked with a fixed piece of the trainer's work.

    This host's speed drifts by 10-30% over seconds (a shared machine: the same layer call
    takes 2.5 ms in one second and 3.2 ms a few seconds later), which is more than the effects
    being measured. Every timing of a calibration is therefore taken next to one pass of this
    reference (one LLM layer's forward and backward through DDP on two packed 32-token
    sequences) and kept as a ratio to it; :func:`scale` converts every ratio to seconds at the
    median reference time of the whole calibration, i.e. at the machine's typical speed rather
    than at the speed of the second a point happened to be measured in.
    """

    def __init__(self, fn: Prepare, device: torch.device):
        self.fn = fn
        self.device = device
        self.samples: list[float] = []

    def time(self) -> float:
        """Time one pass of the reference (recorded); returns its seconds.

        The pass runs twice and the second is timed: the first takes 10-15% longer right
        after an optimizer step than right after a chunk's pass (caches), and the reference
        must not depend on what ran before it.
        """
        timed_pass(self.fn, self.device)
        f, b, _ = timed_pass(self.fn, self.device)
        self.samples.append(f + b)
        return f + b

    @property
    def seconds(self) -> float:
        """Median seconds of the reference over the calibration so far."""
        return statistics.median(self.samples)


def make_reference(mllm, run, pg, device: torch.device) -> Reference:
    """The reference pass: one LLM layer, DDP-wrapped, forward and backward on 2 x 32 tokens."""
    from megatron.mllm.chunks import ChunkId, build_chunk

    chunk = build_chunk(mllm, ChunkId("llm", 0, 1), pg).to(device)
    chunk.train()
    ddp = ddp_wrap(chunk, run, pg)
    lens = [32, 32]
    psp = thd_params(lens, device)
    h, dtype = mllm.language.hidden_size, mllm.language.params_dtype

    def fwd(measure_memory, _keep=ddp):
        x = torch.randn(sum(lens), 1, h, device=device, dtype=dtype, requires_grad=True)
        return lambda: (chunk.run_layers(x, psp), 0)

    ref = Reference(fwd, device)
    for _ in range(3):  # warm-up, not recorded
        timed_pass(fwd, device)
    return ref


def measure_round_robin(
    fns: list[Prepare], device: torch.device, reps: int, ref: Reference, desc: str = "repetitions"
):
    """Median forward and backward times of each point, in reference units (:class:`Reference`),
    and its saved bytes.

    The first pass of each is a warm-up (allocators, kernels) that also counts the saved bytes;
    the timed passes go round-robin over the points, each next to a pass of the reference. On
    a terminal, a bar labelled ``desc`` counts the repetitions.

    Returns:
        ``(forward, backward, saved bytes)``: one list each, a value per point.
    """
    saved = [timed_pass(fn, device, measure_memory=True)[2] for fn in fns]
    fwd = [[] for _ in fns]
    bwd = [[] for _ in fns]
    # The bar moves once per repetition, between timed passes, never inside one.
    for _ in progress(range(reps), desc, leave=False):
        for i, fn in enumerate(fns):
            r = ref.time()
            f, b, _ = timed_pass(fn, device)
            fwd[i].append(f / r)
            bwd[i].append(b / r)
    return [statistics.median(x) for x in fwd], [statistics.median(x) for x in bwd], saved


def scale(cal: Calibration, seconds: float) -> Calibration:
    """``cal`` with every time in reference units converted to seconds."""
    tables = {}
    for m, t in cal.modules.items():
        tables[m] = dataclasses.replace(
            t,
            **{k: getattr(t, k) * seconds for k in TABLE_TIME_FIELDS if getattr(t, k) is not None},
        )
    host = {k: (v * seconds if k in HOST_TIME_FIELDS else v) for k, v in cal.host.items()}
    return dataclasses.replace(cal, modules=tables, host=host)

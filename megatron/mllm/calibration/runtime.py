# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The ``runtime`` stage: what OrchWeave's pipeline runtime pays on the host around its work.

In one process, on the code paths the runtime runs (reference units, :mod:`harness`):

* ``runtime_forward_s`` / ``runtime_backward_s``: the runtime's own bookkeeping per forward /
  backward action (``pipeweaver.runtime.executor``: gathering the inputs, keeping what the
  backward needs, routing outputs and gradients to their consumers), i.e. each action's time
  in the executor minus the time inside megatron-core's ``forward_step`` / ``backward_step``,
  whose glue ``forward_step_s`` / ``backward_step_s`` cover (trainer stage). The executor runs
  a real schedule of every module of the model on a one-rank placement, with stand-ins for
  megatron-core's two calls (a chunk's own work is the layers stage's);
* ``sub_split_s``: cutting a packed microbatch's encoder inputs into sub-microbatches
  (``megatron.mllm.batch.split_encoder_input``, as ``build_pipeline_microbatch`` does), per
  sub, on the run's own workload;
* ``sub_join_s`` / ``sub_join_backward_s``: LLM chunk 0 concatenating the projected rows of
  ``k`` encoder subs (``torch.cat``, as ``RuntimeChunk`` does) and the backward splitting their
  gradient, fitted as ``const + per_part * k``; the per-part slope is kept.

The transfers' posting and waiting are measured between two processes
(:mod:`~megatron.mllm.calibration.parallel`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import types

import numpy as np
import torch

from megatron.mllm.batch import build_microbatch, split_encoder_input
from megatron.mllm.calibration.fit import nnls
from megatron.mllm.calibration.harness import Reference, engine_backward
from megatron.mllm.data import SyntheticTask
from orchestration.packing import sub_microbatch_groups
from orchestration.workload_spec import SampleStream


def measure_runtime(task: SyntheticTask, mllm, run, quick: bool, ref: Reference) -> dict:
    """The stage's host terms (module docstring), in reference units."""
    reps = 2 if quick else 7
    out = _actions(mllm, reps, ref)
    out["sub_split_s"] = _split(task, mllm, run, reps, ref)
    out.update(_join(mllm, reps, ref))
    return out


# ---------------------------------------------------------------------- the executor's actions


class _Chunk(torch.nn.Module):
    """A stand-in chunk: megatron-core's model contract, next to no work."""

    def __init__(self, shape_of):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.shape_of = shape_of
        self.inputs: list = []

    def set_input_tensor(self, tensors) -> None:
        self.inputs = list(tensors)

    def forward(self, batch):
        x = self.inputs[0] if self.inputs and self.inputs[0] is not None else None
        shape = self.shape_of(batch)
        if x is None or tuple(x.shape) != shape:
            x = torch.ones(shape)
        return x * self.weight


class _Microbatch:
    """The runtime's microbatch protocol for the stand-ins: ``subs`` subs per encoder."""

    def __init__(self, encoders, subs: int, hidden: int):
        self.encoders, self.subs, self.hidden = list(encoders), subs, hidden

    def num_subs(self, encoder: str) -> int:
        return self.subs

    def output_shape(self, module: str, sub: int, last_chunk: bool) -> tuple[int, ...]:
        return (8, 1, self.hidden) if module == "llm" or not last_chunk else (8, self.hidden)

    def compute_batch(self, module: str, chunk: int, sub: int):
        return (module, chunk, sub, self)


def _actions(mllm, reps: int, ref: Reference) -> dict[str, float]:
    """``runtime_forward_s`` / ``runtime_backward_s``: the executor minus the stand-ins."""
    from pipeweaver.dataflow import MicrobatchStructure
    from pipeweaver.generators import dataflow
    from pipeweaver.placement import Placement
    from pipeweaver.runtime import executor

    encoders = list(mllm.encoders)
    layers = {e: 1 for e in encoders} | {"llm": 1}
    placement = Placement.baseline(1, layers)
    hidden = 8
    m, subs = 4, 2
    mbs = [_Microbatch(encoders, subs, hidden) for _ in range(m)]
    schedule = dataflow(placement, MicrobatchStructure(m, {e: (subs,) * m for e in encoders}))

    def shape_of(batch):
        module, chunk, sub, mb = batch
        return mb.output_shape(module, sub, True) if module != "llm" else (8, 1, hidden)

    chunks = {(mod, c): _Chunk(shape_of) for mod, c in placement.chunks_on(0)}
    inner = {"F": 0.0, "B": 0.0}

    def forward_step(func, it, model, n, inputs, store, config, *a, **k):
        t = time.perf_counter()
        model.set_input_tensor(inputs)
        out = model(next(it))
        inner["F"] += time.perf_counter() - t
        return [out], torch.ones((), dtype=torch.int)

    def backward_step(inputs, out, grad, config):
        t = time.perf_counter()
        grads = [None if x is None else torch.ones_like(x) for x in inputs]
        inner["B"] += time.perf_counter() - t
        return grads

    runtime = types.SimpleNamespace(
        rank=0, device=torch.device("cpu"), dtype=torch.float32, placement=placement,
        chunk_module=lambda mod, c: chunks[(mod, c)], p2p=None, receives_at_step_start=False,
    )  # fmt: skip
    config = types.SimpleNamespace(deallocate_pipeline_outputs=True, timers=None)
    counts = {"F": 0, "B": 0}
    for a in schedule.actions[0]:
        counts[a.kind.value] += 1
    per = {"F": [], "B": []}
    with contextlib.ExitStack() as patched:
        patched.enter_context(_patch(executor, "forward_step", forward_step))
        patched.enter_context(_patch(executor, "backward_step", backward_step))
        timed = {"F": 0.0, "B": 0.0}
        for name, kind in (("_forward", "F"), ("_backward", "B")):
            patched.enter_context(
                _patch(executor._Step, name, _timer(executor._Step, name, timed, kind))
            )
        for rep in range(reps + 1):  # the first is a warm-up
            r = ref.time()
            for k in timed:
                timed[k] = inner[k] = 0.0
            executor._Step(runtime, schedule, mbs, None, config, False, False, []).run()
            if rep:
                for k in per:
                    per[k].append(max(0.0, timed[k] - inner[k]) / counts[k] / r)
    return {
        "runtime_forward_s": statistics.median(per["F"]),
        "runtime_backward_s": statistics.median(per["B"]),
    }


@contextlib.contextmanager
def _patch(obj, attr: str, value):
    original = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, original)


def _timer(cls, name: str, timed: dict, kind: str):
    original = getattr(cls, name)

    def wrapper(self, *a, **k):
        t = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            timed[kind] += time.perf_counter() - t

    return wrapper


# ---------------------------------------------------------------------- sub-microbatches


def _split(task: SyntheticTask, mllm, run, reps: int, ref: Reference) -> float:
    """Seconds per sub of ``split_encoder_input`` on the run's workload (reference units):
    every item its own sub (the finest cut, so the per-sub cost dominates)."""
    w = run.workload
    stream = SampleStream(w.workload, w.workload_seed, w.workload_token_scale)
    encoders = list(mllm.encoders)
    cases = []
    for i in range(8):
        indices = [1000 * i + j for j in range(run.micro_batch_size)]
        pairs = [(stream.meta(k), task.payload(stream.meta(k), k)) for k in indices]
        packed = build_microbatch(pairs, encoders, device=torch.device("cpu"))
        for enc, enc_input in packed.encoders.items():
            items = [(len(it.units), it.encoder_tokens, it.llm_tokens)
                     for meta, _ in pairs for it in meta.encoder_items(enc)]  # fmt: skip
            if items:
                cases.append((enc_input, items, sub_microbatch_groups(items, 1)))
    if not cases:
        return 0.0
    per = []
    for rep in range(reps + 1):
        r = ref.time()
        subs = 0
        t = time.perf_counter()
        for enc_input, items, groups in cases:
            subs += len(split_encoder_input(enc_input, items, groups))
        if rep:
            per.append((time.perf_counter() - t) / subs / r)
    return statistics.median(per)


def _join(mllm, reps: int, ref: Reference) -> dict[str, float]:
    """LLM chunk 0's join of ``k`` encoder subs' rows and its backward, per part."""
    h, dtype = mllm.language.hidden_size, mllm.language.params_dtype
    ks = [1, 2, 4, 8]
    fwd, bwd = {k: [] for k in ks}, {k: [] for k in ks}
    for rep in range(reps + 1):
        for k in ks:
            parts = [torch.randn(16, h, dtype=dtype, requires_grad=True) for _ in range(k)]
            r = ref.time()
            t0 = time.perf_counter()
            joined = torch.cat(parts)
            t1 = time.perf_counter()
            engine_backward(joined, torch.ones_like(joined))
            t2 = time.perf_counter()
            if rep:
                fwd[k].append((t1 - t0) / r)
                bwd[k].append((t2 - t1) / r)
    rows = np.array([[1.0, float(k)] for k in ks])
    slope = lambda d: float(nnls(rows, np.array([statistics.median(d[k]) for k in ks]))[1])
    return {"sub_join_s": slope(fwd), "sub_join_backward_s": slope(bwd)}

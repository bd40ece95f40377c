#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Measure OrchWeave's modules on this device and write the calibration JSON SEMU reads.

Usage (from the repository root)::

    python tools/calibrate.py [--model scripts/configs/cpu-main.json] [--output F.json]
                              [--quick] [--reps N] [--lengths 16,64,256] [--packs 1,2,4]
                              [--threads 1] [--workloads llava15-665k,...] [--stages ...]

Everything is measured the way the trainer (``megatron/mllm/training.py``) runs it, so that
SEMU's sums of measured parts add up to a real iteration. What is measured, by stage
(``--stages``, default all; ``--quick`` runs a tiny grid of the first three, for tests):

``layers``
    The trainer's own chunks (``megatron.mllm.chunks.build_chunk``), wrapped in megatron-core's
    DDP with the trainer's DDP config, so the per-parameter gradient-accumulation hooks run in
    every backward; the backward is started the way megatron-core's ``backward_step`` starts it
    (the C++ engine directly, ``custom_backward``: the trainer sets
    ``deallocate_pipeline_outputs``), which keeps the CPU shim's ``TorchFunctionMode`` active in
    the Python autograd functions of the backward, as in the trainer (``Tensor.backward()``
    would switch it off and run ~25% faster than the trainer does). Per module:

    * one transformer layer over a grid of ``k`` packed sequences of ``n`` tokens; forward and
      backward are each fitted as ``const + per_sequence * (k-1) + linear * N +
      quadratic * sum(n_i**2)`` (non-negative least squares on relative errors);
    * the input layer and the head: whole first and last chunks on batches from the trainer's
      own ``build_microbatch``, minus the fitted layer, fitted as ``const + per_token * N`` (the
      encoders' heads also ``+ per_row * R``, R the LLM rows they produce: items pool 1:1 and
      4:1 in the grid), forward and backward;
    * the activation bytes each keeps for backward (``torch.autograd.graph.saved_tensors_hooks``:
      unique storages saved, parameters excluded), per token, per squared length, per row;
    * the parameter tensors of a layer, the input layer and the head (per-tensor costs).

    Points are measured round-robin (every repetition visits every point), so that the
    machine's speed drifting over seconds (a shared host) spreads over all points alike.
``optimizer``
    megatron-core's optimizer (``get_megatron_optimizer`` with the trainer's config: Adam,
    gradient norm and clipping, the local multi-tensor fallbacks on CPU) stepping over several
    sets of DDP-wrapped chunks (none of them a validation run's stage), fitted as
    ``optimizer_step_s + optimizer_s_per_tensor * tensors + optimizer_s_per_param * params``.
``host``
    Building microbatches (payloads and packing, as ``Trainer.microbatches``): per sample and
    per encoder feature element.
``trainer``
    Short in-process trainer runs (world size 1, PP = 1, the megatron schedule) on workloads
    that are not in the accuracy benchmark (``--workloads``, default llava15-665k and
    qwen2vl-dynamic-resolution): every ``forward_step``/``backward_step`` of megatron-core's
    schedule is timed and compared with the chunk times the stages above predict for its
    microbatch; the median differences are the schedule's per-microbatch glue
    (``forward_step_s``, ``backward_step_s``: the loss function, set_input_tensor, loss
    scaling, the backward's entry); what the iteration spends outside microbatches, the
    schedule and the optimizer (zeroing the grad buffers, finalize_model_grads, the scheduler,
    the loss reduction) is ``step_s``.
``parallel``
    Two processes (torchrun, gloo, 2 ranks on this host, as the main job runs): the time of one
    megatron-core P2P transfer (``P2PCommunicator``, as the baseline schedule sends) per size,
    fitted as ``p2p_latency_s + bytes / p2p_bandwidth``; gloo all-reduce per size, fitted as
    ``2 (n-1) allreduce_latency_s + 2 (n-1)/n bytes / allreduce_bandwidth``; and how much
    slower a process computes while the other one computes too (``shared_node_slowdown``,
    shared caches and memory bandwidth), from alternating solo and paired phases.

Plus the device's matmul FLOP/s and copy bandwidth (``hardware``) and the compute efficiency of
the layers' matrix multiplies relative to that peak (``efficiency``). Every process of the main
job runs with ``OMP_NUM_THREADS=1`` (``scripts/pretrain_mllm_cpu.sh``), so ``--threads``
defaults to 1. Timings on a busy machine are wrong: calibrate on a quiet one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from megatron.mllm import cpu_shim  # noqa: E402

cpu_shim.apply()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from orchestration.calibration import Calibration, LayerTimeModel  # noqa: E402
from orchestration.workload import Item, SampleMeta  # noqa: E402
from pipeweaver.semu.model import flags_to_argv, load_model_config  # noqa: E402

DEFAULT_MODEL = os.path.join(_REPO_ROOT, "scripts", "configs", "cpu-main.json")
DEFAULT_WORKLOADS = "llava15-665k,qwen2vl-dynamic-resolution"
STAGES = ("layers", "optimizer", "host", "trainer", "parallel")
# The main job's optimizer flags (scripts/pretrain_mllm_cpu.sh) beyond the model config: the
# costs depend on clipping and weight decay (Megatron's defaults, 1.0 and 0.01, as the job's).
TRAINING_FLAGS = {"lr": 4e-3, "min-lr": 4e-4, "lr-warmup-iters": 1, "clip-grad": 1.0,
                  "weight-decay": 0.01}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse(flags: dict, world_size: int):
    from megatron.mllm.arguments import parse_arguments

    argv = flags_to_argv(flags) + ["--distributed-backend", "gloo", "--transformer-impl", "local"]
    with contextlib.redirect_stdout(io.StringIO()):  # Megatron prints every argument
        return parse_arguments(argv, world_size=world_size)


def setup(flags: dict):
    """torch.distributed (one gloo rank), megatron parallel state, the trainer's model config."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.mllm.config import mllm_config_from_args

    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    cpu_shim.model_parallel_manual_seed(1)
    pg = ProcessGroupCollection.use_mpu_process_groups()
    flags = dict(flags)
    flags.update({"tensor-model-parallel-size": 1, "pipeline-model-parallel-size": 1})
    flags.pop("global-batch-size", None)
    args = _parse({**flags, **TRAINING_FLAGS, "train-iters": 1}, world_size=1)
    return args, mllm_config_from_args(args), pg


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _psp(lens, device):
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
    cu = cu.to(device)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=max(lens),
        max_seqlen_kv=max(lens),
    )


class SavedBytes:
    """Sums the bytes of unique storages autograd saves for backward (parameters excluded)."""

    def __init__(self, module: torch.nn.Module):
        self.exclude = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self.exclude and ptr not in self.seen:
            self.seen[ptr] = st.nbytes()
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def _saving(rec: SavedBytes, on: bool):
    """Count what autograd saves into ``rec`` (when ``on``)."""
    if not on:
        return contextlib.nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack)


def engine_backward(out: torch.Tensor, grad: torch.Tensor) -> None:
    """The backward as megatron-core's ``backward_step`` runs it in the trainer.

    The trainer sets ``deallocate_pipeline_outputs``, so ``backward_step`` calls the C++ engine
    directly (``custom_backward``). Unlike ``Tensor.backward()``, which dispatches through the
    CPU shim's ``TorchFunctionMode`` and so runs the whole backward with the mode switched off,
    this keeps the mode active in every Python autograd function and DDP hook of the backward.
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


def ddp_wrap(module, args, pg):
    """``module`` in megatron-core's DDP with the trainer's config: its parameters get
    ``main_grad`` buffers and the per-parameter accumulation hooks the trainer's backward runs."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.mllm.training import _ddp_config

    return DistributedDataParallel(
        config=module.config, ddp_config=_ddp_config(args), module=module, pg_collection=pg
    )


def _timed_pass(prepare, device, measure_memory: bool = False) -> tuple[float, float, int]:
    """Forward and backward seconds of one point, and the bytes it saves for backward.

    ``prepare(measure_memory)`` makes the point's inputs (untimed: in the trainer they come
    from the previous chunk or the batch) and returns ``run() -> (output, saved bytes)``.
    """
    run = prepare(measure_memory)
    _sync(device)
    t0 = time.perf_counter()
    out, saved = run()
    _sync(device)
    t1 = time.perf_counter()
    grad = torch.ones_like(out)
    _sync(device)
    t2 = time.perf_counter()
    engine_backward(out, grad)
    _sync(device)
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

    def __init__(self, fn, device):
        self.fn = fn
        self.device = device
        self.samples: list[float] = []

    def time(self) -> float:
        """Time one pass of the reference (recorded); returns its seconds.

        The pass runs twice and the second is timed: the first takes 10-15% longer right
        after an optimizer step than right after a chunk's pass (caches), and the reference
        must not depend on what ran before it.
        """
        _timed_pass(self.fn, self.device)
        f, b, _ = _timed_pass(self.fn, self.device)
        self.samples.append(f + b)
        return f + b

    @property
    def seconds(self) -> float:
        """Median seconds of the reference over the calibration so far."""
        return statistics.median(self.samples)


def measure_round_robin(fns, device, reps: int, ref: Reference):
    """Median forward and backward times of each ``fn(measure_memory) -> (output, saved)``, in
    reference units (:class:`Reference`), and its saved bytes.

    The first pass of each is a warm-up (allocators, kernels) that also counts the saved bytes;
    the timed passes go round-robin over the points, each next to a pass of the reference.
    """
    saved = [_timed_pass(fn, device, measure_memory=True)[2] for fn in fns]
    fwd = [[] for _ in fns]
    bwd = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            r = ref.time()
            f, b, _ = _timed_pass(fn, device)
            fwd[i].append(f / r)
            bwd[i].append(b / r)
    return [statistics.median(x) for x in fwd], [statistics.median(x) for x in bwd], saved


# Fields in seconds (scaled from reference units by :func:`scale`); the others are ratios,
# bytes or counts.
_TABLE_TIMES = (
    "const_s", "linear_s", "quadratic_s", "per_sequence_s", "edge_s_per_token",
    "input_s_per_token", "head_s_per_token", "backward_const_s", "backward_linear_s",
    "backward_quadratic_s", "backward_per_sequence_s", "input_const_s", "head_const_s",
    "head_s_per_row", "input_backward_const_s", "input_backward_s_per_token",
    "head_backward_const_s", "head_backward_s_per_token", "head_backward_s_per_row",
    "chunk_const_s", "backward_chunk_const_s",
)  # fmt: skip
_HOST_TIMES = (
    "sample_s", "feature_s_per_element", "optimizer_step_s", "optimizer_s_per_tensor",
    "optimizer_s_per_param", "forward_step_s", "backward_step_s", "step_s",
)  # fmt: skip


def scale(cal: Calibration, seconds: float) -> Calibration:
    """``cal`` with every time in reference units converted to seconds."""
    tables = {}
    for m, t in cal.modules.items():
        tables[m] = dataclasses.replace(
            t, **{k: getattr(t, k) * seconds for k in _TABLE_TIMES if getattr(t, k) is not None}
        )
    host = {k: (v * seconds if k in _HOST_TIMES else v) for k, v in cal.host.items()}
    return dataclasses.replace(cal, modules=tables, host=host)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (drop negative columns and refit)."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def relative_nnls(a: np.ndarray, b: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """NNLS minimising errors relative to ``scale`` (default ``b``): small and large shapes
    count alike, as they do in a step made of many small microbatches."""
    s = np.maximum(np.asarray(b if scale is None else scale, dtype=float), 1e-12)
    return nnls(a / s[:, None], np.asarray(b, dtype=float) / s)


def _sample(module: str, n: int, idx: int, pool: int = 4) -> SampleMeta:
    """A sample whose ``module`` work is one sequence/unit of ``n`` tokens (encoders: pooled
    ``pool``:1 into LLM rows)."""
    if module == "llm":
        return SampleMeta(f"cal-{idx}", text_tokens=n)
    item = Item(units=(n,), llm_tokens=max(1, n // pool))
    key = "image" if module == "vision" else "audio"
    return SampleMeta(f"cal-{idx}", text_tokens=4, **{key: (item,)})


def _count_tensors(module: torch.nn.Module, layers: bool) -> int:
    return sum(1 for n, _ in module.named_parameters() if n.startswith("block.layers.") == layers)


def _middle_block(mllm, module: str, layers: int, pg):
    """A chunk's transformer block alone (no input layer, no head): what a chunk that holds
    neither end of its module runs, with ``layers`` layers (built as ``ModuleChunk`` builds it,
    for any module, even one with too few layers for a middle chunk)."""
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.mllm.specs import transformer_layer_spec

    config = mllm.chunk_config(module, layers)

    class Middle(MegatronModule):
        def __init__(self):
            super().__init__(config=config)
            self.block = TransformerBlock(
                config=config,
                spec=transformer_layer_spec(
                    mllm.use_te, causal=module == "llm", normalization=config.normalization
                ),
                pre_process=True,
                post_process=False,
                pg_collection=pg,
            )

    return Middle()


# Columns of the joint fit of a chunk's time: the chunk call, its layers (fixed, per extra
# packed sequence, per token, per squared length), the input layer (fixed, per token), the
# head (fixed, per token, per LLM row produced).
_COLUMNS = ("chunk", "layer", "layer_seq", "layer_tok", "layer_sq", "in", "in_tok", "head",
            "head_tok", "head_row")  # fmt: skip


def _chunk_features(layers: int, lens, first: bool, last: bool, rows: int) -> list[float]:
    n, k = float(sum(lens)), float(len(lens))
    sq = float(sum(x * x for x in lens))
    f, l_ = float(first), float(last)
    return [1.0, layers, layers * (k - 1), layers * n, layers * sq, f, f * n, l_, l_ * n, l_ * rows]


def calibrate_module(
    module, mllm, args, pg, task, device, grid_points, edge_points, reps, ref
) -> tuple[LayerTimeModel, dict]:
    """Measure one module's chunks and fit its table jointly.

    Measured: middle blocks of 1 and 2 layers over the grid (the layers and the chunk call),
    and the real first, last and whole chunks (``build_chunk``) on microbatches from the
    trainer's ``build_microbatch`` over the edge grid (the input layer and the head; encoder
    items pooled 4:1 and 1:1 into LLM rows). One non-negative least-squares fit on relative
    errors over all of them gives every coefficient, so that the parts add up to the chunks the
    trainer runs (fitting layers first and edges from what is left would push the layer fit's
    errors into the edges).
    """
    from megatron.mllm.batch import build_microbatch
    from megatron.mllm.chunks import ChunkId, build_chunk

    total = mllm.num_layers(module)
    h = mllm.language.hidden_size if module == "llm" else mllm.encoders[module].hidden_size
    dtype = mllm.language.params_dtype
    fns, feats, keep = [], [], []

    def add_block(layers: int, points) -> None:
        block = _middle_block(mllm, module, layers, pg).to(device)
        block.train()
        keep.append(ddp_wrap(block, args, pg))
        for n, k in points:
            lens = [n] * k
            psp = _psp(lens, device)

            def fwd(measure_memory, lens=lens, psp=psp, block=block):
                x = torch.randn(sum(lens), 1, h, device=device, dtype=dtype, requires_grad=True)
                rec = SavedBytes(block)

                def run():
                    with _saving(rec, measure_memory):
                        out = block.block(x, attention_mask=None, packed_seq_params=psp)
                    return out, rec.total

                return run

            fns.append(fwd)
            feats.append(_chunk_features(layers, lens, False, False, 0))

    add_block(1, grid_points)
    add_block(2, grid_points[::2])
    chunk_ids = {
        ChunkId(module, 0, 1),
        ChunkId(module, total - 1, total),
        ChunkId(module, 0, total),
    }
    tensors = {}
    for cid in sorted(chunk_ids, key=lambda c: (c.start, c.stop)):
        chunk = build_chunk(mllm, cid, pg).to(device)
        chunk.train()
        keep.append(ddp_wrap(chunk, args, pg))
        tensors[(cid.start, cid.stop)] = (
            _count_tensors(chunk, layers=False),
            sum(1 for n, _ in chunk.named_parameters() if n.startswith("block.layers.0.")),
        )
        # Encoder heads pool items into LLM rows: two pooling ratios separate the per-token
        # (pooling) from the per-row (projector) costs.
        pools = (4, 1) if chunk.is_last and module != "llm" else (4,)
        for n, k, pool in [(n, k, pool) for n, k in edge_points for pool in pools]:
            samples = [_sample(module, n, i, pool) for i in range(k)]
            payloads = [task.payload(s, 1000 + i) for i, s in enumerate(samples)]
            mb = build_microbatch(list(zip(samples, payloads)), list(mllm.encoders), device=device)
            enc = mb.encoders.get(module)
            lens = list(enc.unit_lens if module != "llm" else mb.language.seq_lens)
            rows = enc.num_rows if module != "llm" else 0

            def fwd(measure_memory, chunk=chunk, mb=mb, enc=enc, lens=lens):
                hidden = None
                if not chunk.is_first:
                    hidden = torch.randn(
                        sum(lens), 1, h, device=device, dtype=dtype, requires_grad=True
                    )
                rec = SavedBytes(chunk)

                def run():
                    with _saving(rec, measure_memory):
                        if module == "llm":
                            out = chunk(hidden, mb.language, {})
                        else:
                            out = chunk(hidden, enc)
                    return out, rec.total

                return run

            fns.append(fwd)
            feats.append(
                _chunk_features(cid.stop - cid.start, lens, chunk.is_first, chunk.is_last, rows)
            )
    f, b, m = measure_round_robin(fns, device, reps, ref)
    del keep
    if os.environ.get("SEMU_CALIBRATION_DUMP"):  # raw points, for looking at the fit
        with open(os.environ["SEMU_CALIBRATION_DUMP"], "a", encoding="utf-8") as out:
            for x, tf, tb, tm in zip(feats, f, b, m):
                out.write(json.dumps({"module": module, "x": x, "f": tf, "b": tb, "m": tm}) + "\n")
    a = np.array(feats)
    cf = dict(zip(_COLUMNS, relative_nnls(a, np.array(f))))
    cb = dict(zip(_COLUMNS, relative_nnls(a, np.array(b))))
    # Bytes have no fixed parts: per token, per squared length, per row.
    mem_cols = ["layer_tok", "layer_sq", "in_tok", "head_tok", "head_row"]
    idx = [_COLUMNS.index(c) for c in mem_cols]
    cm = dict(zip(mem_cols, nnls(a[:, idx], np.array(m, dtype=float))))
    err_f = np.abs(a @ np.array([cf[c] for c in _COLUMNS]) / np.array(f) - 1)
    err_b = np.abs(a @ np.array([cb[c] for c in _COLUMNS]) / np.array(b) - 1)
    print(
        f"  {module}: {len(fns)} chunk shapes, fit error forward median {np.median(err_f):.1%} "
        f"(max {err_f.max():.1%}), backward median {np.median(err_b):.1%} "
        f"(max {err_b.max():.1%})",
        flush=True,
    )
    head_tensors, _ = tensors[(total - 1, total)]
    input_tensors, layer_tensors = tensors[(0, 1)]
    if total == 1:  # one chunk holds both ends: its non-layer tensors count once
        input_tensors = 0
    ratio = float(sum(b) / max(sum(f), 1e-12))

    def per_token_edge(c: dict, which: str) -> float:
        # For readers of the per-token summary only (the balancer's cost model): the edge's
        # forward per token at a typical size of the grid, its fixed cost included.
        n = float(np.median([p[0] * p[1] for p in edge_points]))
        return c[which] / n + c[which + "_tok"]

    table = LayerTimeModel(
        const_s=cf["layer"],
        linear_s=cf["layer_tok"],
        quadratic_s=cf["layer_sq"],
        backward_ratio=ratio,
        edge_s_per_token=per_token_edge(cf, "head")
        + (per_token_edge(cf, "in") if total > 1 else 0),
        per_sequence_s=cf["layer_seq"],
        input_s_per_token=cf["in_tok"],
        head_s_per_token=cf["head_tok"],
        act_bytes_per_token=cm["layer_tok"],
        act_bytes_per_token_sq=cm["layer_sq"],
        input_act_bytes_per_token=cm["in_tok"],
        head_act_bytes_per_token=cm["head_tok"],
        backward_const_s=cb["layer"],
        backward_linear_s=cb["layer_tok"],
        backward_quadratic_s=cb["layer_sq"],
        backward_per_sequence_s=cb["layer_seq"],
        input_const_s=cf["in"],
        head_const_s=cf["head"],
        head_s_per_row=cf["head_row"],
        input_backward_const_s=cb["in"],
        input_backward_s_per_token=cb["in_tok"],
        head_backward_const_s=cb["head"],
        head_backward_s_per_token=cb["head_tok"],
        head_backward_s_per_row=cb["head_row"],
        head_act_bytes_per_row=cm["head_row"],
        layer_param_tensors=layer_tensors,
        input_param_tensors=input_tensors,
        head_param_tensors=head_tensors,
        chunk_const_s=cf["chunk"],
        backward_chunk_const_s=cb["chunk"],
    )
    # Compute efficiency of the layer at the largest measured size (for the analytic model).
    shape = mllm.shape().module(module)
    big = [grid_points[-1][0]] * grid_points[-1][1]
    flops = shape.forward_flops(big, layers=1)
    # In reference units: divided by the reference's seconds once the calibration is done.
    info = {
        "layer_flops_per_ref": flops / max(table.forward_packed_s(big), 1e-12),
        "hidden_size": h,
    }
    return table, info


def measure_hardware(device, dtype, quick: bool) -> dict[str, float]:
    """Matmul FLOP/s and copy bandwidth of the device."""
    n = 256 if quick else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    reps = 3 if quick else 10
    a @ b
    _sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    flops = 2 * n**3 * reps / (time.perf_counter() - t)
    x = torch.randn(4_000_000 if quick else 32_000_000, device=device, dtype=dtype)
    y = torch.empty_like(x)
    y.copy_(x)
    _sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    _sync(device)
    bw = 2 * x.numel() * x.element_size() * reps / (time.perf_counter() - t)
    return {"peak_flops": float(flops), "hbm_bandwidth": float(bw)}


def measure_host(task, mllm, args, device, quick: bool, ref: Reference) -> dict[str, float]:
    """Building microbatches, per sample and per encoder feature element (reference units)."""
    from megatron.mllm.batch import build_microbatch
    from megatron.mllm.data import SampleSource

    source = SampleSource(args.workload, args.workload_seed, args.workload_token_scale)
    count = 4 if quick else 24
    rounds = 1 if quick else 3
    rows, times = [], [[] for _ in range(count)]
    for rnd in range(rounds):
        for i in range(count):
            metas = [source.meta(1000 * i + j) for j in range(args.micro_batch_size)]
            r = ref.time()
            t = time.perf_counter()
            samples = [(m, task.payload(m, 1000 * i + j)) for j, m in enumerate(metas)]
            build_microbatch(samples, list(mllm.encoders), device=device)
            times[i].append((time.perf_counter() - t) / r)
            if rnd == 0:
                feats = sum(
                    sum(m.encoder_units(e)) * task.input_dims[e]
                    for m in metas
                    for e in mllm.encoders
                )
                rows.append([float(len(metas)), float(feats)])
    coef = nnls(np.array(rows), np.array([statistics.median(t) for t in times]))
    return {"sample_s": float(coef[0]), "feature_s_per_element": float(coef[1])}


# Chunk sets the optimizer is timed on: sizes from one layer to the whole model, none of them
# a stage of the accuracy benchmark's layouts (the whole model, or PP = 2's two stages).
_OPTIMIZER_SETS = (
    (("llm", 0, 1),),
    (("llm", 0, 3),),
    (("llm", 1, 4),),
    (("vision", 0, 2),),
    (("audio", 0, 1), ("llm", 1, 2)),
    (("vision", 0, 2), ("audio", 0, 2), ("llm", 0, 1)),
    (("vision", 0, 1), ("audio", 0, 2), ("llm", 0, 3)),
)


def measure_optimizer(mllm, args, pg, device, modules, reps: int, ref: Reference) -> dict:
    """megatron-core's optimizer step over chunk sets: fixed, per tensor and per parameter
    (reference units)."""
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.transformer.module import MegatronModule
    from megatron.mllm.chunks import ChunkId, build_chunk
    from megatron.mllm.training import _optimizer_config

    class Stage(MegatronModule):
        def __init__(self, chunks):
            super().__init__(config=mllm.language)
            self.chunks = torch.nn.ModuleList(chunks)

    cases = []
    gen = torch.Generator().manual_seed(0)
    for chunk_set in _OPTIMIZER_SETS:
        if any(m not in modules or stop > mllm.num_layers(m) for m, _, stop in chunk_set):
            continue
        stage = Stage([build_chunk(mllm, ChunkId(*c), pg) for c in chunk_set]).to(device)
        ddp = ddp_wrap(stage, args, pg)
        opt = get_megatron_optimizer(
            _optimizer_config(args), [ddp], use_gloo_process_groups=False, pg_collection=pg
        )
        params = [p for p in stage.parameters() if p.requires_grad]
        for p in params:  # gradients with a norm above the clip, as early in training
            p.main_grad.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        cases.append((opt, len(params), sum(p.numel() for p in params)))
    if len(cases) < 2:
        return {}
    times = [[] for _ in cases]
    for opt, _, _ in cases:
        opt.step()
    for _ in range(reps):
        for i, (opt, _, _) in enumerate(cases):
            r = ref.time()
            _sync(device)
            t = time.perf_counter()
            opt.step()
            _sync(device)
            times[i].append((time.perf_counter() - t) / r)
    a = np.array([[1.0, float(n), float(p)] for _, n, p in cases])
    fixed, per_tensor, per_param = relative_nnls(a, np.array([statistics.median(t) for t in times]))
    return {
        "optimizer_step_s": float(fixed),
        "optimizer_s_per_tensor": float(per_tensor),
        "optimizer_s_per_param": float(per_param),
    }


def measure_trainer(
    model_path: str, cal: Calibration, workloads, iters: int, warmup: int, ref: Reference
) -> dict:
    """What a real step adds to the measured parts: glue, fixed costs, context.

    Builds the trainer in this process (world size 1, PP = 1, the megatron schedule, no
    post-balancing) on each calibration workload and runs short training: every
    ``forward_step``, ``backward_step``, ``Trainer.microbatches`` and ``optimizer.step`` is
    timed, each iteration normalised by reference passes right before and after it. Returns
    (reference units):

    * ``forward_step_s`` / ``backward_step_s``: megatron-core's ``forward_step`` /
      ``backward_step`` on a microbatch minus the same microbatch run directly through the
      DDP-wrapped stage model (forward, the trainer's loss, the engine backward), measured
      round-robin on the workloads' microbatches: the schedule's glue, free of the fit's errors;
    * ``step_s``: the step minus its microbatches, schedule calls and optimizer step (zeroing
      the grad buffers, finalize_model_grads, the scheduler, the loss reduction, the checks);
    * ``optimizer_context`` / ``host_context``: the optimizer step and the microbatch building
      as measured inside the steps over what the isolated fits predict for them (in a step the
      optimizer follows the backward and finds colder caches than in isolation); the fits'
      coefficients are scaled by them.

    It also prints how far the fitted chunks are from the measured ``forward_step`` /
    ``backward_step`` times of the workloads (not used: a check of the fit).
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules
    from megatron.mllm import training
    from pipeweaver.generators import generate
    from pipeweaver.ir import Compute, Kind
    from pipeweaver.placement import Placement
    from pipeweaver.semu.batches import pack_microbatch, structure_of
    from pipeweaver.semu.hardware import DEVICES, ClusterSpec
    from pipeweaver.semu.simulator import Semu

    record: dict[str, list] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                record.setdefault(name, []).append(time.perf_counter() - t)

        return wrapper

    saved = (schedules.forward_step, schedules.backward_step)
    fit_f, fit_b, step_rest, opt_ratio, host_ratio = [], [], [], [], []
    glue_f, glue_b = [], []
    try:
        for workload in workloads:
            spec = load_model_config(model_path, {"workload": workload})
            semu = Semu(spec, ClusterSpec(DEVICES["cpu"], 1, devices_per_node=1), cal)
            flags = dict(spec.flags)
            flags.update({**TRAINING_FLAGS, "train-iters": iters, "post-balance": "none",
                          "pipeline-schedule": "megatron", "workload": workload})  # fmt: skip
            if parallel_state.model_parallel_is_initialized():
                parallel_state.destroy_model_parallel()
            trainer = training.Trainer(_parse(flags, world_size=1))
            trainer.microbatches = timed("microbatches", trainer.microbatches)
            trainer.optimizer.step = timed("optimizer", trainer.optimizer.step)
            schedules.forward_step = timed("forward_step", saved[0])
            schedules.backward_step = timed("backward_step", saved[1])
            enc = list(spec.shape.encoders)
            placement = Placement.baseline(1, spec.layers())
            static = semu.static_bytes(placement)[0]
            tensors = semu.cost.rank_param_tensors(placement, 0)
            for it in range(iters):
                record.clear()
                r0 = ref.time()
                t = time.perf_counter()
                trainer.train_step(it)
                total = time.perf_counter() - t
                r = (r0 + ref.time()) / 2
                if it < warmup:
                    continue
                total /= r
                for v in record.values():
                    v[:] = [x / r for x in v]
                idx = trainer.global_batch_indices(it)[0]
                mbs = [pack_microbatch([trainer.source.meta(k) for k in mb], enc) for mb in idx]
                sched = generate("none", placement, structure_of(mbs, enc))
                pred = {(j, kind): 0.0 for j in range(len(mbs)) for kind in "FB"}
                for a in sched.actions[0]:
                    if type(a) is Compute:
                        c = semu.compute_cost(placement, a, mbs[a.microbatch]).time_s
                        pred[(a.microbatch, "F" if a.kind is Kind.F else "B")] += c
                for j, (f, b) in enumerate(zip(record["forward_step"], record["backward_step"])):
                    fit_f.append(f / pred[(j, "F")] - 1)
                    fit_b.append(b / pred[(j, "B")] - 1)
                step_rest.append(
                    total
                    - sum(record["microbatches"])
                    - sum(record["forward_step"])
                    - sum(record["backward_step"])
                    - sum(record["optimizer"])
                )
                opt_ratio.append(
                    sum(record["optimizer"])
                    / semu.cost.optimizer_time(static["params"], 1, tensors)
                )
                host_ratio.append(sum(record["microbatches"]) / semu.host_time(mbs, 0))
            schedules.forward_step, schedules.backward_step = saved
            gf, gb = _schedule_glue(trainer, iters, reps=5, ref=ref)
            glue_f += gf
            glue_b += gb
            del trainer
    finally:
        schedules.forward_step, schedules.backward_step = saved
    med = statistics.median
    sec = ref.seconds * 1e3  # for the printout: ms at the typical speed so far
    print(
        f"  trainer runs ({', '.join(workloads)}): forward_step glue {med(glue_f) * sec:.2f} ms, "
        f"backward_step glue {med(glue_b) * sec:.2f} ms per microbatch; step rest "
        f"{med(step_rest) * sec:.1f} ms; optimizer in steps x{med(opt_ratio):.2f} the isolated "
        f"fit, microbatch building x{med(host_ratio):.2f}; forward_step/backward_step vs the "
        f"fitted chunks: median {med(fit_f):+.1%}/{med(fit_b):+.1%}",
        flush=True,
    )
    return {
        "forward_step_s": float(max(0.0, med(glue_f))),
        "backward_step_s": float(max(0.0, med(glue_b))),
        "step_s": float(max(0.0, med(step_rest))),
        "optimizer_context": float(med(opt_ratio)),
        "host_context": float(med(host_ratio)),
    }


def _schedule_glue(trainer, iters: int, reps: int, ref: Reference) -> tuple[list, list]:
    """Per microbatch, megatron-core's forward_step/backward_step minus the direct run of the
    same microbatch through the trainer's DDP model (reference units), measured round-robin."""
    from megatron.core.pipeline_parallel import schedules

    config = trainer.mllm.language
    mbs = trainer.microbatches(trainer.global_batch_indices(iters)[0])

    def via_schedule(mb):
        t0 = time.perf_counter()
        out, _ = schedules.forward_step(
            trainer._forward_step, iter([mb]), trainer.ddp_model, len(mbs), None, [], config, 1,
            is_last_stage=True,
        )  # fmt: skip
        t1 = time.perf_counter()
        schedules.backward_step(None, out, None, config)
        return t1 - t0, time.perf_counter() - t1

    def direct(mb):
        t0 = time.perf_counter()
        out, loss_func = trainer._forward_step(iter([mb]), trainer.ddp_model)
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


# ------------------------------------------------------------------------ two processes


def parallel_worker(model_path: str, out: str, threads: int, reps: int) -> None:
    """One of two torchrun ranks: P2P, all-reduce and paired-compute timings (rank 0 writes)."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.mllm.chunks import ChunkId, build_chunk
    from megatron.mllm.config import mllm_config_from_args

    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = load_model_config(model_path)
    flags = dict(spec.flags)
    flags.update({"tensor-model-parallel-size": 1, "pipeline-model-parallel-size": 2,
                  **TRAINING_FLAGS, "train-iters": 1})  # fmt: skip
    args = _parse(flags, world_size=2)
    mllm = mllm_config_from_args(args)
    h = mllm.language.hidden_size
    dtype = mllm.language.params_dtype

    # DP = 2: the gradient all-reduce as the trainer runs it, megatron-core DDP's
    # finish_grad_sync (called by finalize_model_grads) on grad buffers of several sizes; its
    # DP = 1 remainder is part of step_s (trainer stage).
    from megatron.core.transformer.module import MegatronModule

    parallel_state.initialize_model_parallel(1, 1)
    cpu_shim.model_parallel_manual_seed(1)
    pg = ProcessGroupCollection.use_mpu_process_groups()

    class Flat(MegatronModule):
        def __init__(self, numel: int):
            super().__init__(config=mllm.language)
            # A dozen tensors, like a layer's: per-tensor work is part of the real buffers.
            self.params = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.zeros(numel // 12)) for _ in range(12)]
            )

    ar_sizes = [2**12, 2**16, 2**18, 2**20, 2**22]  # fp32 elements: 16 KiB .. 16 MiB
    ddps = [ddp_wrap(Flat(s), args, pg) for s in ar_sizes]
    ar_times = {s: [] for s in ar_sizes}
    for r in range(reps + 1):
        for s, ddp in zip(ar_sizes, ddps):
            for p in ddp.module.parameters():
                p.main_grad.fill_(1.0)
            dist.barrier()
            t = time.perf_counter()
            ddp.finish_grad_sync()
            if r:
                ar_times[s].append(time.perf_counter() - t)
    ar_bytes = np.array([4.0 * s for s in ar_sizes])
    ar_t = np.array([statistics.median(ar_times[s]) for s in ar_sizes])
    n = 2
    ar_lat, ar_inv_bw = relative_nnls(
        np.column_stack([np.full_like(ar_bytes, 2 * (n - 1)), 2 * (n - 1) / n * ar_bytes]), ar_t
    )
    del ddps
    parallel_state.destroy_model_parallel()

    # PP = 2: megatron-core's P2P communicator, as the baseline 1F1B schedule uses it; a
    # ping-pong of [S, 1, h] activations, one transfer = half a round trip.
    parallel_state.initialize_model_parallel(1, 2)
    cpu_shim.model_parallel_manual_seed(1)
    pg = ProcessGroupCollection.use_mpu_process_groups()
    p2p = P2PCommunicator(pg.pp, mllm.language)
    sizes = [16, 128, 512, 2048]
    p2p_times = {s: [] for s in sizes}
    for r in range(reps + 1):
        for s in sizes:
            shape = (s, 1, h)
            x = torch.randn(shape, dtype=dtype)
            dist.barrier()
            t = time.perf_counter()
            for _ in range(4):
                if rank == 0:
                    p2p.send_forward(x, False)
                    p2p.recv_backward(shape, False)
                else:
                    y = p2p.recv_forward(shape, False)
                    p2p.send_backward(y, False)
            if r:
                p2p_times[s].append((time.perf_counter() - t) / 8)
    p2p_bytes = np.array([float(s * h * torch.finfo(dtype).bits // 8) for s in sizes])
    p2p_t = np.array([statistics.median(p2p_times[s]) for s in sizes])
    lat, inv_bw = relative_nnls(np.column_stack([np.ones_like(p2p_bytes), p2p_bytes]), p2p_t)

    # Paired compute: one rank computes alone (the other sleeps: a rank waiting in gloo uses no
    # CPU), then both at once; roles alternate. Work: a layer forward and backward through DDP,
    # the trainer's dominant cost.
    chunk = build_chunk(mllm, ChunkId("llm", 0, 1), pg)
    chunk.train()

    ddp = ddp_wrap(chunk, args, pg)  # noqa: F841  (keeps the hooks)
    lens = [64, 64, 128]
    psp = _psp(lens, torch.device("cpu"))

    def work() -> float:
        t = time.perf_counter()
        for _ in range(3):
            x = torch.randn(sum(lens), 1, h, dtype=dtype, requires_grad=True)
            out = chunk.run_layers(x, psp)
            engine_backward(out, torch.ones_like(out))
        return time.perf_counter() - t

    work()
    solo, paired = [], []
    for r in range(4 * reps):
        for phase in ("solo", "paired"):
            dist.barrier()
            active = phase == "paired" or rank == r % 2
            if active:
                t = work()
                (paired if phase == "paired" else solo).append(t)
            else:
                time.sleep(0.0)
            dist.barrier()
    pair = torch.tensor([statistics.median(solo) if solo else 0.0, statistics.median(paired)])
    gathered = [torch.zeros(2) for _ in range(2)]
    dist.all_gather(gathered, pair)
    slowdown = statistics.mean(float(g[1] / g[0]) for g in gathered if g[0] > 0)
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "comm": {
                        "p2p_latency_s": float(lat),
                        "p2p_bandwidth": float(1.0 / inv_bw) if inv_bw > 0 else 1e12,
                        "allreduce_latency_s": float(ar_lat),
                        "allreduce_bandwidth": float(1.0 / ar_inv_bw) if ar_inv_bw > 0 else 1e12,
                    },
                    "shared_node_slowdown": max(1.0, slowdown),
                    "raw": {
                        "p2p_s": dict(zip(map(str, sizes), p2p_t.tolist())),
                        "allreduce_s": dict(zip(map(str, ar_sizes), ar_t.tolist())),
                        "solo_s": [float(g[0]) for g in gathered],
                        "paired_s": [float(g[1]) for g in gathered],
                    },
                },
                f,
            )
    dist.barrier()
    dist.destroy_process_group()


def measure_parallel(model_path: str, threads: int, reps: int) -> dict:
    """Run :func:`parallel_worker` on two torchrun ranks; return its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "parallel.json")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.setdefault("PYTHONWARNINGS", "ignore")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(_free_port()), os.path.abspath(__file__),
               "--parallel-worker", out, "--model", model_path, "--threads", str(threads),
               "--reps", str(reps)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=_REPO_ROOT)
        if proc.returncode != 0 or not os.path.isfile(out):
            raise RuntimeError(f"the two-process measurement failed:\n{proc.stderr[-3000:]}")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def device_name(device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu: {name} x {torch.get_num_threads()} threads"


def grid_points(lengths, packs, max_tokens: int):
    """``(n, k)`` pairs of the grid: ``k`` packed sequences of ``n`` tokens, at most
    ``max_tokens`` in a call."""
    return [(n, k) for n in lengths for k in packs if n * k <= max_tokens]


def make_reference(mllm, args, pg, device) -> Reference:
    """The reference pass: one LLM layer, DDP-wrapped, forward and backward on 2 x 32 tokens."""
    from megatron.mllm.chunks import ChunkId, build_chunk

    chunk = build_chunk(mllm, ChunkId("llm", 0, 1), pg).to(device)
    chunk.train()
    ddp = ddp_wrap(chunk, args, pg)
    lens = [32, 32]
    psp = _psp(lens, device)
    h, dtype = mllm.language.hidden_size, mllm.language.params_dtype

    def fwd(measure_memory, _keep=ddp):
        x = torch.randn(sum(lens), 1, h, device=device, dtype=dtype, requires_grad=True)
        return lambda: (chunk.run_layers(x, psp), 0)

    ref = Reference(fwd, device)
    for _ in range(3):  # warm-up, not recorded
        _timed_pass(fwd, device)
    return ref


def run(
    model_path: str,
    quick: bool,
    reps: int,
    lengths,
    packs,
    modules=None,
    stages=STAGES,
    workloads=(),
    threads: int = 1,
    max_tokens: int = 2048,
) -> Calibration:
    """Measure everything and return the calibration."""
    from megatron.mllm.data import SyntheticTask

    spec = load_model_config(model_path)
    args, mllm, pg = setup(dict(spec.flags))
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    task = SyntheticTask(
        vocab_size=args.vocab_size,
        num_classes=args.synthetic_num_classes,
        input_dims={name: enc.input_dim for name, enc in mllm.encoders.items()},
        seed=args.workload_seed,
    )
    torch.manual_seed(0)
    hardware = measure_hardware(device, mllm.language.params_dtype, quick)
    ref = make_reference(mllm, args, pg, device)
    modules = list(modules or [*mllm.encoders, "llm"])
    tables, infos = {}, {}
    for module in modules:
        t0 = time.perf_counter()
        # LLM sequences never exceed --seq-length (the position embedding's size); encoder
        # units may (images of many patches).
        lens_m = [n for n in lengths if module != "llm" or n <= args.seq_length]
        # The whole chunks need fewer points than the layers: every other length and pack.
        edge_lengths = sorted(set(lens_m[::2]) | {lens_m[-1]})
        edge_packs = sorted(set(packs[::2]))
        tables[module], infos[module] = calibrate_module(
            module,
            mllm,
            args,
            pg,
            task,
            device,
            grid_points(lens_m, packs, max_tokens),
            grid_points(edge_lengths, edge_packs, max_tokens),
            reps,
            ref,
        )
        print(f"  {module}: layers and edges in {time.perf_counter() - t0:.0f} s", flush=True)
    host: dict[str, float] = {}
    comm: dict[str, float] = {}
    if "optimizer" in stages:
        host.update(measure_optimizer(mllm, args, pg, device, modules, reps, ref))
    if "host" in stages:
        host.update(measure_host(task, mllm, args, device, quick, ref))
    model = {
        m: {"hidden_size": infos[m]["hidden_size"], "num_layers": mllm.num_layers(m)}
        for m in tables
    }
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cal = Calibration(
        device=device_name(device),
        modules=tables,
        model=model,
        source=(
            f"tools/calibrate.py {stamp} model {os.path.relpath(model_path, _REPO_ROOT)} "
            f"lengths {list(lengths)} packs {list(packs)} max tokens {max_tokens} reps {reps} "
            f"threads {threads} stages {','.join(s for s in STAGES if s in stages)}"
            + (f" trainer workloads {','.join(workloads)}" if "trainer" in stages else "")
            + (" (quick)" if quick else "")
        ),
        hardware=hardware,
        host=host,
        comm=comm,
    )
    complete = set(modules) >= {*mllm.encoders, "llm"}
    if "trainer" in stages and complete and workloads:
        found = measure_trainer(model_path, cal, list(workloads), 8, 2, ref)
        opt_ctx, host_ctx = found.pop("optimizer_context"), found.pop("host_context")
        for k in ("optimizer_step_s", "optimizer_s_per_tensor", "optimizer_s_per_param"):
            if k in host:
                host[k] *= opt_ctx
        for k in ("sample_s", "feature_s_per_element"):
            if k in host:
                host[k] *= host_ctx
        host.update(found)
    # Everything above is in reference units: convert at the machine's typical speed.
    cal = scale(cal, ref.seconds)
    cal.efficiency = {
        "compute": min(
            1.0,
            statistics.median(i["layer_flops_per_ref"] for i in infos.values())
            / ref.seconds
            / hardware["peak_flops"],
        )
    }
    print(
        f"  reference pass: median {ref.seconds * 1e3:.2f} ms over {len(ref.samples)} passes "
        f"(10-90%: {np.percentile(ref.samples, 10) * 1e3:.2f}-"
        f"{np.percentile(ref.samples, 90) * 1e3:.2f} ms)",
        flush=True,
    )
    if "parallel" in stages and device.type == "cpu":
        par = measure_parallel(model_path, threads, reps)
        cal.comm.update(par["comm"])
        cal.host["shared_node_slowdown"] = float(par["shared_node_slowdown"])
        raw = par["raw"]
        print(
            f"  two processes: p2p {cal.comm['p2p_latency_s'] * 1e6:.0f} us + "
            f"{cal.comm['p2p_bandwidth'] / 1e9:.2f} GB/s; all-reduce "
            f"{cal.comm['allreduce_latency_s'] * 1e6:.0f} us x 2(n-1) + "
            f"{cal.comm['allreduce_bandwidth'] / 1e9:.2f} GB/s; paired compute x"
            f"{cal.host['shared_node_slowdown']:.3f} (solo {raw['solo_s']}, paired "
            f"{raw['paired_s']})",
            flush=True,
        )
    return cal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model config (trainer flags)")
    parser.add_argument("--output", default="calibration.json", help="where to write the JSON")
    parser.add_argument("--quick", action="store_true", help="tiny grid (tests)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per point")
    parser.add_argument("--lengths", default=None, help="sequence lengths, e.g. 16,64,256")
    parser.add_argument("--packs", default=None, help="sequences packed per call, e.g. 1,2,4")
    parser.add_argument("--modules", default=None, help="subset, e.g. llm,vision")
    parser.add_argument(
        "--max-tokens", type=int, default=2048, help="largest grid point (tokens in one call)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("SEMU_CALIBRATION_THREADS", "1")),
        help="torch threads per process (the main job runs OMP_NUM_THREADS=1 per rank)",
    )
    parser.add_argument(
        "--stages",
        default=None,
        help=f"subset of {','.join(STAGES)} (default all; --quick: layers,optimizer,host)",
    )
    parser.add_argument(
        "--workloads",
        default=DEFAULT_WORKLOADS,
        help="workloads of the trainer stage (keep the accuracy benchmark's out of it)",
    )
    parser.add_argument("--parallel-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    reps = args.reps or (1 if args.quick else 7)
    if args.parallel_worker:
        parallel_worker(args.model, args.parallel_worker, args.threads, reps)
        return 0
    lengths = [
        int(x)
        for x in (args.lengths or ("8,32" if args.quick else "8,16,32,64,128,256,512")).split(",")
    ]
    packs = [int(x) for x in (args.packs or ("1,2" if args.quick else "1,2,4,8,16,32")).split(",")]
    modules = args.modules.split(",") if args.modules else None
    stages = (
        args.stages.split(",")
        if args.stages
        else (["layers", "optimizer", "host"] if args.quick else list(STAGES))
    )
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {','.join(STAGES)}")
    workloads = [w for w in args.workloads.split(",") if w]
    try:
        cal = run(
            args.model,
            args.quick,
            reps,
            lengths,
            packs,
            modules,
            stages,
            workloads,
            args.threads,
            args.max_tokens,
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    cal.save(args.output)
    print(f"wrote {args.output}: {cal.device}")
    for m, t in cal.modules.items():
        print(
            f"  {m:6s} layer fwd {t.const_s * 1e6:.1f} us + {t.linear_s * 1e9:.2f} ns/token + "
            f"{t.quadratic_s * 1e12:.3f} ps/token^2 (+{t.per_sequence_s * 1e6:.1f} us/sequence), "
            f"bwd {t.backward_const_s * 1e6:.1f} us + {t.backward_linear_s * 1e9:.2f} ns/token "
            f"(x{t.backward_ratio:.2f} on the grid), activations {t.act_bytes_per_token:.0f} "
            f"B/token/layer; input {t.input_const_s * 1e6:.0f} us + "
            f"{(t.input_s_per_token or 0) * 1e9:.0f} ns/token, head {t.head_const_s * 1e6:.0f} "
            f"us + {(t.head_s_per_token or 0) * 1e9:.0f} ns/token + {t.head_s_per_row * 1e9:.0f} "
            f"ns/row"
        )
    if cal.host:
        print("  host: " + ", ".join(f"{k} {v:.3g}" for k, v in cal.host.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

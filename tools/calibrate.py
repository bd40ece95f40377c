#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Measure OrchWeave's modules on this device and write the calibration JSON SEMU reads.

Usage (from the repository root)::

    python tools/calibrate.py [--model scripts/configs/cpu-main.json] [--output F.json]
                              [--quick] [--reps N] [--lengths 16,64,256] [--packs 1,2,4]

It builds the trainer's own chunks (``megatron.mllm.chunks.build_chunk``) from the model
config's flags, in one process (gloo, world size 1), on the current device (CPU, or the GPU when
CUDA is available), and measures for each module (vision, audio, llm):

* one transformer layer (``chunk.run_layers`` on THD-packed hidden states) over a grid of
  ``k`` packed sequences of ``n`` tokens, forward and backward; the forward is fitted as
  ``const + per_sequence * (k-1) + linear * N + quadratic * sum(n_i**2)`` (non-negative least
  squares), the backward as a ratio of the forward;
* the input layer and the head (whole first and last chunks on batches from the trainer's own
  ``build_microbatch``, minus the fitted layer time), per token;
* the activation bytes each keeps for backward (``torch.autograd.graph.saved_tensors_hooks``:
  unique storages saved, parameters excluded), fitted per token and per squared length;

plus the device's matmul FLOP/s and copy bandwidth (``hardware``), the compute efficiency of the
layers' matrix multiplies relative to that peak (``efficiency``), and the host costs of a step
(``host``): building a sample's payload and microbatch, generating encoder features, one Adam
step per parameter. ``--quick`` is a tiny grid for tests. Timings on a busy machine are wrong:
calibrate on a quiet one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import platform
import socket
import statistics
import sys
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(flags: dict):
    """torch.distributed (one gloo rank), megatron parallel state, the trainer's model config."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.mllm.arguments import parse_arguments
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
    argv = flags_to_argv(flags) + ["--distributed-backend", "gloo", "--transformer-impl", "local"]
    with contextlib.redirect_stdout(io.StringIO()):  # Megatron prints every argument
        args = parse_arguments(argv, world_size=1)
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


def _measure(fn_forward, device, reps: int) -> tuple[float, float, int]:
    """Median forward and backward seconds of ``fn_forward() -> output``, and saved bytes."""
    fwd, bwd, saved = [], [], 0
    for i in range(reps + 1):
        _sync(device)
        t0 = time.perf_counter()
        if i == 0:
            out, saved = fn_forward(measure_memory=True)
        else:
            out, _ = fn_forward(measure_memory=False)
        _sync(device)
        t1 = time.perf_counter()
        out.backward(torch.ones_like(out))
        _sync(device)
        t2 = time.perf_counter()
        if i > 0:  # the first run warms up allocators and kernels
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd), statistics.median(bwd), saved


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


def _features(lens_list):
    rows = []
    for lens in lens_list:
        rows.append([1.0, len(lens) - 1.0, float(sum(lens)), float(sum(n * n for n in lens))])
    return np.array(rows)


def _sample(module: str, n: int, idx: int) -> SampleMeta:
    """A sample whose ``module`` work is one sequence/unit of ``n`` tokens."""
    if module == "llm":
        return SampleMeta(f"cal-{idx}", text_tokens=n)
    item = Item(units=(n,), llm_tokens=max(1, n // 4))
    key = "image" if module == "vision" else "audio"
    return SampleMeta(f"cal-{idx}", text_tokens=4, **{key: (item,)})


def calibrate_module(
    module, mllm, pg, task, device, lengths, packs, reps
) -> tuple[LayerTimeModel, dict]:
    """Measure one module: a layer over the grid, then its first and last chunks."""
    from megatron.mllm.batch import build_microbatch
    from megatron.mllm.chunks import ChunkId, build_chunk

    total = mllm.num_layers(module)
    h = mllm.language.hidden_size if module == "llm" else mllm.encoders[module].hidden_size
    dtype = mllm.language.params_dtype
    # A layer alone: the first chunk's block (its run_layers skips the input layer).
    layer = build_chunk(mllm, ChunkId(module, 0, 1), pg).to(device)
    layer.train()
    grid, f_times, b_times, mems = [], [], [], []
    for n in lengths:
        for k in packs:
            lens = [n] * k
            psp = _psp(lens, device)

            def fwd(measure_memory, lens=lens, psp=psp):
                x = torch.randn(sum(lens), 1, h, device=device, dtype=dtype, requires_grad=True)
                if not measure_memory:
                    return layer.run_layers(x, psp), 0
                rec = SavedBytes(layer)
                with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
                    out = layer.run_layers(x, psp)
                return out, rec.total

            f, b, m = _measure(fwd, device, reps)
            grid.append(lens)
            f_times.append(f)
            b_times.append(b)
            mems.append(m)
    a = _features(grid)
    const, per_seq, lin, quad = nnls(a, np.array(f_times))
    ratio = float(sum(b_times) / max(sum(f_times), 1e-12))
    mem_a = a[:, 2:]  # bytes: per token and per squared length, no constant
    act_lin, act_sq = nnls(mem_a, np.array(mems, dtype=float))
    table = LayerTimeModel(
        const_s=float(const),
        linear_s=float(lin),
        quadratic_s=float(quad),
        backward_ratio=ratio,
        per_sequence_s=float(per_seq),
        act_bytes_per_token=float(act_lin),
        act_bytes_per_token_sq=float(act_sq),
    )

    def layer_pred(lens):
        return table.forward_packed_s(lens)

    def layer_mem(lens):
        return act_lin * sum(lens) + act_sq * sum(n * n for n in lens)

    # The edges: whole first and last chunks on real batches, minus one layer each.
    edges = {}
    for which, cid in (
        ("input", ChunkId(module, 0, 1)),
        ("head", ChunkId(module, total - 1, total)),
    ):
        chunk = build_chunk(mllm, cid, pg).to(device)
        chunk.train()
        per_tok, per_tok_mem = [], []
        for n in lengths:
            samples = [_sample(module, n, i) for i in range(packs[-1])]
            payloads = [task.payload(s, 1000 + i) for i, s in enumerate(samples)]
            mb = build_microbatch(list(zip(samples, payloads)), list(mllm.encoders), device=device)
            enc = mb.encoders.get(module)
            lens = enc.unit_lens if module != "llm" else mb.language.seq_lens

            def fwd(measure_memory, chunk=chunk, mb=mb, enc=enc, lens=lens):
                hidden = None
                if not chunk.is_first:
                    hidden = torch.randn(
                        sum(lens), 1, h, device=device, dtype=dtype, requires_grad=True
                    )
                rec = SavedBytes(chunk)
                ctx = (
                    torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack)
                    if measure_memory
                    else _Null()
                )
                with ctx:
                    if module == "llm":
                        out = chunk(hidden, mb.language, {})
                    else:
                        out = chunk(hidden, enc)
                return out, rec.total

            f, _, m = _measure(fwd, device, reps)
            tokens = sum(lens)
            per_tok.append(max(0.0, f - layer_pred(lens)) / tokens)
            per_tok_mem.append(max(0.0, m - layer_mem(lens)) / tokens)
        edges[which] = (statistics.median(per_tok), statistics.median(per_tok_mem))
    if total == 1:  # one chunk holds both edges: both measurements include both
        table = dataclasses.replace(
            table, edge_s_per_token=edges["head"][0], head_act_bytes_per_token=edges["head"][1]
        )
    else:
        table = dataclasses.replace(
            table,
            input_s_per_token=edges["input"][0],
            head_s_per_token=edges["head"][0],
            edge_s_per_token=edges["input"][0] + edges["head"][0],
            input_act_bytes_per_token=edges["input"][1],
            head_act_bytes_per_token=edges["head"][1],
        )
    # Compute efficiency of the layer at the largest measured size (for the analytic model).
    shape = mllm.shape().module(module)
    big = grid[int(np.argmax([sum(g) for g in grid]))]
    flops = shape.forward_flops(big, layers=1)
    info = {"layer_flops_per_s": flops / max(table.forward_packed_s(big), 1e-12), "hidden_size": h}
    return table, info


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


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


def measure_host(task, mllm, args, device, quick: bool) -> dict[str, float]:
    """Seconds of building microbatches (per sample, per feature element) and of Adam."""
    from megatron.mllm.batch import build_microbatch
    from megatron.mllm.data import SampleSource

    source = SampleSource(args.workload, args.workload_seed, args.workload_token_scale)
    rows, times = [], []
    count = 4 if quick else 24
    for i in range(count):
        metas = [source.meta(1000 * i + j) for j in range(args.micro_batch_size)]
        feats = sum(
            sum(m.encoder_units(e)) * task.input_dims[e] for m in metas for e in mllm.encoders
        )
        t = time.perf_counter()
        samples = [(m, task.payload(m, 1000 * i + j)) for j, m in enumerate(metas)]
        build_microbatch(samples, list(mllm.encoders), device=device)
        times.append(time.perf_counter() - t)
        rows.append([float(len(metas)), float(feats)])
    coef = nnls(np.array(rows), np.array(times))
    params = 200_000 if quick else 2_000_000
    p = torch.nn.Parameter(torch.randn(params, device=device))
    p.grad = torch.randn_like(p)
    opt = torch.optim.Adam([p], lr=1e-3)
    opt.step()
    _sync(device)
    t = time.perf_counter()
    reps = 3 if quick else 10
    for _ in range(reps):
        opt.step()
    _sync(device)
    return {
        "sample_s": float(coef[0]),
        "feature_s_per_element": float(coef[1]),
        "optimizer_s_per_param": (time.perf_counter() - t) / reps / params,
    }


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


def run(model_path: str, quick: bool, reps: int, lengths, packs, modules=None) -> Calibration:
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
    tables, infos = {}, {}
    for module in modules or [*mllm.encoders, "llm"]:
        tables[module], infos[module] = calibrate_module(
            module, mllm, pg, task, device, lengths, packs, reps
        )
    efficiency = {
        "compute": min(
            1.0,
            statistics.median(i["layer_flops_per_s"] for i in infos.values())
            / hardware["peak_flops"],
        )
    }
    host = measure_host(task, mllm, args, device, quick)
    model = {
        m: {"hidden_size": infos[m]["hidden_size"], "num_layers": mllm.num_layers(m)}
        for m in tables
    }
    return Calibration(
        device=device_name(device),
        modules=tables,
        model=model,
        efficiency=efficiency,
        source=(
            f"tools/calibrate.py {datetime.now(timezone.utc).isoformat(timespec='seconds')} "
            f"model {os.path.relpath(model_path, _REPO_ROOT)} lengths {list(lengths)} packs "
            f"{list(packs)} reps {reps}{' (quick)' if quick else ''}"
        ),
        hardware=hardware,
        host=host,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model config (trainer flags)")
    parser.add_argument("--output", default="calibration.json", help="where to write the JSON")
    parser.add_argument("--quick", action="store_true", help="tiny grid (tests)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per point")
    parser.add_argument("--lengths", default=None, help="sequence lengths, e.g. 16,64,256")
    parser.add_argument("--packs", default=None, help="sequences packed per call, e.g. 1,2,4")
    parser.add_argument("--modules", default=None, help="subset, e.g. llm,vision")
    args = parser.parse_args(argv)
    lengths = [
        int(x)
        for x in (args.lengths or ("8,32" if args.quick else "8,16,32,64,128,256")).split(",")
    ]
    packs = [int(x) for x in (args.packs or ("1,2" if args.quick else "1,2,4")).split(",")]
    reps = args.reps or (1 if args.quick else 7)
    modules = args.modules.split(",") if args.modules else None
    try:
        cal = run(args.model, args.quick, reps, lengths, packs, modules)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    cal.save(args.output)
    print(f"wrote {args.output}: {cal.device}")
    for m, t in cal.modules.items():
        print(
            f"  {m:6s} layer fwd {t.const_s * 1e6:.1f} us + {t.linear_s * 1e9:.2f} ns/token + "
            f"{t.quadratic_s * 1e12:.3f} ps/token^2 (+{t.per_sequence_s * 1e6:.1f} us/sequence), "
            f"bwd x{t.backward_ratio:.2f}, activations {t.act_bytes_per_token:.0f} B/token/layer"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

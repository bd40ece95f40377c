# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A training step of every mode that fits in one process, on the device, beside the CPU.

One process means PP = 1 and DP = 1, so the modes are megatron-core's engine (no pipelining)
with and without per-phase post-balancing (:data:`MODES`); the runtime's schedules have no
single-process form (:data:`NO_SINGLE_PROCESS_FORM`). Each runs :data:`ITERATIONS` optimizer
steps of a tiny three-modality model in fp32 and bf16 under a
:class:`~megatron.mllm.gpu_check.device_audit.DeviceAudit`, and its losses and gradient norms
are set against one CPU fp32 run of the same batches: every mode learns what one process
learns (tested on CPU to 1e-5), so one reference serves them all, within the dtype's
tolerance (:data:`TOLERANCE`).

On a CUDA machine the reference runs in a child process with no visible GPU (the CPU shim
applies only without CUDA): ``python -m megatron.mllm.gpu_check.modes OUT.json``. On CPU (the
dry run) it runs in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from megatron.mllm import cpu_shim

cpu_shim.apply()

import torch  # noqa: E402

from megatron.mllm.cli.launch import REPO, free_port  # noqa: E402
from megatron.mllm.gpu_check.device_audit import DeviceAudit  # noqa: E402

TINY = [
    "--transformer-impl", "local", "--tensor-model-parallel-size", "1",
    "--pipeline-model-parallel-size", "1",
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "256", "--max-position-embeddings", "256", "--vocab-size", "256",
    "--vision-num-layers", "2", "--vision-patch-size", "2", "--audio-num-layers", "2",
    "--audio-feature-dim", "16", "--workload", "omni-three-modality",
    "--workload-token-scale", "0.03125", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--lr", "1e-3", "--hidden-dropout", "0", "--attention-dropout", "0", "--synthetic-num-classes", "8",
    "--seed", "1234",
]  # fmt: skip
"""A tiny model on the default workload: every module (vision, audio, LLM) gets work."""

MODES = {
    "pp1-dp1": [],
    "pp1-dp1-post-balance": ["--post-balance", "auto"],
    # The overlapped reduction's and parameter gather's asynchronous paths
    # (megatron.mllm.grad_overlap, param_gather) with the distributed optimizer on the device's
    # backend, in buckets small enough for the tiny model to have several.
    "pp1-dp1-post-balance-overlap": [
        "--post-balance", "auto", "--use-distributed-optimizer", "--overlap-grad-reduce",
        "--ddp-bucket-size", "20000", "--overlap-param-gather",
    ],
}  # fmt: skip
"""The single-process modes and their flags."""

NO_SINGLE_PROCESS_FORM = {
    "runtime schedules (1f1b, interleaved, dynamic)": (
        "OrchWeave's runtime runs only with PP > 1 (RunConfig.uses_runtime); one process has "
        "PP = 1, where --pipeline-schedule falls back to megatron-core's engine"
    )
}
"""Modes that one process cannot run, and why (the summary lists them as skipped)."""

DTYPES = {"fp32": [], "bf16": ["--bf16"]}
"""The precisions and their flags."""

TOLERANCE = {"fp32": {"lm_loss": 1e-4, "grad_norm": 1e-3},
             "bf16": {"lm_loss": 3e-2, "grad_norm": 1e-1}}  # fmt: skip
"""Largest relative difference from the CPU fp32 reference, per precision and figure. fp32:
another device's kernels sum in another order (1e-6 per step, grown by one Adam update); bf16:
8 mantissa bits (4e-3 per rounding), partly averaged out over a loss of many tokens."""

ITERATIONS = 2
"""Optimizer steps per run: the second's loss shows the first update."""

BF16_ON_CPU = (
    "bf16 needs CUDA: megatron-core's Float16OptimizerWithFloat16Params accepts only "
    "torch.cuda tensors"
)
"""Why the dry run skips bf16."""


@dataclass
class ModeRun:
    """One mode's run on one device."""

    mode: str
    """A key of :data:`MODES`."""

    dtype: str
    """A key of :data:`DTYPES`."""

    device: str
    """Where it ran."""

    lm_loss: list[float] = field(default_factory=list)
    """Mean per-token loss of each iteration."""

    grad_norm: list[float] = field(default_factory=list)
    """Gradient norm of each iteration (before clipping)."""

    seconds: float = 0.0
    """Building the trainer and its iterations."""

    peak_memory_bytes: int | None = None
    """Largest CUDA allocation during the iterations (None on CPU)."""

    audit: dict | None = None
    """The :class:`~megatron.mllm.gpu_check.device_audit.AuditReport` record."""


def single_process_environment() -> None:
    """torch.distributed's environment for one process, where no launcher set it."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):  # fmt: skip
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def fresh_trainer(flags: list[str]):
    """A trainer of ``flags`` in this process, after any earlier one's parallel state."""
    from megatron.core import parallel_state
    from megatron.mllm.arguments import parse_arguments
    from megatron.mllm.run_config import RunConfig
    from megatron.mllm.training import Trainer

    single_process_environment()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    return Trainer(RunConfig.from_args(parse_arguments(flags)))


def backend_flags() -> list[str]:
    """NCCL on CUDA (the path the GPU runs take), gloo elsewhere."""
    return ["--distributed-backend", "nccl" if torch.cuda.is_available() else "gloo"]


def run_mode(mode: str, dtype: str, audit: bool = True) -> ModeRun:
    """:data:`ITERATIONS` steps of ``mode`` in ``dtype`` on this process's device.

    Raises:
        ValueError: bf16 without CUDA (:data:`BF16_ON_CPU`).
    """
    if dtype == "bf16" and not torch.cuda.is_available():
        raise ValueError(BF16_ON_CPU)
    start = time.perf_counter()
    flags = [*TINY, *backend_flags(), *MODES[mode], *DTYPES[dtype]]
    trainer = fresh_trainer([*flags, "--train-iters", str(ITERATIONS)])
    out = ModeRun(mode, dtype, str(trainer.device))
    cuda = trainer.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    watch = DeviceAudit(trainer.device) if audit else None
    for i in range(ITERATIONS):
        if watch is None:
            result = trainer.train_step(i)
        else:
            with watch:
                result = trainer.train_step(i)
        out.lm_loss.append(result.loss)
        out.grad_norm.append(result.grad_norm)
    if watch is not None:
        watch.check_state(trainer.model, trainer.optimizer)
        out.audit = watch.report.record()
    if cuda:
        torch.cuda.synchronize()
        out.peak_memory_bytes = int(torch.cuda.max_memory_allocated())
    out.seconds = time.perf_counter() - start
    del trainer
    return out


def reference(timeout: float = 300.0) -> ModeRun:
    """The CPU fp32 run of :data:`MODES`' first mode (every mode's oracle).

    On a CUDA machine it runs in a child process that sees no GPU.

    Raises:
        RuntimeError: the child failed or outlived ``timeout`` (with the end of its output).
    """
    if not torch.cuda.is_available():
        return run_mode(next(iter(MODES)), "fp32", audit=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "reference.json")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", MASTER_PORT=str(free_port()))
        env.setdefault("OMP_NUM_THREADS", str(min(8, os.cpu_count() or 1)))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "megatron.mllm.gpu_check.modes", path]
        try:
            proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the CPU reference run took over {timeout:.0f} s") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"the CPU reference run failed ({proc.returncode}): {tail[0]}")
        with open(path, encoding="utf-8") as f:
            return ModeRun(**json.load(f))


def differences(run: ModeRun, ref: ModeRun) -> dict[str, float]:
    """The largest relative difference of each figure over the iterations."""
    out = {}
    for key in ("lm_loss", "grad_norm"):
        pairs = zip(getattr(run, key), getattr(ref, key))
        out[key] = max(abs(a - b) / max(abs(b), 1e-30) for a, b in pairs)
    return out


def record(run: ModeRun, ref: ModeRun) -> dict:
    """The JSON record of one run beside the reference: its figures, differences, tolerances."""
    diff = differences(run, ref)
    tol = TOLERANCE[run.dtype]
    return {**asdict(run), "reference_lm_loss": ref.lm_loss,
            "reference_grad_norm": ref.grad_norm, "relative_difference": diff,
            "tolerance": tol, "within_tolerance": all(diff[k] <= tol[k] for k in tol)}  # fmt: skip


def main(argv: list[str]) -> int:
    """``python -m megatron.mllm.gpu_check.modes OUT.json``: the CPU reference run."""
    if len(argv) != 1:
        sys.stderr.write("error: usage: python -m megatron.mllm.gpu_check.modes OUT.json\n")
        return 2
    run = run_mode(next(iter(MODES)), "fp32", audit=False)
    with open(argv[0], "w", encoding="utf-8") as f:
        json.dump(asdict(run), f)
    return 0


if __name__ == "__main__":
    import logging

    from megatron.mllm import logs

    logs.configure(logging.WARNING)
    sys.exit(main(sys.argv[1:]))

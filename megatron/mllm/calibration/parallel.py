# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The calibration's torch.distributed: its one-rank group and the two-process measurements.

This is the one module of the calibration package that starts and stops process groups; the
collectives it calls besides those it measures (barriers, gathering the figures) are
``megatron.mllm.distributed``'s, as everywhere in the packages.

* :func:`single_rank_group`: the one gloo rank and megatron-core parallel state that the
  in-process stages build their chunks and the trainer in.
* :func:`measure_parallel`: the ``parallel`` stage. Two processes (torchrun, gloo, 2 ranks on
  this host, as the main job runs) run :func:`parallel_worker`: the time of one megatron-core
  P2P transfer (``P2PCommunicator``, as the baseline schedule sends) per size, the gradient
  all-reduce per size (DDP's ``finish_grad_sync``), and how much slower a process computes
  while the other one computes too (``shared_node_slowdown``), and the host time of the
  runtime's own transfers as a running step pays them (posting and waiting ``isend`` /
  ``irecv`` while both processes compute: ``send_post_s`` ..., ``transfer_compute_s``; a
  receive posted after its tensor was sent, while the sender computes: ``recv_post_ready_s``;
  one of several posted back to back at the step's start: ``recv_post_start_s``).

The worker runs as ``python -m megatron.mllm.calibration.parallel --out F --model M ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from megatron.mllm import cpu_shim, distributed
from megatron.mllm.batch import thd_params
from megatron.mllm.calibration.fit import relative_nnls
from megatron.mllm.calibration.harness import ddp_wrap, engine_backward, measurement_run
from megatron.mllm.chunks import ChunkId, build_chunk
from megatron.mllm.cli.launch import REPO, free_port, torchrun_command

WORKER = "megatron.mllm.calibration.parallel"
"""This module, as torchrun's ``-m`` target."""


@contextlib.contextmanager
def single_rank_group():
    """torch.distributed (one gloo rank) and megatron-core's parallel state (TP = PP = 1) for
    the block; yields megatron-core's process groups. A group already started is used and
    left as it is; one started here is destroyed at the end."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    started = not dist.is_initialized()
    if started:
        distributed.share_gloo_device()  # the transport a run has (initialize_distributed)
        dist.init_process_group(
            "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}"
        )
    try:
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1)
        cpu_shim.model_parallel_manual_seed(1)
        yield ProcessGroupCollection.use_mpu_process_groups()
    finally:
        if started:
            if parallel_state.model_parallel_is_initialized():
                parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def measure_parallel(model: str, threads: int, reps: int) -> dict:
    """Run :func:`parallel_worker` on two torchrun ranks of this host; return its figures.

    Returns:
        ``{"comm": {...}, "shared_node_slowdown": x, "raw": {...}}``.

    Raises:
        RuntimeError: the two processes failed (with the end of their stderr).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "parallel.json")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.setdefault("PYTHONWARNINGS", "ignore")
        cmd = torchrun_command(
            2,
            [
                "-m",
                WORKER,
                "--out",
                out,
                "--model",
                model,
                "--threads",
                str(threads),
                "--reps",
                str(reps),
            ],
        )
        # From the checkout's root, ``-m`` finds this checkout's package first.
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if proc.returncode != 0 or not os.path.isfile(out):
            raise RuntimeError(f"the two-process measurement failed:\n{proc.stderr[-3000:]}")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def _allreduce(run, mllm, reps: int) -> tuple[float, float, dict]:
    """DP = 2: the gradient all-reduce as the trainer runs it, megatron-core DDP's
    finish_grad_sync (called by finalize_model_grads) on grad buffers of several sizes; its
    DP = 1 remainder is part of step_s (trainer stage). Fitted as ``2 (n-1) latency +
    2 (n-1)/n bytes / bandwidth``."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
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

    sizes = [2**12, 2**16, 2**18, 2**20, 2**22]  # fp32 elements: 16 KiB .. 16 MiB
    ddps = [ddp_wrap(Flat(s), run, pg) for s in sizes]
    times = {s: [] for s in sizes}
    for r in range(reps + 1):
        for s, ddp in zip(sizes, ddps):
            for p in ddp.module.parameters():
                p.main_grad.fill_(1.0)
            distributed.barrier()
            t = time.perf_counter()
            ddp.finish_grad_sync()
            if r:
                times[s].append(time.perf_counter() - t)
    nbytes = np.array([4.0 * s for s in sizes])
    seconds = np.array([statistics.median(times[s]) for s in sizes])
    n = 2
    lat, inv_bw = relative_nnls(
        np.column_stack([np.full_like(nbytes, 2 * (n - 1)), 2 * (n - 1) / n * nbytes]), seconds
    )
    del ddps
    parallel_state.destroy_model_parallel()
    return float(lat), float(inv_bw), dict(zip(map(str, sizes), seconds.tolist()))


def _p2p(mllm, pg, reps: int) -> tuple[float, float, dict]:
    """PP = 2: megatron-core's P2P communicator, as the baseline 1F1B schedule uses it; a
    ping-pong of [S, 1, h] activations, one transfer = half a round trip. Fitted as
    ``latency + bytes / bandwidth``."""
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    rank = dist.get_rank()
    h, dtype = mllm.language.hidden_size, mllm.language.params_dtype
    p2p = P2PCommunicator(pg.pp, mllm.language)
    sizes = [16, 128, 512, 2048]
    times = {s: [] for s in sizes}
    for r in range(reps + 1):
        for s in sizes:
            shape = (s, 1, h)
            x = torch.randn(shape, dtype=dtype)
            distributed.barrier()
            t = time.perf_counter()
            for _ in range(4):
                if rank == 0:
                    p2p.send_forward(x, False)
                    p2p.recv_backward(shape, False)
                else:
                    y = p2p.recv_forward(shape, False)
                    p2p.send_backward(y, False)
            if r:
                times[s].append((time.perf_counter() - t) / 8)
    nbytes = np.array([float(s * h * torch.finfo(dtype).bits // 8) for s in sizes])
    seconds = np.array([statistics.median(times[s]) for s in sizes])
    lat, inv_bw = relative_nnls(np.column_stack([np.ones_like(nbytes), nbytes]), seconds)
    return float(lat), float(inv_bw), dict(zip(map(str, sizes), seconds.tolist()))


def _runtime_transfers(mllm, pg, reps: int) -> dict[str, float]:
    """PP = 2: the host time of OrchWeave's runtime transfers
    (``pipeweaver.runtime.p2p.PipelineP2P``) as a running step pays it.

    In a step both stages compute between their transfers, and on a host whose cores the
    stages fill, gloo's threads (which move the data and answer the peer's posts) run on those
    same cores: a post or a wait costs several times what it costs on an idle host, and the
    compute around it slows down. So the stages here do what the executor does, both at once:
    per iteration each one posts the receive of the other's tensor (``recv_post_s``, with the
    buffer's allocation), computes, posts its send (``send_post_s``), computes again (the
    other's tensor has been sent by then), waits the receive (``recv_wait_s``) and the send
    (``send_wait_s``). Rounds with the transfers alternate with rounds of the compute alone;
    ``transfer_compute_s`` is the compute a stage loses per transfer it takes part in (its
    compute time with transfers minus without, over its two transfers per iteration).
    Each figure is the median over the rounds, averaged over the two stages."""
    from pipeweaver.runtime.p2p import PipelineP2P

    p2p = PipelineP2P(pg.pp, timedelta(minutes=2))
    peer = 1 - p2p.stage
    h, dtype = mllm.language.hidden_size, mllm.language.params_dtype
    shape, iters = (128, 1, h), 48
    # About 1.5 ms of a layer's matrix multiplies, forward and backward: the runtime's
    # smallest computes on the main job's model.
    torch.manual_seed(0)
    layer = torch.nn.Sequential(
        torch.nn.Linear(h, 4 * h), torch.nn.GELU(), torch.nn.Linear(4 * h, h)
    ).to(dtype)
    x = torch.randn(4 * shape[0], h, dtype=dtype, requires_grad=True)
    payload = torch.ones(shape, dtype=dtype)  # waited every iteration, so one serves them all

    def compute() -> float:
        t = time.perf_counter()
        layer(x).sum().backward()
        return time.perf_counter() - t

    names = ("send_post_s", "send_wait_s", "recv_post_s", "recv_wait_s")
    times: dict[str, list[float]] = {k: [] for k in (*names, "transfer_compute_s")}
    for _ in range(4):
        compute()
    for r in range(reps + 1):
        computed = {}
        for transfers in (False, True):
            distributed.barrier()
            took = dict.fromkeys(names, 0.0)
            busy = 0.0
            for _ in range(iters):
                if transfers:
                    t = time.perf_counter()
                    buf = torch.empty(shape, dtype=dtype)
                    received = p2p.irecv(buf, peer)
                    took["recv_post_s"] += time.perf_counter() - t
                busy += compute()
                if transfers:
                    t = time.perf_counter()
                    sent = p2p.isend(payload, peer)
                    took["send_post_s"] += time.perf_counter() - t
                busy += compute()
                if transfers:
                    t = time.perf_counter()
                    p2p.wait(received, "calibration receive", peer)
                    took["recv_wait_s"] += time.perf_counter() - t
                    t = time.perf_counter()
                    p2p.wait(sent, "calibration send", peer)
                    took["send_wait_s"] += time.perf_counter() - t
            computed[transfers] = busy
            if r and transfers:
                for k in names:
                    times[k].append(took[k] / iters)
        if r:
            lost = (computed[True] - computed[False]) / (2 * iters)
            times["transfer_compute_s"].append(max(0.0, lost))
    times["recv_post_ready_s"] = _ready_receives(p2p, peer, payload, compute, reps)
    times["recv_post_start_s"] = _receives_at_start(p2p, peer, payload, compute, reps)
    mine = torch.tensor([statistics.median(v) for v in times.values()], dtype=torch.float64)
    gathered = distributed.all_gather(mine)
    both = (gathered[0] + gathered[1]) / 2
    return dict(zip(times, map(float, both)))


def _receives_at_start(p2p, peer: int, payload: torch.Tensor, compute, reps: int) -> list[float]:
    """Per round, the mean seconds of one receive posted back to back with the step's others
    when the step starts (``--pipeline-receive-posting step``, gloo's default): each process
    posts 8 receives, then computes and sends 8 tensors, and waits them all."""
    iters, count, mine = 24, 8, []
    for r in range(reps + 1):
        distributed.barrier()
        took = 0.0
        for _ in range(iters):
            t = time.perf_counter()
            received = [p2p.irecv(torch.empty_like(payload), peer) for _ in range(count)]
            took += time.perf_counter() - t
            sent = []
            for _ in range(count):
                compute()
                sent.append(p2p.isend(payload, peer))
            for work in received:
                p2p.wait(work, "calibration receive", peer)
            for work in sent:
                p2p.wait(work, "calibration send", peer)
        if r:  # the first round warms up
            mine.append(took / (iters * count))
    return mine


def _ready_receives(p2p, peer: int, payload: torch.Tensor, compute, reps: int) -> list[float]:
    """Per round, the mean seconds of posting a receive whose tensor the peer has sent already,
    while the peer computes: such a post starts the transfer there and then, and on a host the
    two processes fill, the transport threads it wakes take a core from one of them (the
    dynamic pipeline's dearest posts, README "The runtime's transfers as a running step pays
    them"). The processes take turns: the sender posts its send and computes twice; the poster
    computes once (the send is posted by then), posts the receive, computes and waits. This
    rank's rounds as the poster are returned (empty on the other rank's turns)."""
    iters, mine = 48, []
    for r in range(2 * (reps + 1)):
        poster = r % 2
        distributed.barrier()
        took = 0.0
        for _ in range(iters):
            if p2p.stage != poster:
                sent = p2p.isend(payload, peer)
                compute()
                compute()
                p2p.wait(sent, "calibration send", peer)
                continue
            compute()
            t = time.perf_counter()
            received = p2p.irecv(torch.empty_like(payload), peer)
            took += time.perf_counter() - t
            compute()
            p2p.wait(received, "calibration receive", peer)
        if r >= 2 and p2p.stage == poster:  # the first round of each role warms up
            mine.append(took / iters)
    return mine


def _paired_compute(run, mllm, pg, reps: int) -> tuple[float, list, list]:
    """One rank computes alone (the other sleeps: a rank waiting in gloo uses no CPU), then
    both at once; roles alternate. Work: a layer forward and backward through DDP, the
    trainer's dominant cost. Returns the slowdown and each rank's solo and paired seconds."""
    rank = dist.get_rank()
    h, dtype = mllm.language.hidden_size, mllm.language.params_dtype
    chunk = build_chunk(mllm, ChunkId("llm", 0, 1), pg)
    chunk.train()
    ddp = ddp_wrap(chunk, run, pg)  # noqa: F841  (keeps the hooks)
    lens = [64, 64, 128]
    psp = thd_params(lens, torch.device("cpu"))

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
            distributed.barrier()
            active = phase == "paired" or rank == r % 2
            if active:
                t = work()
                (paired if phase == "paired" else solo).append(t)
            else:
                time.sleep(0.0)
            distributed.barrier()
    pair = torch.tensor([statistics.median(solo) if solo else 0.0, statistics.median(paired)])
    gathered = distributed.all_gather(pair)
    slowdown = statistics.mean(float(g[1] / g[0]) for g in gathered if g[0] > 0)
    return slowdown, [float(g[0]) for g in gathered], [float(g[1]) for g in gathered]


def parallel_worker(model: str, out: str, threads: int, reps: int) -> None:
    """One of two torchrun ranks: all-reduce, P2P and paired-compute timings (rank 0 writes
    ``out``)."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    torch.set_num_threads(threads)
    distributed.share_gloo_device()  # the transport a run has (initialize_distributed)
    dist.init_process_group("gloo")
    loaded = measurement_run(model, world_size=2, pipeline=2)
    run, mllm = loaded.run, loaded.model
    ar_lat, ar_inv_bw, ar_raw = _allreduce(run, mllm, reps)
    parallel_state.initialize_model_parallel(1, 2)
    cpu_shim.model_parallel_manual_seed(1)
    pg = ProcessGroupCollection.use_mpu_process_groups()
    lat, inv_bw, p2p_raw = _p2p(mllm, pg, reps)
    transfers = _runtime_transfers(mllm, pg, reps)
    slowdown, solo, paired = _paired_compute(run, mllm, pg, reps)
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "comm": {
                        "p2p_latency_s": lat,
                        "p2p_bandwidth": 1.0 / inv_bw if inv_bw > 0 else 1e12,
                        "allreduce_latency_s": ar_lat,
                        "allreduce_bandwidth": 1.0 / ar_inv_bw if ar_inv_bw > 0 else 1e12,
                    },
                    "shared_node_slowdown": max(1.0, slowdown),
                    "transfers": transfers,
                    "raw": {
                        "p2p_s": p2p_raw,
                        "allreduce_s": ar_raw,
                        "solo_s": solo,
                        "paired_s": paired,
                    },
                },
                f,
            )
    distributed.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Entry point of one torchrun rank (:func:`measure_parallel` starts two)."""
    parser = argparse.ArgumentParser(description="one rank of the two-process calibration")
    parser.add_argument("--out", required=True, help="JSON that rank 0 writes")
    parser.add_argument("--model", required=True, help="model config")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--reps", type=int, default=1, help="timed repetitions")
    args = parser.parse_args(argv)
    parallel_worker(args.model, args.out, args.threads, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

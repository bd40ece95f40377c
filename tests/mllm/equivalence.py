# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Gradient-equivalence helpers: one step's gradients of any layout, merged by global name."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from launch import check, torchrun

GRAD_WORKER = Path(__file__).with_name("grad_worker.py")
_RUNS = itertools.count()

# A tiny model on the default workload: every module (vision, audio, LLM) gets work.
TINY = [
    "--distributed-backend", "gloo", "--transformer-impl", "local",
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "256", "--max-position-embeddings", "256", "--vocab-size", "256",
    "--vision-num-layers", "2", "--vision-patch-size", "2", "--audio-num-layers", "1",
    "--audio-feature-dim", "16", "--workload-token-scale", "0.03125",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "1",
    "--lr", "1e-3", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--synthetic-num-classes", "8",
]  # fmt: skip


def gradients(
    tmp_path: Path, nproc: int, extra: list[str], tp: int = 1
) -> tuple[dict, dict, torch.Tensor]:
    """Gradients, initial parameters and loss of one step, merged over ranks by global name.

    With TP, rank ``r`` holds shard ``r % tp`` of sharded tensors; shards are concatenated along
    the dimension where their shape differs from the full tensor's (``reference`` has TP=1).
    """
    out = tmp_path / f"grads_{nproc}_{next(_RUNS)}"
    out.mkdir()
    check(torchrun(nproc, GRAD_WORKER, [str(out), *TINY, *extra]))
    data = [torch.load(out / f"rank{r}.pt") for r in range(nproc)]
    grads, params, loss = {}, {}, None
    for r in range(0, nproc, tp):  # one TP group at a time
        group = data[r : r + tp]
        for key, merged in (("grads", grads), ("params", params)):
            for name in group[0][key]:
                shards = [d[key][name] for d in group]
                full = shards[0]
                if name in FULL_SHAPES and full.shape != FULL_SHAPES[name]:
                    full = torch.cat(shards, _shard_dim(name, full))
                if key == "grads" and name in merged:  # replicated over DP: replicas agree
                    torch.testing.assert_close(full, merged[name], rtol=1e-6, atol=0)
                merged[name] = full
        loss = next((d["loss"] for d in group if d["loss"] is not None), loss)
    return grads, params, loss


FULL_SHAPES: dict[str, torch.Size] = {}


def _shard_dim(name: str, shard: torch.Tensor) -> int:
    full = FULL_SHAPES[name]
    return next(i for i in range(shard.dim()) if shard.shape[i] != full[i])


def assert_equivalent(run, reference) -> None:
    grads, params, loss = run
    ref_grads, ref_params, ref_loss = reference
    assert set(grads) == set(ref_grads)
    for name, p in params.items():
        assert torch.equal(p, ref_params[name]), f"initial weights of {name} differ"
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    for name, g in grads.items():
        ref = ref_grads[name]
        rel = float((g - ref).norm() / ref.norm().clamp_min(1e-30))
        assert rel <= 1e-5, f"{name}: relative gradient difference {rel:.2e}"

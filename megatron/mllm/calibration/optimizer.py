# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The ``optimizer`` stage: megatron-core's optimizer step, fixed + per tensor + per parameter.

``get_megatron_optimizer`` with the run's optimizer config (Adam, gradient norm and clipping,
the local multi-tensor fallbacks on CPU), stepping over several sets of DDP-wrapped chunks.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np
import torch

from megatron.mllm.calibration.fit import relative_nnls
from megatron.mllm.calibration.harness import Reference, ddp_wrap, sync
from megatron.mllm.chunks import ChunkId, build_chunk
from megatron.mllm.cli.progress import progress

CHUNK_SETS = (
    (("llm", 0, 1),),
    (("llm", 0, 3),),
    (("llm", 1, 4),),
    (("vision", 0, 2),),
    (("audio", 0, 1), ("llm", 1, 2)),
    (("vision", 0, 2), ("audio", 0, 2), ("llm", 0, 1)),
    (("vision", 0, 1), ("audio", 0, 2), ("llm", 0, 3)),
)
"""Chunk sets ``(module, start, stop)`` the optimizer is timed on: sizes from one layer to the
whole model, none of them a stage of the accuracy benchmark's layouts (the whole model, or
PP = 2's two stages)."""


def measure_optimizer(
    mllm, run, pg, device: torch.device, modules: Sequence[str], reps: int, ref: Reference
) -> dict[str, float]:
    """megatron-core's optimizer step over :data:`CHUNK_SETS` (those the model and ``modules``
    have), fitted as ``optimizer_step_s + optimizer_s_per_tensor * tensors +
    optimizer_s_per_param * params`` (reference units); empty with fewer than two sets."""
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.transformer.module import MegatronModule

    class Stage(MegatronModule):
        def __init__(self, chunks):
            super().__init__(config=mllm.language)
            self.chunks = torch.nn.ModuleList(chunks)

    cases = []
    gen = torch.Generator().manual_seed(0)
    for chunk_set in CHUNK_SETS:
        if any(m not in modules or stop > mllm.num_layers(m) for m, _, stop in chunk_set):
            continue
        stage = Stage([build_chunk(mllm, ChunkId(*c), pg) for c in chunk_set]).to(device)
        ddp = ddp_wrap(stage, run, pg)
        opt = get_megatron_optimizer(
            run.optimizer, [ddp], use_gloo_process_groups=False, pg_collection=pg
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
    for _ in progress(range(reps), "calibration: optimizer"):
        for i, (opt, _, _) in enumerate(cases):
            r = ref.time()
            sync(device)
            t = time.perf_counter()
            opt.step()
            sync(device)
            times[i].append((time.perf_counter() - t) / r)
    a = np.array([[1.0, float(n), float(p)] for _, n, p in cases])
    fixed, per_tensor, per_param = relative_nnls(a, np.array([statistics.median(t) for t in times]))
    return {
        "optimizer_step_s": float(fixed),
        "optimizer_s_per_tensor": float(per_tensor),
        "optimizer_s_per_param": float(per_param),
    }

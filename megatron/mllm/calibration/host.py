# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The ``host`` stage: building microbatches, per sample and per encoder feature element.

What the trainer does on the host before its step runs a microbatch: the loader generates each
sample's payload (``BatchLoader.load``: ``SyntheticTask.payload``) and the step packs them
(``PackedStep.pack``: ``build_microbatch``, unpadded with PP = 1). Both are timed together on
the run's own workload, in microbatches of the run's size.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from megatron.mllm.batch import build_microbatch
from megatron.mllm.calibration.fit import nnls
from megatron.mllm.calibration.harness import Reference
from megatron.mllm.cli.progress import progress
from megatron.mllm.data import SyntheticTask
from orchestration.workload_spec import SampleStream


def measure_host(
    task: SyntheticTask, mllm, run, device: torch.device, quick: bool, ref: Reference
) -> dict[str, float]:
    """``sample_s`` and ``feature_s_per_element`` of building microbatches (reference units)."""
    w = run.workload
    stream = SampleStream(w.workload, w.workload_seed, w.workload_token_scale)
    encoders = list(mllm.encoders)
    count = 4 if quick else 24
    rounds = 1 if quick else 3
    rows, times = [], [[] for _ in range(count)]
    for rnd in progress(range(rounds), "calibration: host"):
        for i in range(count):
            indices = [1000 * i + j for j in range(run.micro_batch_size)]
            metas = [stream.meta(k) for k in indices]
            r = ref.time()
            t = time.perf_counter()
            pairs = [(m, task.payload(m, k)) for m, k in zip(metas, indices)]
            build_microbatch(pairs, encoders, device=device, max_pad_run=run.seq_length)
            times[i].append((time.perf_counter() - t) / r)
            if rnd == 0:
                feats = sum(
                    sum(m.encoder_units(e)) * task.input_dims[e] for m in metas for e in encoders
                )
                rows.append([float(len(metas)), float(feats)])
    coef = nnls(np.array(rows), np.array([statistics.median(t) for t in times]))
    return {"sample_s": float(coef[0]), "feature_s_per_element": float(coef[1])}

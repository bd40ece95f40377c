#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Run the trainer unchanged, measuring the activation memory autograd keeps on each rank.

A drop-in for ``scripts/pretrain_mllm.py`` (same flags, launched by torchrun the same way),
used by ``tools/bench/semu_accuracy.py``. It wraps ``Trainer.forward_backward`` (loading the
batch, then the step's forward and backward: everything that saves tensors for backward) in
the calibration's :class:`~megatron.mllm.calibration.probes.SavedTensorTracker`: every tensor
autograd saves for backward is counted once per storage (parameters excluded) from the moment
it is saved until autograd releases it, and the peak of the bytes alive during each iteration
is appended, one JSON line per iteration, to ``$SEMU_MEMORY_OUT/rank<R>.jsonl``::

    {"rank": 0, "iteration": 1, "peak_saved_bytes": 9437184}

Nothing in ``megatron/mllm`` is edited; the hooks add a little time per saved tensor, so timing
runs use the plain script.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from megatron.mllm import training
from megatron.mllm.calibration.probes import SavedTensorTracker

_original_forward_backward = training.Trainer.forward_backward


def _forward_backward(self, iteration: int):
    tracker = SavedTensorTracker(self.model.parameters())
    with tracker.hooks():
        result = _original_forward_backward(self, iteration)
    out_dir = os.environ.get("SEMU_MEMORY_OUT")
    if out_dir:
        rank = torch.distributed.get_rank()
        with open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", encoding="utf-8") as f:
            record = {"rank": rank, "iteration": iteration + 1, "peak_saved_bytes": tracker.peak}
            f.write(json.dumps(record) + "\n")
    return result


training.Trainer.forward_backward = _forward_backward

if __name__ == "__main__":
    sys.exit(training.main())

#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Run the trainer unchanged, measuring the activation memory autograd keeps on each rank.

A drop-in for ``scripts/pretrain_mllm.py`` (same flags, launched by torchrun the same way),
used by ``tools/bench/semu_accuracy.py``. It wraps ``Trainer.train_step`` in
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves for backward is
counted once per storage (parameters excluded) from the moment it is saved until autograd
releases it (the holder object the hook returns is freed with the graph node), and the peak of
the bytes alive during each step is appended, one JSON line per step, to
``$SEMU_MEMORY_OUT/rank<R>.jsonl``::

    {"rank": 0, "iteration": 1, "peak_saved_bytes": 9437184}

Nothing in ``megatron/mllm`` is edited; the hooks add a little time per saved tensor, so timing
runs use the plain script.
"""

from __future__ import annotations

import json
import os
import sys

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

import torch  # noqa: E402

from megatron.mllm import training  # noqa: E402


class SavedTensorTracker:
    """Bytes of unique storages saved for backward and still referenced by autograd."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.refs: dict[int, int] = {}
        self.alive = 0
        self.peak = 0

    def pack(self, t: torch.Tensor):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in self.exclude or st.nbytes() == 0:
            return t
        return _Holder(self, t, ptr, st.nbytes())

    @staticmethod
    def unpack(obj):
        return obj.t if isinstance(obj, _Holder) else obj

    def _add(self, ptr: int, nbytes: int) -> None:
        count = self.refs.get(ptr, 0)
        if count == 0:
            self.alive += nbytes
            self.peak = max(self.peak, self.alive)
        self.refs[ptr] = count + 1

    def _drop(self, ptr: int, nbytes: int) -> None:
        count = self.refs.get(ptr, 0) - 1
        if count <= 0:
            self.refs.pop(ptr, None)
            self.alive -= nbytes
        else:
            self.refs[ptr] = count


class _Holder:
    __slots__ = ("tracker", "t", "ptr", "nbytes")

    def __init__(self, tracker: SavedTensorTracker, t: torch.Tensor, ptr: int, nbytes: int):
        self.tracker, self.t, self.ptr, self.nbytes = tracker, t, ptr, nbytes
        tracker._add(ptr, nbytes)

    def __del__(self):
        self.tracker._drop(self.ptr, self.nbytes)


_original_step = training.Trainer.train_step


def _train_step(self, iteration: int):
    exclude = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
    tracker = SavedTensorTracker(exclude)
    with torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
        result = _original_step(self, iteration)
    out_dir = os.environ.get("SEMU_MEMORY_OUT")
    if out_dir:
        rank = torch.distributed.get_rank()
        with open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a", encoding="utf-8") as f:
            f.write(
                json.dumps(
                    {"rank": rank, "iteration": iteration + 1, "peak_saved_bytes": tracker.peak}
                )
                + "\n"
            )
    return result


training.Trainer.train_step = _train_step

if __name__ == "__main__":
    sys.exit(training.main())

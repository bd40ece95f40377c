# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Module-level helpers of tests/pipeweaver/test_mcts_workers.py: search worker processes
unpickle them by name, so they live in a module that imports nothing but pipeweaver."""

from __future__ import annotations

import os
import time

from pipeweaver.ir import Kind
from pipeweaver.semu.timing import ComputeCost


def token_cost(_placement, a, mb) -> ComputeCost:
    """tests/pipeweaver/test_mcts.py's compute times: they grow with the tokens; chunk 1 is
    slower (the head), B costs twice F."""
    lens, _rows = mb.compute_sequences(a.module, a.sub)
    t = sum(lens) * (1.0 if a.module == "llm" else 0.6) * (1.0 + 0.3 * a.chunk)
    return ComputeCost(t * (2.0 if a.kind is Kind.B else 1.0), 1.0, 0.0)


class ExitAfter:
    """A scorer whose process exits (status 3, as if killed) at its ``calls``-th order."""

    def __init__(self, score, calls: int):
        self.score, self.calls = score, calls

    def __call__(self, order) -> float:
        self.calls -= 1
        if self.calls <= 0:
            os._exit(3)
        return self.score(order)


class Stuck:
    """A scorer that never answers (sleeps far past any test's timeout)."""

    def __call__(self, order) -> float:
        time.sleep(3600)
        return 0.0


class HeavyModules:
    """A scorer that answers how many of torch, megatron.core and megatron.mllm its process
    has imported, once ``score`` (unpickled with it) is loaded."""

    def __init__(self, score):
        self.score = score

    def __call__(self, order) -> float:
        import sys

        return float(sum(m in sys.modules for m in ("torch", "megatron.core", "megatron.mllm")))

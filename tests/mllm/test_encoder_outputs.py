# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The per-phase step's overlapped encoder-output exchanges (``steps/encoder_outputs.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import torchrun

from orchestration.microbatches import overlap_order


def test_overlap_order_puts_remote_microbatches_between_the_halves_of_the_local_ones():
    assert overlap_order([True, False, True, True, False]) == ([0, 2], [1, 4], [3])
    assert overlap_order([True, True, True, True]) == ([0, 1], [], [2, 3])
    assert overlap_order([False, False]) == ([], [0, 1], [])
    assert overlap_order([True]) == ([0], [], [])
    assert overlap_order([]) == ([], [], [])
    assert overlap_order([True, False, True], overlap=False) == ([], [0, 1, 2], [])
    # Every microbatch runs exactly once.
    flags = [i % 3 == 0 for i in range(11)]
    assert sorted(i for g in overlap_order(flags) for i in g) == list(range(11))


@pytest.mark.multiproc
def test_rows_and_gradients_of_the_overlapped_exchanges_on_4_processes():
    proc = torchrun(4, Path(__file__).with_name("encoder_outputs_worker.py"), [])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.stdout.count(": ok") == 4

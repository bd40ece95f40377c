# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The dispatcher's collectives on 4 gloo processes simulating 2 nodes x 2 ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestration.dispatcher import inter_node_messages, plan_hops

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.multiproc
def test_direct_and_node_wise_exchanges_on_4_processes():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
           "--master-port", str(port), str(Path(__file__).with_name("dispatcher_worker.py"))]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.stdout.count(": ok") == 4
    assert proc.stdout.count("mismatch detected") == 4


def test_node_wise_sends_one_message_per_node_pair():
    rng = np.random.default_rng(1)
    for nodes, g in [(2, 2), (3, 4), (4, 2)]:
        world = nodes * g
        counts = rng.integers(1, 5, size=(world, world))  # everyone talks to everyone
        assert inter_node_messages(counts, g, node_wise=False) == world * world - nodes * g * g
        assert inter_node_messages(counts, g, node_wise=True) == nodes * (nodes - 1)


def test_every_block_arrives_exactly_once():
    rng = np.random.default_rng(2)
    counts = rng.integers(0, 3, size=(6, 6))
    hops = plan_hops(counts, 2)
    last = hops[-1]
    arrived = sorted(b for src in range(6) for dst in range(6) for b in last.blocks[src][dst])
    assert arrived == sorted((s, d) for s in range(6) for d in range(6) if counts[s, d] > 0)
    for dst in range(6):
        assert all(b[1] == dst for src in range(6) for b in last.blocks[src][dst])

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The dispatcher's collectives on 4 gloo processes simulating 2 nodes x 2 ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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

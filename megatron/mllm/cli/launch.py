# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Launching local multi-process runs from tools, benchmarks and tests: torchrun on a free port."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[3]
"""The checkout this package runs from (an editable install's source tree)."""

MAIN_JOB = REPO / "scripts" / "pretrain_mllm_cpu.sh"
"""The README's main job."""


def free_port() -> int:
    """A TCP port on localhost that was free a moment ago (a rendezvous port for torchrun)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int, target: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node N --master-port P TARGET...``.

    Args:
        nproc: processes.
        target: the script and its arguments, or ``["-m", module, ...]``.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-port", str(free_port()), *target]  # fmt: skip

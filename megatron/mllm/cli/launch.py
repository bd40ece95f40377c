# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Launching local multi-process runs from tools, benchmarks and tests: torchrun on a free port."""

from __future__ import annotations

import random
import socket
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[3]
"""The checkout this package runs from (an editable install's source tree)."""

MAIN_JOB = REPO / "scripts" / "pretrain_mllm_cpu.sh"
"""The README's main job."""


_PICK = random.SystemRandom()  # not the module's generator, which callers may seed alike


def _ephemeral_start() -> int:
    """The first port the kernel hands out for outgoing connections (Linux's default 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on localhost that was free a moment ago (a rendezvous port for torchrun).

    Drawn at random below the kernel's ephemeral range: a port the kernel chose for a bind to 0
    lies inside it, where any process's next outgoing connection (gloo's between ranks of
    another run started at the same moment) may take it before the rendezvous binds it (seen
    as EADDRINUSE in tests that start several runs at once)."""
    top = _ephemeral_start()
    for _ in range(64):
        port = _PICK.randrange(max(1024, top - 20000), top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every draw taken: let the kernel choose
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

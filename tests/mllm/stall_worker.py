# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Worker for test_timeouts.py: the trainer's ``main`` on every rank, one of which stalls.

``stall_worker.py RANK CALLS STAMP FLAGS...``: every rank runs
``megatron.mllm.training.main(FLAGS)`` and exits with its status. On global rank ``RANK``, the
``CALLS``-th forward of an LLM chunk (so in the middle of the first step, after the step has
started to communicate) writes the wall-clock time to the file ``STAMP`` and stops its own
process with SIGSTOP: the rank stays alive with its sockets open but never answers, which is
what a hung GPU or a swapped-out host looks like to its peers. The test kills it afterwards.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch

from megatron.mllm import training
from megatron.mllm.chunks import LanguageChunk


def stall_at(calls: int, stamp: Path) -> None:
    """Stop this process at the ``calls``-th LLM chunk forward."""
    seen = []

    def hook(module, args):
        if not isinstance(module, LanguageChunk):
            return
        seen.append(module)
        if len(seen) == calls:
            stamp.write_text(f"{time.time()!r}\n")  # the newline marks it complete
            print(f"rank {os.environ['RANK']}: stalling (SIGSTOP)", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    torch.nn.modules.module.register_module_forward_pre_hook(hook)


if __name__ == "__main__":
    rank, calls, stamp = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    if int(os.environ["RANK"]) == rank:
        stall_at(calls, stamp)
    sys.exit(training.main(sys.argv[4:]))

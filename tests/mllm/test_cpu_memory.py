# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""On a CPU, freed tensor memory stays with the process: iterations whose tensors vary in size,
as a training step's do, fault far fewer pages in again (glibc only)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

_PROBE = """
import random, resource, sys
import torch
from megatron.mllm.cpu_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
rng = random.Random(0)
faults = []
for _ in range(24):  # an "iteration": tensors of 0.5 to 12 MiB, freed in another order
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.ones(rng.randint(1 << 17, 3 << 20)) for _ in range(rng.randint(5, 40))]
    rng.shuffle(held)
    while held:
        held.pop()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[8:]))
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt"
)
def test_freed_tensor_memory_is_reused_instead_of_faulted_in_again():
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True,
                             text=True, check=True)  # fmt: skip
        return int(out.stdout.split()[-1])

    default, kept = faults("default"), faults("keep")
    # glibc's default returns much of what the iterations freed and faults it in again.
    assert default > 20_000
    assert kept < default / 3

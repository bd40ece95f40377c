# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The GPU check's tests (marker ``cuda``): what OrchWeave claims on a CUDA device.

Without CUDA they are skipped with their reason (``tests/conftest.py``), unless the GPU check's
dry run (``tools/gpu/check.sh --dry-run``) runs them on the CPU to keep their code alive. Each
records its figures (``record_property("gpu_check", ...)``) for the check's JSON. Imports stay
inside the tests: collecting this file must not cost the suite megatron-core's import.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda

MODES = ("pp1-dp1", "pp1-dp1-post-balance", "pp1-dp1-post-balance-overlap")
"""megatron.mllm.gpu_check.modes.MODES, named here for collection."""


def _device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


@pytest.fixture(scope="module")
def cpu_reference():
    """The CPU fp32 run every mode must match (a child process without CUDA on a GPU host)."""
    from megatron.mllm.gpu_check import modes

    return modes.reference()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", MODES)
def test_training_step_matches_the_cpu(mode, dtype, cpu_reference, record_property):
    from megatron.mllm.gpu_check import modes

    assert set(MODES) == set(modes.MODES)
    if dtype == "bf16" and not torch.cuda.is_available():
        pytest.skip(modes.BF16_ON_CPU)
    run = modes.run_mode(mode, dtype)
    rec = modes.record(run, cpu_reference)
    record_property("gpu_check", ("training", f"{mode}/{dtype}", rec))
    assert torch.device(run.device).type == _device().type
    assert len(run.lm_loss) == modes.ITERATIONS
    for key, tol in modes.TOLERANCE[dtype].items():
        diff = rec["relative_difference"][key]
        assert diff <= tol, f"{key}: {getattr(run, key)} vs CPU {getattr(cpu_reference, key)}"
    # The loss reflects the update: the second step's loss differs from the first's.
    assert run.lm_loss[1] != run.lm_loss[0]
    assert run.audit["clean"], f"tensors left off {run.device}: {run.audit}"
    if torch.cuda.is_available():
        assert run.peak_memory_bytes > 0


@pytest.fixture(scope="module")
def flex():
    from megatron.mllm.gpu_check.attention_check import FlexFunction

    return FlexFunction(_device())


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_attention_matches_per_sequence(dtype, causal, flex, record_property):
    from megatron.mllm.gpu_check import attention_check as ac

    device = _device()
    case = ac.GPU_CASE if device.type == "cuda" else ac.CPU_CASE
    r = ac.check_case(device, dtype, causal, case, flex)
    r["flex"] = flex.how
    record_property("gpu_check", ("attention", f"{dtype}/{'causal' if causal else 'bidir'}", r))
    assert r["forward_error"] <= r["tolerance"], r
    assert r["backward_error"] <= r["tolerance"], r
    if causal and dtype == ("bf16" if device.type == "cuda" else "fp32"):
        # Times for the record only (no test asserts on speed).
        record_property(
            "gpu_check", ("attention", "timing_ms", ac.time_kernels(device, case, flex))
        )

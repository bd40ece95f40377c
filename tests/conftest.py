# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Settings of the whole test suite."""

from __future__ import annotations

import os

import pytest

# No progress bars in tests, even with `pytest -s` on a terminal, nor in the tools they start.
os.environ["ORCHWEAVE_PROGRESS"] = "0"
# No host probe when a calibration is loaded (orchestration.host_probe): the suite's timing
# must not grow by it, nor its results depend on this host's speed. Its tests pass fake probes.
os.environ["ORCHWEAVE_CALIBRATION_PROBE"] = "0"


CUDA_SKIP_REASON = "needs a CUDA device (torch.cuda.is_available() is False)"
"""Why a test marked ``cuda`` is skipped here."""


def pytest_collection_modifyitems(config, items):
    """Skip the ``cuda`` tests without CUDA, unless the GPU check's dry run runs them on the
    CPU (``ORCHWEAVE_GPU_CHECK_DRY_RUN=1``, set by ``tools/gpu/check.sh --dry-run``)."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked or os.environ.get("ORCHWEAVE_GPU_CHECK_DRY_RUN") == "1":
        return
    import torch  # only when there are such tests: most of the suite never needs it here

    if torch.cuda.is_available():
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=CUDA_SKIP_REASON))

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Shared fixtures of the trainer tests."""

from __future__ import annotations

import pytest
from equivalence import FULL_SHAPES, gradients


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """PP=1, DP=1, TP=1 on the default workload: one process sees the whole global batch."""
    ref = gradients(tmp_path_factory.mktemp("ref"), 1, [])
    FULL_SHAPES.update({name: g.shape for name, g in ref[0].items()})
    return ref

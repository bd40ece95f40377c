# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The main job learns, bit for bit, what it learned before the restructuring, in every mode."""

from __future__ import annotations

import json

import pytest
from golden_losses import GOLDEN, MODES, pinned_numerics, run_modes

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(pinned_numerics() is not None, reason=str(pinned_numerics())),
]


@pytest.mark.parametrize("world", sorted(MODES))
def test_losses_and_grad_norms_are_bit_identical(world, tmp_path):
    stored = json.loads(GOLDEN.read_text())
    now = run_modes(tmp_path, world)
    for mode, records in now.items():
        assert records == stored[mode], f"{mode}: {records} != stored {stored[mode]}"

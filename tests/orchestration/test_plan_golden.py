# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Every plan decision on every workload spec at DP 8/64/512/2560 equals the stored one."""

from __future__ import annotations

import json

from golden_plans import GOLDEN, compute


def test_plans_are_bit_identical_to_the_stored_ones():
    stored = json.loads(GOLDEN.read_text())
    now = compute()
    assert set(now) == set(stored)
    changed = sorted(name for name in stored if now[name] != stored[name])
    assert not changed, f"{len(changed)} of {len(stored)} plans changed, e.g. {changed[:5]}"

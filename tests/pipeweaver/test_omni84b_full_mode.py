# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""tools/bench/omni84b_full_mode.py: a case that must fit 80 GB recomputes as little as fits.
The oracle is brute force over every block size on a fake simulator whose memory falls as more
layers are recomputed (the 84B runs themselves take minutes: not here)."""

from __future__ import annotations

import pytest
from bench_modules import bench_module


@pytest.fixture(scope="module")
def bench():
    return bench_module("omni84b_full_mode")


def fake_simulate(needed: int | None):
    """A SEMU stand-in: fits from ``needed`` recomputed layers on (None: never, 0: always);
    per-layer recompute always fits. Returns it and the flag lists it was asked."""
    asked = []

    def simulate(flags, iteration):
        asked.append(list(flags))
        settings = dict(f.split("=", 1) for f in flags if "=" in f)
        if settings.get("recompute-method") == "uniform":
            return {"over_memory_ranks": [], "flags": flags}
        n = int(settings.get("recompute-num-layers", 0))
        over = needed is None or n < needed
        return {"over_memory_ranks": [0] if over else [], "flags": flags}

    return simulate, asked


@pytest.mark.parametrize("needed", [0, 1, 5, 33, 80, None])
def test_a_fitted_case_takes_the_least_recompute_that_fits(bench, monkeypatch, needed):
    simulate, asked = fake_simulate(needed)
    monkeypatch.setattr(bench, "simulate", simulate)
    monkeypatch.setattr(bench, "clear_flow_caches", lambda: None)
    got, flags = bench.run_case(bench.STRONG, 0)
    assert got["flags"] == flags and not got["over_memory_ranks"]
    if needed == 0:
        assert flags == bench.CASES[bench.STRONG] and bench.recompute_of(flags) == "none"
    elif needed is None:
        assert flags == [*bench.CASES[bench.STRONG], *bench.LAYER_RC]
        assert bench.recompute_of(flags) == "every layer"
    else:
        assert flags == [
            *bench.CASES[bench.STRONG],
            *bench_module("least_recompute").block_recompute(needed),
        ]
        assert bench.recompute_of(flags) == f"block {needed}"
    # A case not marked to fit runs as it is, once, even over the memory.
    asked.clear()
    got, flags = bench.run_case("megatron-packed", 0)
    assert flags == bench.CASES["megatron-packed"] and len(asked) == 1

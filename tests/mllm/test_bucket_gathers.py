# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""On gloo, ``OrderedParamGather`` dispatches each bucket's parameter all-gather as a collective
of its own (``megatron.mllm.param_gather.start_bucket_gathers``; the module says why): with every
bucket's gather in flight at once beside compute and the reductions' coalesced reduce-scatters
on the same group, every rank receives exactly what each rank wrote, step after step.

This checks the values and the bookkeeping, not the gloo fault the dispatch avoids: megatron-core's
coalesced gathers passed this worker's milder pattern too, in 10 launches of 200 to 1,000 steps;
the fault showed in a heavier stress on a loaded host (the README's "Overlapped parameter
gathering")."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import check, torchrun

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("bucket_gather_worker.py")


def test_every_bucket_gathered_in_flight_at_once_gets_every_ranks_shard():
    proc = check(torchrun(2, WORKER, ["200"], timeout=240))
    assert "gathered 200 steps" in proc.stdout

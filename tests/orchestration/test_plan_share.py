# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""One plan per host: the planning workers of a group share each answer (one of them runs the
job, the others read its answer); a reader whose claimer is gone, or that waits too long, runs
the job itself; the files are tidied as the iterations pass and removed at close."""

from __future__ import annotations

import functools
import os
import pickle
import time

import pytest

from megatron.mllm.steps.plan_ahead import PlanAhead
from orchestration.plan_share import PlanShare, ShareWorkerState


def _ranks(share_a: PlanShare | None, share_b: PlanShare | None) -> list[PlanAhead]:
    return [
        PlanAhead(enabled=True, timeout_s=30, name=f"rank {r}", share=s)
        for r, s in enumerate((share_a, share_b))
    ]


def test_the_workers_of_a_group_run_each_job_once_and_all_take_its_answer(tmp_path):
    share = PlanShare.for_group(0x5EED, wait_s=20, root=str(tmp_path))
    ranks = _ranks(share, share)
    try:
        for iteration in (1, 2, 3):
            # A job that can run once only: a second mkdir of the same path raises.
            made = tmp_path / f"made-{iteration}"
            for ahead in ranks:
                ahead.submit(iteration, functools.partial(os.mkdir, made))
            assert [a.take(iteration, lambda: "in step") for a in ranks] == [(None, True)] * 2
            assert made.is_dir()
    finally:
        for ahead in ranks:
            ahead.close()
    assert not os.path.exists(share.directory)


def test_without_a_shared_directory_each_worker_runs_the_job(tmp_path):
    """The oracle of the test above can fail: two groups (two tokens) each run the job, and
    the second mkdir raises in the step that takes it."""
    ranks = _ranks(*(PlanShare.for_group(t, wait_s=20, root=str(tmp_path)) for t in (1, 2)))
    try:
        made = tmp_path / "made"
        ranks[0].submit(1, functools.partial(os.mkdir, made))
        assert ranks[0].take(1, lambda: None) == (None, True)
        ranks[1].submit(1, functools.partial(os.mkdir, made))
        with pytest.raises(FileExistsError):
            ranks[1].take(1, lambda: None)
    finally:
        for ahead in ranks:
            ahead.close()


def _job(value):
    return pickle.dumps((True, value))


def test_a_reader_runs_the_job_itself_when_the_claimer_is_gone_or_late(tmp_path):
    share = PlanShare.for_group(7, wait_s=0.3, root=str(tmp_path))
    os.makedirs(share.directory)
    worker = ShareWorkerState()
    # Another worker's answer is read, not recomputed.
    open(os.path.join(share.directory, "4.claim"), "wb").close()
    with open(os.path.join(share.directory, "4.answer"), "wb") as f:
        f.write(_job("theirs"))
    assert worker.answer(share, 4, lambda: _job("mine")) == (_job("theirs"), False)
    # A claim that never gets its answer: the reader waits its bound, then runs the job.
    open(os.path.join(share.directory, "5.claim"), "wb").close()
    start = time.monotonic()
    assert worker.answer(share, 5, lambda: _job("mine")) == (_job("mine"), True)
    assert time.monotonic() - start >= 0.3
    # After a rank that closed removed the directory, a worker still planning claims anew.
    share.close()
    start = time.monotonic()
    assert worker.answer(share, 6, lambda: _job("mine")) == (_job("mine"), True)
    assert time.monotonic() - start < 0.3


def test_a_worker_deletes_its_claims_two_iterations_behind_and_at_close(tmp_path):
    share = PlanShare.for_group(9, wait_s=1, root=str(tmp_path))
    worker = ShareWorkerState()
    for iteration in range(1, 6):
        assert worker.answer(share, iteration, lambda: _job(iteration)) == (_job(iteration), True)
    assert sorted(os.listdir(share.directory)) == ["4.answer", "4.claim", "5.answer", "5.claim"]
    worker.close()
    assert os.listdir(share.directory) == []

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The rank's planning worker: a process of its own that makes the next iteration's plan.

A plan made in a thread of the training process shares its interpreter lock: each time the
step's thread releases the lock around a kernel, the planner may take it, and the step waits
for it back before it can launch the next one (on the 2-core CPU main job the thread's plans
took 13-21 ms of wall time for about 5 ms of work). A worker process shares nothing with the
step but the cores, which a GPU host has to spare. It runs at the step's priority: at the
lowest (niceness 19) its plans came late on the 2-core CPU host, 2.05 ms of waiting left on
the critical path per iteration against 1.48 ms (README, post-balancing figures).

The worker is a fresh interpreter (``pipeweaver.pipe_workers``: never the parent's main
script, never a forked copy of a process holding torch's threads) that imports numpy and the
planners only. It runs one :class:`~orchestration.plan_job.PlanJob` at a time and answers
``(job id, answer, seconds)``, the answer pickled ``(ok, value)``: the job's result, or the
exception it raised. The workers of a DP group's ranks on one host may share each answer
(:mod:`orchestration.plan_share`): every rank's plan is the same. The parent
reads only its own job's answer (an answer to a job it dropped is skipped), every wait is
bounded, and a worker that died is one error naming the rank and how it ended.

The dynamic pipeline's schedule search runs in such a worker too, for the same reason
(``pipeweaver.search.batch_search.SearchInWorker``, whose jobs keep the searcher resident).

This module is imported by the worker: it must import nothing heavy at module level.
"""

from __future__ import annotations

import pickle
import threading
import time
import weakref
from typing import Any, Callable

from orchestration.metadata import PlanError
from orchestration.plan_share import PlanShare, ShareWorkerState
from pipeweaver.pipe_workers import exit_status, launch, stop, worker_ends, worker_env

_WORKER = "import sys; from orchestration.plan_worker import serve; serve(sys.argv[1:])"


class PlanWorkerTimeout(PlanError):
    """No answer within the timeout."""


class PlanWorker:
    """One planning process, one job at a time (see the module docstring)."""

    def __init__(self, name: str, role: str = "planning worker",
                 hint: str = "--no-plan-ahead plans in the step", niceness: int = 0):  # fmt: skip
        """Args:
        name: who the worker plans for, as errors name it (e.g. ``rank 3``).
        role: what the worker is, as errors name it (the schedule search's is a ``search
            worker``: ``pipeweaver.search.batch_search``).
        hint: how to run without the worker, as the error of its death says.
        niceness: how much lower than the step's the worker's scheduling priority is (0: the
            same, as the balance plan needs: the step waits for it).
        """
        self.name = name
        self.role = role
        self.hint = hint
        self.process, self.tasks, self.results = launch(_WORKER, worker_env(), niceness)
        self._lock = threading.Lock()
        self._next_id = 0
        self._finalizer = weakref.finalize(self, stop, [self])

    def submit(self, job: Callable[[], Any],
               share: tuple[PlanShare, int] | None = None) -> "PlanTicket":  # fmt: skip
        """Send ``job`` (picklable) to the worker; its answer comes through the ticket.
        ``share``: the group's :class:`~orchestration.plan_share.PlanShare` and the iteration
        the job plans, whose answer the group's workers on this host share."""
        with self._lock:
            self._next_id += 1
            try:
                # The job travels pickled apart, so that a job the worker cannot unpickle is
                # still answered under its id.
                self.tasks.send((self._next_id, pickle.dumps(job, protocol=5), share))
            except OSError:
                raise PlanError(self._lost()) from None
            return PlanTicket(self, self._next_id)

    def _answer(self, job_id: int, timeout_s: float) -> tuple[bool, Any, float]:
        """Wait for job ``job_id``'s answer, skipping those of earlier jobs."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.results.poll(left):
                raise PlanWorkerTimeout(f"no answer within {timeout_s:.0f} s")
            try:
                answer_id, raw, seconds = self.results.recv()
            except (EOFError, OSError):
                raise PlanError(self._lost()) from None
            if answer_id == job_id:
                ok, value = pickle.loads(raw)
                return ok, value, seconds

    def _lost(self) -> str:
        return (
            f"the {self.role} of {self.name} (pid {self.process.pid}) died "
            f"({exit_status(self)}); {self.hint}"
        )

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        self._finalizer()


class PlanTicket:
    """One submitted job's answer, waited for once and kept (several threads may ask)."""

    def __init__(self, worker: PlanWorker, job_id: int):
        self._worker = worker
        self._id = job_id
        self._lock = threading.Lock()
        self._answer: tuple[bool, Any, float] | None = None

    def result(self, timeout_s: float) -> tuple[Any, float]:
        """The job's result and the worker's seconds on it.

        Raises:
            PlanWorkerTimeout: no answer within ``timeout_s``.
            PlanError: the worker died.
            Exception: what the job raised, as it raised it.
        """
        if not self._lock.acquire(timeout=timeout_s):
            raise PlanWorkerTimeout(f"no answer within {timeout_s:.0f} s")
        try:
            if self._answer is None:
                with self._worker._lock:
                    self._answer = self._worker._answer(self._id, timeout_s)
        finally:
            self._lock.release()
        ok, value, seconds = self._answer
        if not ok:
            raise value
        return value, seconds


def serve(argv: list[str]) -> None:
    """The worker's loop: run each job (or read its answer from another worker of the group,
    :mod:`orchestration.plan_share`), answer its pickled result or exception, until the parent
    closes the task pipe."""
    tasks, results = worker_ends(argv)
    import orchestration.phase_plan  # noqa: F401  (the planners, before the first job)
    import orchestration.sample_plan  # noqa: F401

    shared = ShareWorkerState()
    try:
        while True:
            try:
                job_id, raw, share = tasks.recv()
            except (EOFError, OSError):
                return
            start = time.perf_counter()
            run = lambda: _run(raw)  # noqa: E731
            answer = run() if share is None else shared.answer(*share, run)[0]
            try:
                results.send((job_id, answer, time.perf_counter() - start))
            except (EOFError, OSError):
                return
    finally:
        shared.close()


def _run(raw: bytes) -> bytes:
    """One job's answer, pickled once (a shared answer is written as it is sent): ``(True,
    result)``, or ``(False, exception)`` for the parent to raise where the plan is taken."""
    try:
        answer = (True, pickle.loads(raw)())
    except Exception as e:
        answer = (False, e)
    try:
        return pickle.dumps(answer, protocol=5)
    except Exception as e:  # a result or an exception that does not pickle
        return pickle.dumps((False, PlanError(f"a plan's answer did not pickle: {e}")))

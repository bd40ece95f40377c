# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Planning the next iteration while this one runs: the balance plan off the critical path.

Megatron's data order is known ahead, so the loader gathers iteration ``i + 1``'s metadata with
iteration ``i``'s (``BatchLoader.lookahead``), and the step hands the plan of ``i + 1`` (a
picklable ``orchestration.plan_job.PlanJob``) to the rank's planning worker before it runs
``i``: a process of its own, at the step's priority (``orchestration.plan_worker``: a thread
would share the step's interpreter lock). The ranks of a DP group on one host share each plan
(``orchestration.plan_share``): one of their workers makes it, the others read it. When
``i + 1`` starts its plan is (normally) ready: what is left on the critical path is the wait for
it, timed as ``plan-wait``, about zero once the plan takes less than a step. The planners are
pure numpy (``orchestration``), so the worker needs no process group.

The plan's digest, which every rank must agree on before anything moves, rides on the next
metadata gather (:func:`digest_words`, :func:`check_control_digests`) instead of costing a
collective of its own.

A plan is a pure function of the gathered metadata and the cost model, both fixed when it is
submitted, so a resumed run that plans its first iteration in the step gets the plan the
uninterrupted run made ahead.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

import numpy as np

from orchestration.metadata import PlanError, check_digests
from orchestration.plan_share import PlanShare
from orchestration.plan_worker import PlanTicket, PlanWorker, PlanWorkerTimeout

T = TypeVar("T")

DIGEST_WORDS = 4
"""int64 words of a plan digest: its 32 sha256 bytes."""


class PlanAhead(Generic[T]):
    """At most one plan in flight, for the iteration after the current one."""

    def __init__(self, enabled: bool, timeout_s: float, name: str = "this rank",
                 share: PlanShare | None = None):  # fmt: skip
        """Args:
        enabled: plan in the planning worker; False plans every iteration in the step.
        timeout_s: the longest wait for a plan (``--distributed-timeout-minutes``).
        name: whose plans they are, as errors name it (``rank 3``).
        share: the DP group's plans on this host (:mod:`orchestration.plan_share`): one
            worker of the group's ranks here makes each plan, the others read it; None: this
            rank's worker makes every plan.
        """
        self.enabled = enabled
        self.timeout_s = timeout_s
        self.name = name
        self.share = share
        self._worker: PlanWorker | None = None  # launched with the first job
        self._pending: tuple[int, PlanTicket] | None = None
        self.background_s = 0.0
        """Seconds the worker spent on the plan taken last (0 when it was planned in step)."""

    def submit(self, iteration: int, job: Callable[[], T]) -> None:
        """Start planning ``iteration`` in the worker (nothing when disabled); ``job`` is
        picklable."""
        if not self.enabled:
            return
        if self._worker is None:
            self._worker = PlanWorker(self.name)
        share = (self.share, iteration) if self.share is not None else None
        self._pending = (iteration, self._worker.submit(job, share))

    def has(self, iteration: int) -> bool:
        """Whether ``iteration``'s plan was submitted ahead."""
        return self._pending is not None and self._pending[0] == iteration

    def take(self, iteration: int, planner: Callable[[], T]) -> tuple[T, bool]:
        """``iteration``'s plan: the one made ahead, or ``planner()`` now.

        Returns:
            The plan, and whether it was made ahead.

        Raises:
            PlanError: the background plan did not finish within the timeout. An error of the
                planner itself (a cap that cannot be met) is raised here as it was raised there.
        """
        if not self.has(iteration):
            self._pending = None
            self.background_s = 0.0
            return planner(), False
        plan, self.background_s = self._result()
        self._pending = None
        return plan, True

    def waiter(self, iteration: int) -> Callable[[], T] | None:
        """A function that waits for ``iteration``'s plan submitted ahead and returns it (for
        another thread; the plan stays to be taken), else None."""
        if not self.has(iteration):
            return None
        ticket = self._pending[1]
        return lambda: ticket.result(self.timeout_s)[0]

    def peek(self, iteration: int) -> T | None:
        """``iteration``'s plan if it was submitted ahead (waiting for it; it stays to be
        taken), else None."""
        return self._result()[0] if self.has(iteration) else None

    def _result(self) -> tuple[T, float]:
        """The plan in flight and the worker's seconds on it, waiting at most the timeout."""
        iteration, ticket = self._pending
        try:
            return ticket.result(self.timeout_s)
        except PlanWorkerTimeout:
            raise PlanError(
                f"the balance plan of iteration {iteration}, computed ahead, did not finish "
                f"within {self.timeout_s:.0f} s (--distributed-timeout-minutes)"
            ) from None

    def made(self) -> T | None:
        """The job in flight's result, waited for (it stays to be taken), or None."""
        return self._result()[0] if self._pending is not None else None

    def drop_other(self, iteration: int) -> T | None:
        """The result of a job in flight for another iteration than ``iteration``, waited for
        and dropped (what it learnt is not lost), or None."""
        if self._pending is None or self._pending[0] == iteration:
            return None
        result = self._result()[0]
        self._pending = None
        return result

    def close(self) -> None:
        """Stop the worker (a plan in flight is dropped) and remove the group's shared plans
        on this host (a rank still running plans for itself from then on)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        self._pending = None
        if self.share is not None:
            self.share.close()


def digest_words(digest: str) -> np.ndarray:
    """A plan's hex digest as the int64 control words that ride on the metadata gather."""
    raw = bytes.fromhex(digest)[: 8 * DIGEST_WORDS].ljust(8 * DIGEST_WORDS, b"\0")
    return np.frombuffer(raw, dtype=np.int64).copy()


def check_control_digests(controls: list[np.ndarray], what: str = "balance plan") -> None:
    """Every rank's digest words (the first :data:`DIGEST_WORDS` of its control words) agree.

    Raises:
        PlanDigestMismatch: naming the ranks that differ from rank 0.
    """
    digests = [np.asarray(c[:DIGEST_WORDS], dtype=np.int64).tobytes().hex() for c in controls]
    check_digests(digests, what)

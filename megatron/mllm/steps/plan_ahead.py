# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Planning the next iteration while this one runs: the balance plan off the critical path.

Megatron's data order is known ahead, so the loader gathers iteration ``i + 1``'s metadata with
iteration ``i``'s (``BatchLoader.lookahead``), and the step hands the planner for ``i + 1`` to
one background thread before it runs ``i``. When ``i + 1`` starts its plan is (normally)
ready: what is left on the critical path is the wait for it, timed as ``plan-wait``, about zero
once the plan takes less than a step. The planners are pure numpy (``orchestration``), so the
thread needs no process group.

The plan's digest, which every rank must agree on before anything moves, rides on the next
metadata gather (:func:`digest_words`, :func:`check_control_digests`) instead of costing a
collective of its own.

A plan is a pure function of the gathered metadata and the cost model, both fixed when it is
submitted, so a resumed run that plans its first iteration in the step gets the plan the
uninterrupted run made ahead.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Callable, Generic, TypeVar

import numpy as np

from orchestration.metadata import PlanError, check_digests

T = TypeVar("T")

DIGEST_WORDS = 4
"""int64 words of a plan digest: its 32 sha256 bytes."""


class PlanAhead(Generic[T]):
    """At most one plan in flight, for the iteration after the current one."""

    def __init__(self, enabled: bool, timeout_s: float):
        """Args:
        enabled: plan in a background thread; False plans every iteration in the step.
        timeout_s: the longest wait for a plan (``--distributed-timeout-minutes``).
        """
        self.enabled = enabled
        self.timeout_s = timeout_s
        self._executor = None
        if enabled:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="orchweave-plan-ahead"
            )
        self._pending: tuple[int, concurrent.futures.Future] | None = None
        self.background_s = 0.0
        """Seconds the thread spent on the plan taken last (0 when it was planned in step)."""

    def submit(self, iteration: int, planner: Callable[[], T]) -> None:
        """Start planning ``iteration`` in the background (nothing when disabled)."""
        if self._executor is None:
            return
        self._pending = (iteration, self._executor.submit(_timed, planner))

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
        future = self._pending[1]
        return lambda: future.result(timeout=self.timeout_s)[0]

    def peek(self, iteration: int) -> T | None:
        """``iteration``'s plan if it was submitted ahead (waiting for it; it stays to be
        taken), else None."""
        return self._result()[0] if self.has(iteration) else None

    def _result(self) -> tuple[T, float]:
        """The plan in flight and the thread's seconds on it, waiting at most the timeout."""
        iteration, future = self._pending
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise PlanError(
                f"the balance plan of iteration {iteration}, computed ahead, did not finish "
                f"within {self.timeout_s:.0f} s (--distributed-timeout-minutes)"
            ) from None

    def wait(self) -> None:
        """Wait for the plan in flight, if any, to be made (it stays to be taken)."""
        if self._pending is not None:
            self._result()

    def close(self) -> None:
        """Stop the thread (a plan in flight is finished and dropped)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._pending = None


def _timed(planner: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    plan = planner()
    return plan, time.perf_counter() - start


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

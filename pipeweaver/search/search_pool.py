# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Worker processes that score the schedule search's orders (``workers`` > 1 in
:func:`pipeweaver.search.mcts.search_schedule`).

The search tree stays in the parent (:func:`pipeweaver.search.mcts.tree_search`'s waves); a
pool only evaluates: :meth:`SearchPool.load` gives every worker the scorer once per search (an
:class:`~pipeweaver.search.mcts.OrderEvaluator`, pickled once), then :meth:`SearchPool.evaluate`
cuts a wave's orders (index tuples) into one task per worker and returns their seconds in
order. Results depend only on the orders, never on which worker ran them or when.

A worker is a fresh interpreter on two pipes (:mod:`pipeweaver.pipe_workers`, shared with the
loader's decode pool) that imports this module and whatever unpickling the scorer needs
(pipeweaver and numpy, about 0.2 s), never the trainer's script or torch; no
``torch.distributed``.

A worker holds one task at a time and the pool writes only to idle workers, so neither side
blocks on a full pipe. Every wait is bounded (``timeout_s``); a worker that dies, fails or
stops answering gives one :class:`SearchPoolError` naming it, and the pool is closed, never a
hang. Workers stop at :meth:`SearchPool.close` (or the ``with`` block's end), when the pool is
dropped, at the parent's exit, or when the parent is gone (their task pipe ends).

The number of workers is capped at half the host's cores (:func:`max_search_workers`): the
search shares the host with the training processes.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import time
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Callable, Sequence

from pipeweaver.pipe_workers import exit_status, launch, stop, worker_ends, worker_env

DEFAULT_TIMEOUT_S = 120.0
"""Bound of one wait on the workers (a start, a load or one wave's orders)."""

Indices = tuple[int, ...]
"""An order as indices into the search space's groups (as :data:`pipeweaver.search.mcts.Indices`)."""

_WORKER = "import sys; from pipeweaver.search.search_pool import serve; serve(sys.argv[1:])"


class SearchPoolError(RuntimeError):
    """A search worker died, failed or stopped answering (the message names it)."""


def max_search_workers() -> int:
    """The most search workers this host allows: half its cores, at least 1."""
    return max(1, (os.cpu_count() or 1) // 2)


def check_workers(workers: int, max_workers: int | None = None, name: str = "workers") -> int:
    """``workers`` if it is at least 1 and at most the cap, else a ValueError naming both.

    Args:
        workers: search processes asked for.
        max_workers: the cap (None: :func:`max_search_workers`, half the host's cores).
        name: how the error names the setting (e.g. a flag).
    """
    cap = max_search_workers() if max_workers is None else max_workers
    if workers < 1 or workers > cap:
        why = f"half of this host's {os.cpu_count()} cores" if max_workers is None else "the cap"
        raise ValueError(f"{name} must be between 1 and {cap} ({why}), got {workers}")
    return workers


def cached_many(
    cache: dict[Indices, float],
    evaluate_many: Callable[[list[Indices]], Sequence[float]],
    orders: Sequence[Indices],
) -> list[float]:
    """The seconds of ``orders`` from ``cache``, scoring the missing ones (each once, in
    order of first appearance) with ``evaluate_many`` and storing them.

    Args:
        cache: order -> seconds (updated).
        evaluate_many: orders -> seconds (e.g. :meth:`SearchPool.evaluate`).
        orders: the wave's orders (repeats allowed).
    """
    missing = list(dict.fromkeys(o for o in orders if o not in cache))
    if missing:
        for order, t in zip(missing, evaluate_many(missing), strict=True):
            cache[order] = float(t)
    return [cache[o] for o in orders]


def serve(argv: list[str]) -> None:
    """A worker's loop (``argv``: the fds of its task and result pipes): say it is ready, then
    answer each task until the task pipe ends or says stop.

    Tasks: ``("load", bytes)`` unpickles the scorer; ``("eval", orders)`` answers the seconds
    of each order.
    """
    tasks, results = worker_ends(argv)
    try:
        results.send(("ready", os.getpid()))
    except OSError:  # the pool was closed before this worker started
        return
    score: Callable | None = None
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError):  # the parent closed the pool, or is gone
            return
        if task[0] == "stop":
            return
        try:
            if task[0] == "load":
                score = pickle.loads(task[1])
                results.send(("ok", None))
            else:
                results.send(("ok", [float(score(order)) for order in task[1]]))
        except (BrokenPipeError, EOFError):
            return
        except Exception:  # the parent raises it, naming this worker
            results.send(("error", traceback.format_exc()))


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen
    tasks: Connection
    results: Connection
    ready: bool = False


class SearchPool:
    """``workers`` scoring processes, started at once and reused for every search.

    Use as a context manager (or call :meth:`close`)::

        with SearchPool(2) as pool:
            result = search_schedule(..., workers=2, pool=pool)
    """

    def __init__(
        self, workers: int, *, max_workers: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
    ):
        """Launch the workers (they import in the background; the first wait waits for them).

        Args:
            workers: how many processes (1 to the cap).
            max_workers: the cap (None: half the host's cores, :func:`max_search_workers`).
            timeout_s: the longest any wait on the workers may last.

        Raises:
            ValueError: ``workers`` is below 1 or above the cap.
        """
        self.workers = check_workers(workers, max_workers)
        self.timeout_s = float(timeout_s)
        self.startup_s: float | None = None
        """Seconds from launch until every worker was ready (set by the first wait)."""
        self._started = time.perf_counter()
        self._broken: str | None = None
        self._loaded = False
        env = worker_env()
        self._workers: list[_Worker] = []
        try:
            for i in range(workers):
                self._workers.append(_Worker(i, *launch(_WORKER, env)))
        except BaseException:
            stop(self._workers)
            raise
        # At exit, or when the pool is dropped unclosed, its workers stop all the same.
        self._finalizer = weakref.finalize(self, stop, self._workers)

    def __enter__(self) -> "SearchPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [w.process.pid for w in self._workers]

    def load(self, score: Callable[[tuple[int, ...]], float]) -> None:
        """Give every worker ``score`` (order -> seconds), pickled once; later
        :meth:`evaluate` calls use it.

        Raises:
            ValueError: ``score`` cannot be pickled (e.g. a local function).
            SearchPoolError: a worker died, failed to unpickle it or gave no answer in time.
        """
        try:
            blob = pickle.dumps(score, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise ValueError(
                f"search workers need a picklable scorer, {type(score).__name__} is not: {e}"
            ) from None
        self._run([("load", blob)] * self.workers, "loading the scorer")
        self._loaded = True

    def evaluate(self, orders: Sequence[tuple[int, ...]]) -> list[float]:
        """The seconds of each order, in order (one task per worker, contiguous slices).

        Raises:
            SearchPoolError: a worker died, failed or gave no answer within ``timeout_s``.
            RuntimeError: no scorer was loaded.
        """
        orders = [tuple(o) for o in orders]
        if not orders:
            return []
        if not self._loaded:
            raise RuntimeError("load a scorer into the search pool before evaluating")
        k = min(self.workers, len(orders))
        cuts = [len(orders) * i // k for i in range(k + 1)]
        tasks = [("eval", orders[cuts[i] : cuts[i + 1]]) for i in range(k)]
        out = self._run(tasks, f"scoring {len(orders)} orders")
        return [t for part in out for t in part]

    def close(self) -> None:
        """Stop the workers (idempotent); later calls raise."""
        self._broken = self._broken or "error: the schedule search pool is closed"
        self._finalizer()

    def _run(self, tasks: list[tuple], what: str) -> list:
        """Send ``tasks[i]`` to worker i once it is ready; every answer, in task order."""
        if self._broken is not None:
            raise SearchPoolError(self._broken)
        try:
            return self._exchange(tasks, what)
        except BaseException as e:  # a worker may still hold a task: the pool cannot go on
            if isinstance(e, SearchPoolError):
                self._broken = str(e)
            else:
                self._broken = f"error: the schedule search pool stopped while {what} ({e!r})"
            self.close()
            raise

    def _exchange(self, tasks: list[tuple], what: str) -> list:
        answers: list = [None] * len(tasks)
        deadline = time.monotonic() + self.timeout_s
        waiting = {w.results: w for w in self._workers[: len(tasks)]}
        for w in waiting.values():
            if w.ready:
                self._send(w, tasks[w.index], what)
        while waiting:
            left = deadline - time.monotonic()
            answered = wait(list(waiting), timeout=max(0.0, left)) if left > 0 else []
            if not answered:
                names = ", ".join(str(w.index) for w in waiting.values())
                raise SearchPoolError(
                    f"error: schedule search worker(s) {names} gave no answer in "
                    f"{self.timeout_s:g} s while {what}; a worker is stuck or the host is "
                    "overloaded"
                )
            for conn in answered:
                w = waiting[conn]
                try:
                    kind, value = conn.recv()
                except (EOFError, OSError):
                    raise SearchPoolError(self._lost(w, what)) from None
                if kind == "ready":
                    w.ready = True
                    if all(x.ready for x in self._workers) and self.startup_s is None:
                        self.startup_s = time.perf_counter() - self._started
                    self._send(w, tasks[w.index], what)
                    continue
                if kind == "error":
                    last = value.strip().splitlines()[-1]
                    raise SearchPoolError(
                        f"error: schedule search worker {w.index} (pid {w.process.pid}) failed "
                        f"while {what}: {last}"
                    )
                answers[w.index] = value
                del waiting[conn]
        return answers

    def _send(self, w: _Worker, task: tuple, what: str) -> None:
        try:
            w.tasks.send(task)
        except OSError:  # a broken pipe: the worker is gone
            raise SearchPoolError(self._lost(w, what)) from None

    def _lost(self, w: _Worker, what: str) -> str:
        return (
            f"error: schedule search worker {w.index} (pid {w.process.pid}) died "
            f"({exit_status(w)}) while {what}; workers=1 searches in the main process"
        )

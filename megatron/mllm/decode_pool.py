# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Worker processes that decode the real-data streams' media (``--num-workers N``).

The main process reads the samples (their text and the media's headers, for the balancer) and
keeps the media's encoded bytes; once the batch's metadata has been checked, each item's bytes
and its preprocessor (a frozen dataclass: :class:`~megatron.mllm.preprocess.ImageTiling`,
:class:`~megatron.mllm.image_dynamic.DynamicResolution` or
:class:`~megatron.mllm.preprocess.AudioFeatures`) go to a worker, which returns
``prep.features(data)``: numpy arrays, bit-identical to decoding in the main process
(:func:`decode_item` is the one function both run).

A worker is a fresh interpreter (``python -c``, spawn semantics) that imports only numpy,
Pillow, soundfile and the preprocessing modules, never torch or megatron.core. It is launched by
hand rather than by ``multiprocessing``'s ``spawn`` or ``forkserver`` contexts: those run the
parent's main script again in every worker (``scripts/pretrain_mllm.py`` imports the trainer:
torch and megatron.core, about 13 s per process on a small host), and forking a process that
holds torch's OpenMP threads can deadlock. Each worker talks to the pool over two pipes
(:class:`multiprocessing.connection.Connection` framing and pickling), launched and stopped by
:mod:`pipeweaver.pipe_workers` as the schedule search's workers are.

A worker holds one task (a few items) at a time: the pool writes to a worker only when it
waits for a task, so neither side can block writing to a full pipe while the other does the
same. Every wait on
the workers is bounded (``timeout_s``; a run passes ``--distributed-timeout-minutes``), and a
worker that dies or stops answering gives one :class:`DecodePoolError` naming the stream, the
rank and the sample, never a hang. Workers stop at :meth:`DecodePool.close`, at the parent's
exit, or when the parent is gone (their task pipe ends).

This module is imported by the workers: it must import nothing heavy at module level.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from orchestration.workload import WorkloadError
from pipeweaver.pipe_workers import exit_status, launch, stop, worker_ends, worker_env

HEAVY_MODULES = ("torch", "megatron.core")
"""Modules a worker must never import (a test checks them in a live worker)."""

CHUNKS_PER_WORKER = 2
"""Tasks a batch's items are cut into, per worker (see :meth:`DecodePool.map`)."""

DEFAULT_TIMEOUT_S = 600.0
"""Bound of a wait on the workers when none is given (Megatron's default distributed timeout)."""

"""The checkout holding ``megatron/mllm`` and ``orchestration``, put on a worker's path."""

_WORKER = "import sys; from megatron.mllm.decode_pool import serve; serve(sys.argv[1:])"


class DecodePoolError(WorkloadError):
    """A decode worker died, stopped answering or failed unexpectedly; names stream and rank."""


@dataclass(frozen=True)
class Failed:
    """An item whose media cannot be decoded: the :class:`~megatron.mllm.preprocess.DecodeError`
    message, returned in place of its features so the caller names the sample."""

    message: str


def decode_item(prep, data: bytes):
    """``prep.features(data)`` (a list of arrays: uint8 pixel patches or float32 log-mels), or :class:`Failed` when the bytes
    cannot be decoded; what a worker and the main process both run for one item."""
    from megatron.mllm.preprocess import DecodeError

    try:
        return prep.features(data)
    except DecodeError as e:
        return Failed(str(e))


def serve(argv: list[str]) -> None:
    """A worker's loop (``argv``: the fds of its task and result pipes): announce itself ready,
    then answer each task until the task pipe ends or says stop."""
    tasks, results = worker_ends(argv)
    start = time.perf_counter()
    import PIL.Image  # noqa: F401 (imported once here, not within the first item's time)
    import soundfile  # noqa: F401

    import megatron.mllm.image_dynamic  # noqa: F401 (unpickles the preprocessors)

    results.send(("ready", time.perf_counter() - start))
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError):  # the parent closed the pool, or is gone
            return
        if task[0] == "stop":
            return
        try:
            if task[0] == "modules":
                results.send(("ok", sorted(sys.modules)))
            else:
                results.send(("ok", [decode_item(prep, data) for prep, data in task[1]]))
        except (BrokenPipeError, EOFError):
            return
        except Exception:  # a bug, not bad data: the parent reports it, naming the sample
            results.send(("error", traceback.format_exc()))


@dataclass
class _Worker:
    process: subprocess.Popen
    tasks: Connection
    results: Connection
    ready: bool = False
    job: int | None = None


class DecodePool:
    """``workers`` decode processes, started at once (each imports in the background) and
    reused for every batch; :meth:`map` decodes items in order."""

    def __init__(self, workers: int, name: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        """Launch the workers.

        Args:
            workers: how many processes (``--num-workers``, > 0).
            name: the stream, as errors name it (e.g. ``--data-path DIR``).
            timeout_s: the longest any wait on the workers may last.
        """
        if workers < 1:
            raise ValueError(f"a decode pool needs a worker, got {workers}")
        rank = os.environ.get("RANK")
        self.name = name if rank is None else f"{name} on rank {rank}"
        self.timeout_s = float(timeout_s)
        self.startup_s: float | None = None
        """Seconds from launch until every worker was ready (set once all have said so)."""
        self._started = time.perf_counter()
        self._lock = threading.Lock()  # one map at a time: each worker holds one item
        self._broken: str | None = None
        env = worker_env()
        self._workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self._workers.append(_Worker(*launch(_WORKER, env)))
        except BaseException:
            stop(self._workers)
            raise
        # At exit, or when the pool is dropped unclosed, its workers stop all the same.
        self._finalizer = weakref.finalize(self, stop, self._workers)

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [w.process.pid for w in self._workers]

    def map(self, jobs: list[tuple[object, bytes]], names: list[str]) -> list:
        """Decode ``(preprocessor, bytes)`` jobs on the workers; per job, in order, its features
        (a list of arrays) or :class:`Failed`.

        Args:
            jobs: the items to decode.
            names: the sample each job belongs to, for errors.

        Raises:
            DecodePoolError: a worker died, gave no answer within ``timeout_s``, or raised
                something other than a decode error; the pool is closed.
        """
        # A few tasks per worker, not one per item: on a busy host each round trip waits for
        # two wake-ups, which cost more than decoding a small image; two per worker still lets
        # a worker that drew the quick items take another.
        size = max(1, -(-len(jobs) // (CHUNKS_PER_WORKER * len(self._workers))))
        chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)]
        where = [_span(names[i : i + size]) for i in range(0, len(jobs), size)]
        with self._lock:
            done = self._run([("decode", c) for c in chunks], where)
        return [r for chunk in done for r in chunk]

    def modules(self) -> list[list[str]]:
        """Every worker's ``sys.modules`` names (to check that the workers stay light)."""
        with self._lock:
            out = []
            for w in self._workers:  # one by one: the probe must reach every worker
                out += self._run([("modules",)], ["(a module probe)"], only=w)
            return out

    def wait_ready(self) -> float:
        """Wait until every worker has started; the seconds from launch until then."""
        with self._lock:
            self._run([], [], until_ready=True)
        return self.startup_s

    def _run(self, tasks: list[tuple], names: list[str], only: _Worker | None = None,
             until_ready: bool = False) -> list:  # fmt: skip
        if self._broken is not None:
            raise DecodePoolError(self._broken)
        try:
            return self._drive(tasks, names, only, until_ready)
        except DecodePoolError as e:
            self._broken = str(e)
            self.close()
            raise

    def _drive(self, tasks, names, only, until_ready):
        """The tasks' answers in order: each ready worker is given the next task as soon as it
        is idle (one at a time), and every wait is bounded."""
        results: list = [None] * len(tasks)
        todo, done = 0, 0
        workers = self._workers if only is None else [only]
        while done < len(tasks) or (until_ready and not all(w.ready for w in workers)):
            for w in workers:
                if w.ready and w.job is None and todo < len(tasks):
                    try:
                        w.tasks.send(tasks[todo])
                    except OSError:  # a broken pipe: the worker is gone
                        raise DecodePoolError(self._lost(w, names[todo])) from None
                    w.job, todo = todo, todo + 1
            waiting = {w.results: w for w in self._workers if not w.ready or w.job is not None}
            answered = wait(list(waiting), timeout=self.timeout_s)
            if not answered:
                busy = [names[w.job] for w in workers if w.job is not None]
                what = f"decoding sample {busy[0]}" if busy else "starting"
                raise DecodePoolError(
                    f"{self.name}: the decode workers gave no answer in {self.timeout_s:g} s "
                    f"while {what} (the bound is --distributed-timeout-minutes); a worker is "
                    "stuck or the host is overloaded"
                )
            for conn in answered:
                w = waiting[conn]
                at = names[w.job] if w.job is not None else None
                try:
                    kind, value = conn.recv()
                except (EOFError, OSError):
                    raise DecodePoolError(self._lost(w, at)) from None
                if kind == "ready":
                    w.ready = True
                    if all(x.ready for x in self._workers) and self.startup_s is None:
                        self.startup_s = time.perf_counter() - self._started
                    continue
                if kind == "error":
                    last = value.strip().splitlines()[-1]
                    raise DecodePoolError(
                        f"{self.name}: a decode worker failed on sample {at}: {last}"
                    )
                results[w.job], w.job, done = value, None, done + 1
        return results

    def _lost(self, w: _Worker, sample: str | None) -> str:
        how = exit_status(w)
        where = f"while decoding sample {sample}" if sample is not None else "before its task"
        return (
            f"{self.name}: decode worker pid {w.process.pid} died ({how}) {where}; "
            "--num-workers 0 decodes in the main process"
        )

    def close(self) -> None:
        """Stop the workers (idempotent); later maps raise."""
        self._broken = self._broken or f"{self.name}: the decode pool is closed"
        self._finalizer()


def _span(names: list[str]) -> str:
    """The samples of a task, as errors name them: one, or the first and last."""
    return names[0] if names[0] == names[-1] else f"{names[0]} (to {names[-1]})"

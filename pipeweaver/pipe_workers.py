# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Worker processes on two pipes: what the schedule search's pool
(:mod:`pipeweaver.search.search_pool`) and the loader's decode pool
(:mod:`megatron.mllm.decode_pool`) share.

A worker is a fresh interpreter (``python -c CODE TASK_FD RESULT_FD``) that imports only what
its serve loop needs, never the parent's main script (``multiprocessing``'s ``spawn`` and
``forkserver`` would import it again in every worker, and the trainer's imports torch) and
never a forked copy of a parent that may hold torch's threads. The parent keeps the write end
of the task pipe and the read end of the result pipe; the child's ends stay open only in the
child, so its death ends the parent's reads and the parent's exit ends its loop. Standard
library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Iterable, Protocol

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The checkout holding ``pipeweaver`` (and ``megatron/mllm``), put on a worker's path."""


class Worker(Protocol):
    """What :func:`stop` and :func:`exit_status` need of a pool's worker record."""

    process: subprocess.Popen
    tasks: Connection
    results: Connection


def worker_env() -> dict[str, str]:
    """The parent's environment with the checkout on ``PYTHONPATH`` and one BLAS thread: the
    workers are the parallelism, threads in each would oversubscribe the cores."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


def launch(
    code: str, env: dict[str, str], niceness: int = 0
) -> tuple[subprocess.Popen, Connection, Connection]:
    """Start ``python -c code`` with two pipes; return the process and the parent's ends (the
    task writer, the result reader). ``code`` calls its serve loop with ``sys.argv[1:]``.
    ``niceness`` > 0 lowers the worker's scheduling priority by that much (its own workers
    inherit it)."""
    task_r, task_w = os.pipe()
    result_r, result_w = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", code, str(task_r), str(result_w)],
            env=env, stdin=subprocess.DEVNULL, pass_fds=(task_r, result_w),
        )  # fmt: skip
    except BaseException:
        for fd in (task_r, task_w, result_r, result_w):
            os.close(fd)
        raise
    os.close(task_r)
    os.close(result_w)
    if niceness > 0 and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, process.pid, niceness)
        except OSError:  # a host that refuses: the worker runs at the parent's priority
            pass
    return process, Connection(task_w, readable=False), Connection(result_r, writable=False)


def worker_ends(argv: list[str]) -> tuple[Connection, Connection]:
    """In the worker: its task reader and result writer from ``argv``. Ctrl-C reaches the whole
    process group; the parent handles it and stops the workers, so a worker ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)


def exit_status(w: Worker, wait_s: float = 1.0) -> str:
    """How a worker whose pipe ended went: ``exit status N``, ``killed by signal N``, or
    ``still running`` (its status follows the pipe's end at once when it exited)."""
    try:
        code = w.process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def stop(workers: Iterable[Worker]) -> None:
    """End the workers: their pipes close (an idle worker exits), then any left is killed (a
    busy or stopped one: a SIGTERM would stay pending on a stopped process), and every process
    is reaped (no orphans or zombies)."""
    workers = list(workers)
    for w in workers:
        for conn in (w.tasks, w.results):
            conn.close()
    deadline = time.monotonic() + 1.0
    for w in workers:
        try:
            w.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.process.kill()
            w.process.wait()

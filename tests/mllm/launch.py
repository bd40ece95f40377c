# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Launch multi-process gloo runs from tests, with a timeout so a deadlock fails fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from megatron.mllm.cli.launch import MAIN_JOB, REPO, free_port, torchrun_command


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    # A rank that dies on a signal (SIGSEGV, SIGABRT) prints every thread's Python stack, so a
    # failure that shows once in many launches leaves more than its exit code.
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def run(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command; on timeout, fail with everything it printed."""
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env or _env(), cwd=REPO
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(
            f"timed out after {timeout}s (deadlock?): {' '.join(cmd)}\n{out[-4000:]}\n{err[-4000:]}"
        ) from e


def torchrun(nproc: int, script: str | Path, args: list[str], timeout: float = 240):
    """``torchrun --nproc-per-node nproc script args`` on a free port."""
    return run(torchrun_command(nproc, [str(script), *args]), timeout)


def ranks(nproc: int, script: str | Path, args: list[str], timeout: float = 240):
    """Start ``nproc`` ranks of ``script`` as torchrun would (same environment), but each on
    its own: no rank is stopped because another failed, so each one's output is complete.

    Returns:
        One ``CompletedProcess`` per rank, in rank order.
    """
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = _env()
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))  # fmt: skip
        cmd = [sys.executable, str(script), *args]
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    out = []
    try:
        for rank, proc in enumerate(procs):
            stdout, stderr = proc.communicate(timeout=timeout)
            out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"rank {rank} timed out after {timeout}s (deadlock?)") from e
    finally:
        for proc in procs:
            proc.kill()
    return out


def main_job(nproc: int, args: list[str], timeout: float = 300):
    """The README's main job (scripts/pretrain_mllm_cpu.sh) with extra arguments."""
    env = _env()
    env.update(PYTHON=sys.executable, NPROC=str(nproc), MASTER_PORT=str(free_port()))
    return run(["bash", str(MAIN_JOB), *args], timeout, env=env)


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Fail with the run's output when it did not exit 0."""
    if proc.returncode != 0:
        raise AssertionError(
            f"exit status {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


TRAIN_WORKER = Path(__file__).with_name("train_worker.py")


def train_runs(out: Path, runs: dict[str, list[str]], nproc: int = 2,
               timeout: float = 600) -> dict[str, list[dict]]:  # fmt: skip
    """Train every named run (its full trainer flags) in turn in one ``train_worker.py``
    launch of ``nproc`` gloo ranks; per run, its ``--metrics-jsonl`` records."""
    argv = [str(out)]
    for name, flags in runs.items():
        argv += [name, *flags, "---"]
    check(torchrun(nproc, TRAIN_WORKER, argv, timeout=timeout))
    return {
        name: [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
        for name in runs
    }

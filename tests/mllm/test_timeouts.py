# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A rank that stops answering ends every other rank within --distributed-timeout-minutes.

A rank stopped with SIGSTOP keeps its sockets open, so its peers see no error, only silence:
only the timeout can end their waits. The four runs stall at the same point (rank 1's second
LLM chunk forward, in the middle of the first step) and run side by side, since they mostly
wait; the survivor must stop with exit status 2 and one ``error:`` line naming itself, what it
waited on and the peer or group, within the timeout plus 30 s of the stall. Failures that
reach the trainer's top level from megatron-core's own collectives get one line too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from equivalence import TINY
from launch import REPO, free_port

from megatron.mllm.distributed import communication_failure
from pipeweaver.ir import Comm, parse

WORKER = Path(__file__).with_name("stall_worker.py")
TIMEOUT_MINUTES = 0.25
"""15 s: longer than any start-up skew between two ranks on a busy host (a wait that expires
before the stall would fail the run for the wrong reason), short enough to keep the test cheap."""

SLACK_S = 30
"""What the issue allows past the timeout, from the stall to the survivor's exit."""

PP2 = ["--pipeline-model-parallel-size", "2"]
RUNS = {
    "pp2-dynamic": [*PP2, "--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "0"],
    "pp2-1f1b": [*PP2, "--pipeline-schedule", "1f1b"],
    "dp2-balanced": ["--post-balance", "auto"],
    "pp2-megatron": PP2,
}
"""Stalled rank 1; rank 0 survives."""

RUNTIME_LINE = re.compile(
    r"error: rank 0 \(pipeline stage 0\) gave up waiting on '(?P<action>[^']+)' with stage 1 "
    r"\(rank 1\) after (?P<seconds>[\d.]+) s \(timeout 15 s\): .*Timed out.*"
)
DISPATCHER_LINE = re.compile(
    r"error: rank 0 gave up in the (?P<collective>(metadata|balance plan digest) all-gather.*|"
    r"all-to-all '(inputs and tokens|encoder outputs( backward)?)') of group \[0, 1\] "
    r"after (?P<seconds>[\d.]+) s: .*Timed out.*"
)
MEGATRON_LINE = re.compile(
    r"error: rank 0: torch\.distributed gave up in "
    r"megatron/core/pipeline_parallel/\w+\.py:\d+ \w+: .*Timed out.*"
)


def _launch(name: str, flags: list[str], out: Path) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")  # fmt: skip
        cmd = [sys.executable, str(WORKER), "1", "2", str(out / f"{name}.stall"), *TINY, *flags,
               "--distributed-timeout-minutes", str(TIMEOUT_MINUTES)]  # fmt: skip
        with (
            open(out / f"{name}.{rank}.out", "w") as stdout,
            open(out / f"{name}.{rank}.err", "w") as stderr,
        ):
            procs.append(subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, cwd=REPO))
    return procs


def _stall_time(out: Path, name: str) -> float | None:
    """When the run's rank 1 stopped (its worker's stamp), None before it has."""
    stamp = out / f"{name}.stall"
    text = stamp.read_text() if stamp.exists() else ""
    return float(text) if text.endswith("\n") else None  # the worker ends the stamp with \n


def _survivor_exits(runs: dict[str, list[subprocess.Popen]], out: Path) -> dict[str, float]:
    """Seconds from each run's stall to its survivor's exit; inf: still running well past the
    bound; nan: the run never stalled (a rank ended first, or start-up took over 400 s)."""
    allowance = TIMEOUT_MINUTES * 60 + SLACK_S + 15  # past the bound, to report by how much
    exits: dict[str, float] = {}
    deadline = time.time() + 400
    while len(exits) < len(runs) and time.time() < deadline:
        time.sleep(0.2)
        for name, (survivor, stalled) in runs.items():
            if name in exits:
                continue
            stall = _stall_time(out, name)
            if stall is None:
                if survivor.poll() is not None or stalled.poll() is not None:
                    exits[name] = float("nan")
            elif survivor.poll() is not None:
                exits[name] = time.time() - stall
            elif time.time() - stall > allowance:
                exits[name] = float("inf")
    return {name: exits.get(name, float("nan")) for name in runs}


@pytest.mark.multiproc
def test_a_stalled_rank_ends_the_others_within_the_timeout_with_one_error_line(tmp_path):
    runs: dict[str, list[subprocess.Popen]] = {}
    try:
        for name, flags in RUNS.items():
            runs[name] = _launch(name, flags, tmp_path)
        exits = _survivor_exits(runs, tmp_path)
        stopped = {name: stalled.poll() is None for name, (_, stalled) in runs.items()}
    finally:
        for procs in runs.values():
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)  # a stopped process takes only SIGKILL
                p.wait()
    for name, (survivor, _) in runs.items():
        err = (tmp_path / f"{name}.0.err").read_text()
        report = f"{name}: survivor exit {survivor.returncode}\n{err[-3000:]}"
        assert stopped[name], f"{name}: rank 1 was meant to be stopped, not gone\n{report}"
        assert exits[name] <= TIMEOUT_MINUTES * 60 + SLACK_S, (
            f"{name}: the survivor ended {exits[name]:.1f} s after the stall (inf: it did not, "
            f"nan: rank 1 never stalled)\n{report}"
        )
        assert survivor.returncode == 2, report
        lines = [line for line in err.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in err, report
        line = errors[0]
        if name.startswith("dp2"):
            match = DISPATCHER_LINE.fullmatch(line)
        elif name == "pp2-megatron":
            match = MEGATRON_LINE.fullmatch(line)
        else:
            match = RUNTIME_LINE.fullmatch(line)
            # The action is the schedule IR's own: a transfer with the stalled stage.
            assert match and isinstance(parse(match["action"]), Comm), line
            assert parse(match["action"]).peer == 1, line
        assert match, line
        if "seconds" in match.groupdict():  # the wait lasted the whole timeout, no less
            assert float(match["seconds"]) >= TIMEOUT_MINUTES * 60 - 0.5, line


def _raise(error: BaseException):
    raise error


def _failure(error: BaseException) -> str | None:
    try:
        _raise(error)
    except BaseException as e:
        return communication_failure(e)


def test_backend_failures_get_one_line_naming_the_rank_and_the_caller_other_errors_none(
    monkeypatch,
):
    monkeypatch.setenv("RANK", "3")  # no process group here: the rank comes from the launcher
    gloo = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed "
        "out waiting 9000ms for recv operation to complete"
    )
    line = _failure(gloo)
    assert line.startswith("rank 3: torch.distributed gave up in tests/mllm/test_timeouts.py:")
    assert " _raise: [/__w/pytorch" in line and "Timed out waiting 9000ms" in line
    assert _failure(RuntimeError("Application timeout caused pair closure")).endswith(
        "_raise: Application timeout caused pair closure"
    )
    nccl = dist.DistBackendError("Watchdog caught collective operation timeout\nmore detail")
    assert _failure(nccl).endswith("_raise: Watchdog caught collective operation timeout")
    assert _failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert _failure(ValueError("/gloo/transport/ in a message, but not gloo's error")) is None

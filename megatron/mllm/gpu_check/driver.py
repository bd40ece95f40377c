# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The GPU check's driver: every stage in one process, each in its time box.

``tools/gpu/check.sh`` installs the wheels, then runs
``python -m megatron.mllm.gpu_check --out DIR [--dry-run] --budget S``. One process, because
importing megatron-core costs 10-15 s of a 2-core CPU (the dry run in CI) and several seconds of
the GPU machine's budget. Stages (:data:`~megatron.mllm.gpu_check.report.STAGES`):

``environment``
    torch, CUDA, the device, megatron-core, whether Transformer Engine and flex attention are
    there (TE is never tested: its wheels are far over what can travel).
``tests``
    ``pytest -m cuda tests/gpu`` in this process (:class:`TestCollector` gathers outcomes,
    skip reasons and the figures the tests record). Without CUDA those tests skip, unless the
    dry run asks them to run on the CPU (``ORCHWEAVE_GPU_CHECK_DRY_RUN=1``).
``calibration``
    :mod:`~megatron.mllm.gpu_check.calibration_stage`.
``mfu``
    :mod:`~megatron.mllm.gpu_check.throughput`, with the calibration stage's file if it wrote
    one.

Each stage gets at most its :data:`BUDGETS` seconds and never more than what is left of the
whole budget; a stage past its box is stopped (``SIGALRM``: Python code between two kernels
sees it at once) and reported ``timed out``, and the next one starts. The JSON is rewritten
after every stage. Exit status 0 when every stage passed, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from megatron.mllm import cpu_shim

cpu_shim.apply()

import pytest  # noqa: E402
import torch  # noqa: E402

from megatron.mllm.gpu_check import report  # noqa: E402
from megatron.mllm.gpu_check.device_audit import REPO  # noqa: E402

BUDGETS = {"environment": 20.0, "tests": 150.0, "calibration": 150.0, "mfu": 100.0}
"""Seconds per stage at most (whole check: 8 minutes, of which check.sh's install and the
imports take the rest)."""

DRY_RUN_ENV = "ORCHWEAVE_GPU_CHECK_DRY_RUN"
"""Set to 1 by the dry run: the ``cuda`` tests run on the CPU (``tests/conftest.py``)."""

TE_UNTESTED = (
    "Transformer Engine: untested (its wheels are far over the 64 MiB that can travel to the "
    "GPU machine; the check runs the local layer specs on CUDA)"
)


class StageTimeout(BaseException):
    """A stage ran past its time box (BaseException: the stage's own ``except Exception``
    blocks must not swallow it)."""


class TestTimeout(Exception):
    """A test ran past what was left of the tests stage's time box."""


@contextlib.contextmanager
def time_box(seconds: float, error: type[BaseException]):
    """Raise ``error`` in this thread after ``seconds``."""

    def alarm(signum, frame):
        raise error(f"ran past its time box of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class TestCollector:
    """A pytest plugin: each test's outcome and reason, the figures it recorded
    (``record_property("gpu_check", (section, key, value))``), and the stage's deadline (a
    test that would start past it is skipped, a running one is stopped at it)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.cases: list[dict] = []
        self.sections: dict[str, dict] = {"training": {}, "attention": {}}

    def pytest_runtest_setup(self, item):
        if time.monotonic() > self.deadline:
            pytest.skip("the tests stage's time box ran out before this test")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        # Around the test's call: the alarm's exception fails this test, and no later one.
        with time_box(self.deadline - time.monotonic(), TestTimeout):
            return (yield)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            reason = None
            if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
                reason = report.longrepr[2].removeprefix("Skipped: ")
            elif report.outcome == "failed":
                lines = [x for x in report.longreprtext.strip().splitlines() if x.strip()]
                reason = next((x for x in reversed(lines) if x.startswith("E ")), lines[-1])
            self.cases.append({"name": report.nodeid.split("::", 1)[-1],
                               "outcome": report.outcome, "seconds": report.duration,
                               "reason": reason})  # fmt: skip
            for name, value in report.user_properties:
                if name == "gpu_check":
                    section, key, record = value
                    self.sections.setdefault(section, {})[key] = record


def environment() -> dict:
    """What the check runs on."""
    cuda = torch.cuda.is_available()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else "none (CPU)",
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.machine()})",
        "device_count": torch.cuda.device_count() if cuda else 0,
        "device_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
        "nccl": _nccl_version() if cuda else "none (CPU)",
        "cpu_count": os.cpu_count(),
        "flex_attention": importlib.util.find_spec("torch.nn.attention.flex_attention") is not None,
    }
    try:
        info["megatron_core"] = importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        info["megatron_core"] = None
    te = importlib.util.find_spec("transformer_engine") is not None
    info["transformer_engine"] = "installed, untested" if te else "untested (not installed)"
    try:
        info["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()  # a tuple in torch 2.x, an int before
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def run_tests(dry_run: bool, deadline: float, obj: dict) -> str:
    """``pytest -m cuda tests/gpu`` in this process; fills ``obj``; returns the stage status."""
    collector = TestCollector(deadline)
    os.environ[DRY_RUN_ENV] = "1" if dry_run else "0"
    args = [str(REPO / "tests" / "gpu"), "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
            "-p", "no:hypothesispytest",
            "-p", "no:timeout", "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml")]  # fmt: skip
    code = pytest.main(args, plugins=[collector])
    cases = collector.cases
    obj["tests"] = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed",
                                                                      "skipped")}  # fmt: skip
    obj["tests"].update(cases=cases, pytest_exit_status=int(code))
    obj["training"].update(collector.sections.get("training", {}))
    obj["attention"].update(collector.sections.get("attention", {}))
    obj["skipped"] += [f"test {c['name']}: {c['reason']}" for c in cases
                       if c["outcome"] == "skipped"]  # fmt: skip
    if obj["tests"]["failed"] or code not in (0, 5):
        return "failed"
    return "passed" if obj["tests"]["passed"] else "skipped"


def run_calibration(out_dir: Path, dry_run: bool, obj: dict) -> str:
    from megatron.mllm.gpu_check.calibration_stage import run_calibration as calibrate_here

    obj["calibration"].update(calibrate_here(out_dir, dry_run, _log))
    return "passed"


def run_mfu(out_dir: Path, dry_run: bool, obj: dict) -> str:
    from megatron.mllm.gpu_check.calibration_stage import DRY_RUN_MODEL, GPU_MODEL
    from megatron.mllm.gpu_check.throughput import run_throughput

    name = obj["calibration"].get("file")
    path = str(out_dir / name) if name and (out_dir / name).is_file() else None
    if path is None:
        obj["skipped"].append("SEMU's calibrated prediction: the calibration stage wrote no file")
    run_throughput(DRY_RUN_MODEL if dry_run else GPU_MODEL, path, dry_run, _log, obj["mfu"])
    return "passed"


def _log(line: str) -> None:
    print(line, flush=True)


def _run_stage(name: str, fn, obj: dict, deadline: float, out_dir: Path) -> None:
    """Run one stage in its time box; record status, seconds and reason."""
    st = obj["stages"][name]
    box = min(BUDGETS[name], deadline - time.monotonic())
    st["budget_s"] = round(box, 1)
    if box <= 1:
        st.update(status="skipped", reason="no time left in the check's budget")
        obj["skipped"].append(f"stage {name}: no time left in the check's budget")
        return
    _log(f"> stage {name} (at most {box:.0f} s)")
    st["status"] = "running"
    report.write_outputs(out_dir, obj)
    start = time.monotonic()
    try:
        if name == "tests":  # its tests get the box one by one (TestCollector)
            st["status"] = fn(start + box)
        else:
            with time_box(box, StageTimeout):
                st["status"] = fn()
    except StageTimeout as e:
        st.update(status="timed out", reason=str(e))
    except Exception as e:  # a stage's failure is a finding: record it, go on
        st.update(status="failed", reason=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                  if str(e) else type(e).__name__)  # fmt: skip
        traceback.print_exc()
    st["seconds"] = round(time.monotonic() - start, 1)
    _log(f"> stage {name}: {st['status']} in {st['seconds']} s {st.get('reason') or ''}")
    report.write_outputs(out_dir, obj)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m megatron.mllm.gpu_check",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--dry-run", action="store_true", help="every stage on CPU, tiny")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for all stages")
    parser.add_argument("--install", default=None, help="check.sh's install record (JSON)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parse_args(argv)
    out_dir = Path(args.out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        sys.stderr.write(f"error: --out {args.out}: cannot create it: {e.strerror}\n")
        return 2
    if not args.budget > 0:
        sys.stderr.write(f"error: --budget must be positive seconds, got {args.budget}\n")
        return 2
    from megatron.mllm import logs

    logs.configure(logging.WARNING)
    os.environ.setdefault("ORCHWEAVE_PROGRESS", "0")
    mode = "dry-run" if args.dry_run else "gpu"
    if not args.dry_run and not torch.cuda.is_available():
        sys.stderr.write("error: no CUDA device: run tools/gpu/check.sh --dry-run on a CPU\n")
        return 2
    started = time.monotonic()
    deadline = started + args.budget
    obj = report.skeleton(mode, args.budget)
    if args.install:
        with contextlib.suppress(OSError, ValueError):
            obj["install"] = json.loads(Path(args.install).read_text(encoding="utf-8"))
    from megatron.mllm.gpu_check.modes import NO_SINGLE_PROCESS_FORM

    obj["skipped"] += [TE_UNTESTED, *(f"{k}: {v}" for k, v in NO_SINGLE_PROCESS_FORM.items())]

    def env_stage():
        obj["environment"].update(environment())
        return "passed"

    stages = {
        "environment": env_stage,
        "tests": lambda stage_deadline: run_tests(args.dry_run, stage_deadline, obj),
        "calibration": lambda: run_calibration(out_dir, args.dry_run, obj),
        "mfu": lambda: run_mfu(out_dir, args.dry_run, obj),
    }
    for name in report.STAGES:
        _run_stage(name, stages[name], obj, deadline, out_dir)
    ok = all(st["status"] == "passed" for st in obj["stages"].values())
    obj.update(finished=report.now(), wall_s=round(time.monotonic() - started, 1),
               exit_status=0 if ok else 1)  # fmt: skip
    report.write_outputs(out_dir, obj)
    for line in report.summary_lines(obj):
        _log(line)
    return obj["exit_status"]

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The GPU check without a GPU: its dry run, the ``cuda`` tests' skips, the wheel-size check,
the device audit and the files written after a killed driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.mllm.gpu_check import report

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "tools" / "gpu" / "check.sh"
FETCH = REPO / "tools" / "gpu" / "fetch_wheels.sh"
WHEEL = "megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl"


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ORCHWEAVE_GPU_CHECK_DRY_RUN"}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHON=sys.executable, **extra)
    return env


def test_dry_run_runs_every_stage_and_writes_every_field(tmp_path):
    # No .whl/ here (CI's clone): the install is skipped, megatron-core is the venv's.
    env = _env(ORCHWEAVE_GPU_SITE=str(tmp_path / "site"))
    proc = subprocess.run(["bash", str(CHECK), "--dry-run", str(tmp_path / "out")], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=240)  # fmt: skip
    out = tmp_path / "out"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    obj = json.loads((out / "gpu-check.json").read_text())
    assert report.missing_fields(obj, filled=True) == []
    assert obj["mode"] == "dry-run" and obj["exit_status"] == 0
    assert {s: st["status"] for s, st in obj["stages"].items()} == dict.fromkeys(
        report.STAGES, "passed"
    )
    assert obj["install"]["status"] in ("skipped", "installed")
    # The cuda tests ran on the CPU: fp32 training modes and every attention case passed; bf16
    # training skipped with its reason.
    tests = obj["tests"]
    assert tests["failed"] == 0 and tests["passed"] == 7 and tests["skipped"] == 3, tests
    skipped = [c for c in tests["cases"] if c["outcome"] == "skipped"]
    assert all("bf16" in c["name"] and "CUDA" in c["reason"] for c in skipped)
    assert set(obj["training"]) == {
        "pp1-dp1/fp32", "pp1-dp1-post-balance/fp32", "pp1-dp1-post-balance-overlap/fp32"}  # fmt: skip
    for rec in obj["training"].values():
        assert rec["within_tolerance"] and rec["audit"]["clean"] and rec["device"] == "cpu"
    assert {k for k in obj["attention"] if k != "timing_ms"} == {
        "fp32/causal", "fp32/bidir", "bf16/causal", "bf16/bidir"}  # fmt: skip
    assert obj["attention"]["fp32/causal"]["kernels"] == {
        "forward": "flex",
        "backward": "sdpa-mask",
    }
    # The calibration is the file SEMU reads, for the tiny stand-in of the GPU model.
    from orchestration.calibration import Calibration

    cal = Calibration.load(out / obj["calibration"]["file"])
    assert set(cal.modules) == {"vision", "llm"} and cal.hardware["peak_flops"] > 0
    for name, r in obj["mfu"]["workloads"].items():
        assert r["step_s"] > 0 and 0 < r["mfu"] < 1, name
        assert r["semu_calibrated_step_s"] > 0 and r["semu_default_step_s"] > 0, name
        assert r["semu_calibrated_error_pct"] == pytest.approx(
            (r["semu_calibrated_step_s"] - r["step_s"]) / r["step_s"] * 100
        )
    assert set(obj["mfu"]["workloads"]) == {"llava15-665k", "obelics-interleaved"}
    summary = (out / "summary.txt").read_text()
    assert all(f"  {s} " in summary for s in report.STAGES)
    assert "Transformer Engine" in summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is CUDA here: they run")
def test_cuda_tests_are_skipped_with_their_reason_without_cuda():
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/gpu",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:hypothesispytest",
    ]
    proc = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "10 skipped" in proc.stdout and "passed" not in proc.stdout, proc.stdout[-3000:]
    assert "needs a CUDA device (torch.cuda.is_available() is False)" in proc.stdout


def _fetch(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(FETCH), *args], capture_output=True, text=True, timeout=30)


def test_wheel_check_lists_the_wheels_and_fails_over_48_mib(tmp_path):
    wheel = tmp_path / WHEEL
    with open(wheel, "wb") as f:
        f.truncate(2 * 2**20)
    ok = _fetch("--check", str(tmp_path))
    assert ok.returncode == 0, ok.stderr
    assert WHEEL in ok.stdout and "2.00 MiB" in ok.stdout
    assert "total: 1 wheel(s), 2.00 MiB (limit 48 MiB)" in ok.stdout
    with open(wheel, "wb") as f:  # sparse: 49 MiB on paper, nothing on disk
        f.truncate(49 * 2**20)
    over = _fetch("--check", str(tmp_path))
    assert over.returncode == 1
    assert over.stderr.strip().splitlines() == [
        f"error: {tmp_path}: the wheels total 49.00 MiB, over the 48 MiB limit"
    ]
    wheel.write_bytes(b"x")
    (tmp_path / "numpy-2.5.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    stray = _fetch("--check", str(tmp_path))
    assert stray.returncode == 1 and "is not on this script's list" in stray.stderr
    assert _fetch("--check", str(tmp_path / "missing")).returncode == 2


def test_check_sh_bad_arguments_are_one_error_line(tmp_path):
    for args, needle in (([], "OUT_DIR missing"), (["--fast", "x"], "unknown option '--fast'"),
                         (["a", "b"], "one OUT_DIR")):  # fmt: skip
        proc = subprocess.run(["bash", str(CHECK), *args], capture_output=True, text=True,
                              timeout=30, cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 2 and proc.stdout == ""
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("error: ") and needle in line


def test_a_killed_driver_still_leaves_both_files(tmp_path):
    obj = report.skeleton("gpu", 480)
    obj["stages"]["environment"].update(status="passed", seconds=0.1)
    obj["stages"]["tests"]["status"] = "running"
    report.write_outputs(tmp_path, obj)
    report.finalize(str(tmp_path), "stopped at the time limit", "gpu", 480, 1)
    got = json.loads((tmp_path / "gpu-check.json").read_text())
    status = {s: st["status"] for s, st in got["stages"].items()}
    assert status == {"environment": "passed", "tests": "killed", "calibration": "not run",
                      "mfu": "not run"}  # fmt: skip
    assert got["exit_status"] == 1 and report.missing_fields(got) == []
    assert "stage tests: stopped at the time limit" in got["skipped"]
    assert "killed" in (tmp_path / "summary.txt").read_text()
    # With nothing written at all, a skeleton takes its place.
    empty = tmp_path / "empty"
    empty.mkdir()
    report.finalize(str(empty), "exit status 2", "gpu", 480, 2)
    assert report.missing_fields(json.loads((empty / "gpu-check.json").read_text())) == []


def test_device_audit_names_our_host_work():
    from megatron.mllm.document_attention import masked_packed_attention
    from megatron.mllm.gpu_check.device_audit import HOST_METADATA_ELEMENTS, DeviceAudit

    # Against a device nothing runs on, every CPU result is off it: ours are told apart.
    audit = DeviceAudit(torch.device("meta"))
    t = 80  # the dense mask has t * t > HOST_METADATA_ELEMENTS elements
    assert t * t > HOST_METADATA_ELEMENTS
    q = torch.randn(t, 2, 4)
    layer = torch.nn.Linear(4, 4)
    with audit:
        masked_packed_attention(q, q, q, torch.tensor([0, 30, t]), causal=True)
        layer(torch.randn(3, 4))
    audit.check_state(layer)
    rec = audit.report.record()
    assert not rec["clean"]
    sites = " ".join(rec["ours_off_device"])
    assert "megatron/mllm/document_attention.py" in sites and "masked_packed_attention" in sites
    assert rec["ours_metadata_ops"] > 0  # the document ids: a few elements per sequence
    assert rec["module_outputs_off_device"] == {"Linear": 1}
    assert rec["state_off_device"] == ["weight", "bias"]
    # On its own device the same work leaves nothing behind.
    same = DeviceAudit(torch.device("cpu"))
    with same:
        masked_packed_attention(q, q, q, torch.tensor([0, 30, t]), causal=True)
    same.check_state(layer)
    assert same.report.clean and not same.report.outside


def test_a_stage_past_its_time_box_is_stopped_and_the_next_one_runs(tmp_path):
    import time

    from megatron.mllm.gpu_check import driver

    obj = report.skeleton("dry-run", 60)
    deadline = time.monotonic() + 60
    budgets = dict(driver.BUDGETS)
    try:
        driver.BUDGETS.update(calibration=1.2, mfu=5.0)
        start = time.monotonic()
        driver._run_stage("calibration", lambda: time.sleep(30), obj, deadline, tmp_path)
        assert time.monotonic() - start < 5
        driver._run_stage("mfu", lambda: "passed", obj, deadline, tmp_path)
    finally:
        driver.BUDGETS.update(budgets)
    cal, mfu = obj["stages"]["calibration"], obj["stages"]["mfu"]
    assert cal["status"] == "timed out" and "time box of 1 s" in cal["reason"]
    assert mfu["status"] == "passed"
    assert json.loads((tmp_path / "gpu-check.json").read_text())["stages"]["mfu"] == mfu

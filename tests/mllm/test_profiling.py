# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""--profile-trace and --profile-png: a real step's timeline beside its prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from golden_losses import MAIN_JOB
from launch import check, torchrun

from pipeweaver.ir import Compute, parse

pytestmark = pytest.mark.multiproc

TRAIN_WORKER = Path(__file__).with_name("train_worker.py")
PROFILE = [
    "--profile",
    "--profile-step-start",
    "1",
    "--profile-step-end",
    "3",
    "--train-iters",
    "3",
]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiled")
    runs = {
        # torch.profiler on rank 1 only: its events join that rank's track.
        "pp2-dynamic": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic",
                        "--schedule-search-rollouts", "4", "--schedule-search-budget-ms", "60000",
                        "--use-pytorch-profiler", "--profile-ranks", "1",
                        "--profile-png", str(out / "pp2.png")],
        "dp2-balanced": ["--post-balance", "auto"],
    }  # fmt: skip
    argv = [str(out)]
    for name, flags in runs.items():
        argv += [name, *MAIN_JOB, *PROFILE, *flags, "--profile-trace", str(out / f"{name}.json"),
                 "---"]  # fmt: skip
    proc = check(torchrun(2, TRAIN_WORKER, argv, timeout=600))
    traces = {name: json.loads((out / f"{name}.json").read_text()) for name in runs}
    return proc, traces, out


def _complete(trace, pid):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]


def test_the_trace_is_chrome_json_with_every_rank_and_a_prediction_group(profiled):
    _, traces, _ = profiled
    for name, trace in traces.items():
        events = trace["traceEvents"]
        assert trace["otherData"]["iterations"] == [2, 3], name
        for e in events:
            assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and "tid" in e
            if e["ph"] == "X":
                assert e["dur"] >= 0 and isinstance(e["ts"], float), e
        names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
        assert names[0] == "rank 0: measured" and names[1] == "rank 1: measured", name
        predicted = {p for p, n in names.items() if "predicted" in n}
        assert len(predicted) == 2, names
        for pid in (0, 1, *predicted):
            assert _complete(trace, pid), (name, pid)
        # Every rank times the whole step: the optimizer is on every track.
        for pid in (0, 1):
            assert any(e["cat"] == "optimizer" for e in _complete(trace, pid))


def test_every_compute_action_appears_once_per_rank_in_schedule_order(profiled):
    _, traces, _ = profiled
    trace = traces["pp2-dynamic"]
    actions = trace["otherData"]["actions"]
    for it in trace["otherData"]["iterations"]:
        for rank in (0, 1):
            order = [a for a in actions[str(it)][str(rank)] if isinstance(parse(a), Compute)]
            assert len(order) == len(set(order)) and order
            window = next(e for e in _complete(trace, rank) if e["name"] == f"iteration {it}")
            inside = [e for e in _complete(trace, rank)
                      if e["cat"] in ("forward-compute", "backward-compute")
                      and window["ts"] <= e["ts"] <= window["ts"] + window["dur"]]  # fmt: skip
            measured = [e["args"]["action"] for e in sorted(inside, key=lambda e: e["ts"])]
            assert measured == order, (it, rank)
            # SEMU replays the same schedule: its compute events of this rank, in order.
            pid = next(e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"
                       and e["args"]["name"] == f"rank {rank}: predicted (semu)")  # fmt: skip
            starts = sorted(e["ts"] for e in _complete(trace, pid) if e["name"] == order[0])
            first = starts[trace["otherData"]["iterations"].index(it)]
            predicted = [
                e["name"]
                for e in sorted(_complete(trace, pid), key=lambda e: e["ts"])
                if e["ts"] >= first and e["cat"] in ("predicted,F", "predicted,B")
            ]
            assert predicted[: len(order)] == order, (it, rank)


def test_torch_profiler_events_join_the_profiled_rank_only(profiled):
    _, traces, _ = profiled
    trace = traces["pp2-dynamic"]
    torch_events = {pid: [e for e in _complete(trace, pid) if e["tid"] != 0] for pid in (0, 1)}
    assert not torch_events[0]
    ops = [e for e in torch_events[1] if e.get("cat") == "cpu_op"]
    assert any(e["name"].startswith("aten::") for e in ops)
    # Put on the timers' clock: inside the profiled iterations of that rank.
    windows = [e for e in _complete(trace, 1) if e["cat"] == "iteration"]
    for e in ops:
        assert any(w["ts"] - 1e3 <= e["ts"] <= w["ts"] + w["dur"] + 1e4 for w in windows), e


def test_the_balanced_step_is_predicted_by_its_plan(profiled):
    _, traces, _ = profiled
    trace = traces["dp2-balanced"]
    planned = [e for e in trace["traceEvents"] if e.get("cat") == "predicted,F+B"]
    assert {e["name"] for e in planned} == {"vision (planned)", "audio (planned)", "llm (planned)"}
    measured = {e["cat"] for e in _complete(trace, 0)}
    assert {"encoder-forward", "encoder-backward", "all-to-all", "forward-compute"} <= measured


def test_the_png_is_written_and_the_log_compares_step_and_busy_times(profiled):
    proc, _, out = profiled
    assert (out / "pp2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("> profile:")]
    assert any("measured step" in line and "predicted" in line for line in lines)
    assert sum("rank 1: busy measured" in line for line in lines) == 4  # 2 runs x 2 iterations

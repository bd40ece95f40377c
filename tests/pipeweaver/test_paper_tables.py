# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""tools/bench/paper_tables.py: the row table is well formed, the error arithmetic is right,
and one cheap row is simulated in process (the paper rows take minutes: not here). The row
itself simulates in under a second; the first SEMU call of a process also pays its one-time
start-up (10-30 s on the loaded 2-core host), which the suite's other in-process SEMU tests
share."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pt():
    # As when run as a script: its siblings (dip_ablation, omni84b_full_mode) import by name.
    bench = str(REPO / "tools" / "bench")
    if bench not in sys.path:
        sys.path.append(bench)
    spec = importlib.util.spec_from_file_location(
        "paper_tables", REPO / "tools" / "bench" / "paper_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["paper_tables"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_error_arithmetic(pt):
    assert pt.error_pct(40.0, 44.0) == pytest.approx(10.0)
    assert pt.error_pct(0.416, 0.208) == pytest.approx(-50.0)
    assert pt.error_pct(None, 1.0) is None and pt.error_pct(1.0, None) is None
    rows = [
        pt.Row("a", "s", "s", 10.0, 12.0, baseline=True),
        pt.Row("b", "s", "s", 10.0, 7.0, baseline=True),
        pt.Row("c", "s", "x", 1.0, 9.0),  # not a baseline row: not counted
        pt.Row("d", "s", "s", 10.0, note="no config yet", baseline=True),  # unmatched
    ]
    assert pt.worst_baseline_error(rows) == pytest.approx(30.0)
    assert pt.worst_baseline_error(rows[2:]) is None


def test_unmatched_rows_are_printed_with_a_reason(pt, capsys):
    rows = pt.rows_no_config(argparse.Namespace(iteration=0))
    assert len(rows) >= 6 and all(r.semu is None and r.note for r in rows)
    lines = pt.format_rows(rows)
    assert len(lines) == 1 + 3 * len(rows)  # header; per row: figures, config, note
    assert sum("no config yet" in line for line in lines) >= 5
    assert pt.main(["--rows", "no-config"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "paper_tables_worst_baseline_error_pct: n/a"
    assert sum(line.startswith("paper_tables_") for line in out) == 1


def test_groups_and_paper_figures(pt):
    assert set(pt.DEFAULT_GROUPS) <= set(pt.GROUPS)
    assert pt.PAPER_T4 == {"fsdp": 40.270, "megatron": 39.053, "dip": 28.606}
    assert pt.ORCH_MFU / pt.ORCH_SPEEDUP == pytest.approx(0.134, abs=5e-4)


def test_one_cheap_row_simulated(pt):
    got, used = pt.megatron_fit(["--model", "cpu-main", "--cluster", "cpu-2ranks"])
    assert got["step_time_s"] > 0 and used[-2:] != ["--memory", "recompute"]  # a CPU: no limit
    row = pt.Row("cpu-main", "test", "s", 2 * got["step_time_s"], got["step_time_s"],
                 baseline=True)  # fmt: skip
    assert row.error_pct == pytest.approx(-50.0)
    assert pt.worst_baseline_error([row]) == pytest.approx(50.0)
    line = pt.format_rows([row])[1]
    assert "-50.0%" in line and line.rstrip().endswith("yes")

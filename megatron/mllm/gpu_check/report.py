# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The GPU check's outputs: ``gpu-check.json`` (every figure) and ``summary.txt``.

Pure Python (no torch, no megatron-core), so that ``tools/gpu/check.sh`` can still write both
files when the driver died or was killed at its time limit::

    python -m megatron.mllm.gpu_check.report OUT_DIR --killed "the driver ran past 450 s"

The JSON is rewritten after every stage, so a driver killed midway leaves the stages it
finished. :data:`FIELDS` lists what every file holds (dotted paths; a stage that did not run
still has its section, with its status and reason).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

SCHEMA = "orchweave-gpu-check/1"
"""The JSON's format version."""

STAGES = ("environment", "tests", "calibration", "mfu")
"""The driver's stages, in the order they run (``install`` runs before, in check.sh)."""

FIELDS = (
    "schema", "mode", "started", "finished", "wall_s", "budget_s", "exit_status",
    "environment.python", "environment.torch", "environment.cuda", "environment.device",
    "environment.megatron_core", "environment.transformer_engine", "environment.flex_attention",
    "install.status", "install.wheels",
    "stages.environment.status", "stages.tests.status", "stages.calibration.status",
    "stages.mfu.status",
    "tests.passed", "tests.failed", "tests.skipped", "tests.cases",
    "training", "attention",
    "calibration.file", "calibration.hardware", "calibration.efficiency_measured",
    "calibration.efficiency_semu_default", "calibration.rates",
    "mfu.workloads", "skipped",
)  # fmt: skip
"""Dotted paths present in every ``gpu-check.json``."""


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def skeleton(mode: str, budget_s: float) -> dict:
    """An empty result: every section, every stage ``not run``, every field of :data:`FIELDS`
    (None where nothing has filled it yet)."""
    obj = {
        "schema": SCHEMA, "mode": mode, "started": now(), "finished": None, "wall_s": None,
        "budget_s": budget_s, "exit_status": None,
        "environment": {},
        "install": {"status": "not run", "wheels": []},
        "stages": {s: {"status": "not run", "seconds": None, "budget_s": None, "reason": None}
                   for s in STAGES},
        "tests": {"passed": 0, "failed": 0, "skipped": 0, "cases": []},
        "training": {}, "attention": {}, "calibration": {}, "mfu": {"workloads": {}},
        "skipped": [],
    }  # fmt: skip
    for path in FIELDS:
        *parents, leaf = path.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        node.setdefault(leaf, None)
    return obj


def missing_fields(obj: dict, filled: bool = False) -> list[str]:
    """The paths of :data:`FIELDS` that ``obj`` lacks (``filled``: or holds as None)."""
    out = []
    for path in FIELDS:
        node = obj
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                node = None
                break
            node = node[key]
        if node is None and (filled or not _has(obj, path)):
            out.append(path)
    return out


def _has(obj: dict, path: str) -> bool:
    for key in path.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return False
        obj = obj[key]
    return True


def write_json(path: str | os.PathLike, obj: dict) -> None:
    """Write ``obj`` atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def _ms(x) -> str:
    return "n/a" if x is None else f"{x * 1e3:.1f} ms"


def _pct(x, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.1f}%" if signed else f"{x:.1%}"


def _mib(x) -> str:
    return "n/a" if x is None else f"{x / 2**20:.0f} MiB"


def summary_lines(obj: dict) -> list[str]:
    """The short text summary of a result."""
    env = obj.get("environment", {})
    lines = [
        f"OrchWeave GPU check ({obj['mode']}), {obj['started']} to {obj.get('finished')}, "
        f"{obj.get('wall_s') or 0:.0f} s of a {obj.get('budget_s') or 0:.0f} s budget, exit "
        f"status {obj.get('exit_status')}",
        f"device {env.get('device')}, torch {env.get('torch')} (CUDA {env.get('cuda')}), "
        f"megatron-core {env.get('megatron_core')}, Transformer Engine "
        f"{env.get('transformer_engine')}",
    ]
    inst = obj.get("install", {})
    wheels = ", ".join(inst.get("wheels") or []) or "none"
    lines.append(f"install: {inst.get('status')} ({wheels}) {inst.get('reason') or ''}".rstrip())
    lines.append("stage          status      seconds  budget  reason")
    for name, st in obj.get("stages", {}).items():
        sec = "" if st.get("seconds") is None else f"{st['seconds']:.1f}"
        bud = "" if st.get("budget_s") is None else f"{st['budget_s']:.0f}"
        lines.append(f"  {name:12s} {st.get('status', ''):10s} {sec:>8s} {bud:>7s}  "
                     f"{st.get('reason') or ''}".rstrip())  # fmt: skip
    t = obj.get("tests", {})
    lines.append(f"tests (-m cuda): {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, "
                 f"{t.get('skipped', 0)} skipped")  # fmt: skip
    for case in t.get("cases", []):
        if case.get("outcome") != "passed":
            lines.append(f"  {case['outcome']}: {case['name']}: {case.get('reason') or ''}")
    for key, r in sorted(obj.get("training", {}).items()):
        d = r.get("relative_difference", {})
        audit = r.get("audit") or {}
        lines.append(
            f"  training {key}: loss {r['lm_loss'][-1]:.5f} (CPU {r['reference_lm_loss'][-1]:.5f},"
            f" rel. diff {d.get('lm_loss', 0):.1e}, grad norm {d.get('grad_norm', 0):.1e}), "
            f"peak {_mib(r.get('peak_memory_bytes'))}, off-device ops of ours "
            f"{sum((audit.get('ours_off_device') or {}).values())}"
        )
    for key, r in sorted(obj.get("attention", {}).items()):
        if key == "timing_ms":
            lines.append("  attention ms (fwd+bwd): "
                         + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))  # fmt: skip
            continue
        k = r["kernels"]
        lines.append(f"  attention {key}: forward {k['forward']}, backward {k['backward']} (flex "
                     f"{r.get('flex', '')}), error forward {r['forward_error']:.1e}, backward "
                     f"{r['backward_error']:.1e}")  # fmt: skip
    cal = obj.get("calibration", {})
    if cal.get("file"):
        m, d = cal.get("efficiency_measured", {}), cal.get("efficiency_semu_default", {})
        lines.append(f"calibration: {cal['file']} ({cal.get('device')}); measured / SEMU default: "
                     + ", ".join(f"{k} {_pct(m[k])} / {_pct(d.get(k)) if k in d else '-'}"
                                 for k in m))  # fmt: skip
    for w, r in obj.get("mfu", {}).get("workloads", {}).items():
        lines.append(
            f"mfu {w}: {_ms(r['step_s'])}/step, {r['model_tflops_per_s']:.1f} TFLOP/s, MFU "
            f"{_pct(r['mfu'])}; SEMU calibrated {_ms(r.get('semu_calibrated_step_s'))} "
            f"({_pct(r.get('semu_calibrated_error_pct'), True)}), defaults "
            f"{_ms(r.get('semu_default_step_s'))} ({_pct(r.get('semu_default_error_pct'), True)});"
            f" peak {_mib(r.get('peak_memory_bytes'))}"
        )
    for s in obj.get("skipped", []):
        lines.append(f"skipped: {s}")
    return lines


def write_outputs(out_dir: str | os.PathLike, obj: dict) -> None:
    """``gpu-check.json`` and ``summary.txt`` in ``out_dir``."""
    write_json(Path(out_dir) / "gpu-check.json", obj)
    (Path(out_dir) / "summary.txt").write_text("\n".join(summary_lines(obj)) + "\n")


def finalize(out_dir: str, killed: str, mode: str, budget_s: float, exit_status: int) -> None:
    """After a driver that did not finish: mark the stages it did not reach, write both files.

    Args:
        out_dir: the output folder.
        killed: what happened to the driver (its time limit, its exit status).
        mode: ``gpu`` or ``dry-run`` (for a skeleton, when the driver wrote nothing).
        budget_s: the check's budget.
        exit_status: the check's exit status.
    """
    path = Path(out_dir) / "gpu-check.json"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        obj = skeleton(mode, budget_s)
    for name, st in obj["stages"].items():
        if st["status"] in ("not run", "running"):
            st["status"] = "not run" if st["status"] == "not run" else "killed"
            st["reason"] = killed
            obj["skipped"].append(f"stage {name}: {killed}")
    obj["finished"] = now()
    obj["exit_status"] = exit_status
    write_outputs(out_dir, obj)


def main(argv: list[str] | None = None) -> int:
    """``python -m megatron.mllm.gpu_check.report OUT_DIR --killed WHY``."""
    parser = argparse.ArgumentParser(description=finalize.__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--killed", required=True)
    parser.add_argument("--mode", default="gpu")
    parser.add_argument("--budget", type=float, default=0.0)
    parser.add_argument("--exit-status", type=int, default=1)
    args = parser.parse_args(argv)
    finalize(args.out_dir, args.killed, args.mode, args.budget, args.exit_status)
    return 0


if __name__ == "__main__":
    sys.exit(main())

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``megatron`` stays a namespace shared with megatron-core, installed or from the repo root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = (
    "import megatron, megatron.core, megatron.mllm, orchestration.workload, pipeweaver; "
    "print(megatron.mllm.__file__); print(megatron.core.__file__)"
)


def test_no_megatron_init_file():
    assert not (REPO / "megatron" / "__init__.py").exists()


def _probe(cwd: Path, pythonpath: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONWARNINGS"] = "ignore"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


def test_imports_from_the_installed_package(tmp_path):
    # Outside the checkout, only the installed (editable) package can provide megatron.mllm.
    mllm, core = _probe(tmp_path, None)
    assert Path(mllm).is_relative_to(REPO / "megatron" / "mllm")
    assert "site-packages" in core


def test_imports_from_the_repo_root():
    mllm, core = _probe(REPO, str(REPO))
    assert Path(mllm).parent == REPO / "megatron" / "mllm"
    assert "site-packages" in core

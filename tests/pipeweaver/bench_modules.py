# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The benchmarks under tools/bench/ as modules, for their tests."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"


def bench_module(name: str) -> ModuleType:
    """``tools/bench/NAME.py``, imported as when it runs as a script: its directory is on the
    path, so its siblings (``least_recompute``, ``paper_rows``, ...) import by name."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    return importlib.import_module(name)

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Settings of the whole test suite."""

from __future__ import annotations

import os

# No progress bars in tests, even with `pytest -s` on a terminal, nor in the tools they start.
os.environ["ORCHWEAVE_PROGRESS"] = "0"

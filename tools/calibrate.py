#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Measure OrchWeave's modules on this device: ``megatron.mllm.cli.calibrate`` from a checkout.

What is measured and how: :mod:`megatron.mllm.calibration`; the flags: ``--help``.
"""

import sys

from megatron.mllm.cli.calibrate import main

if __name__ == "__main__":
    sys.exit(main())

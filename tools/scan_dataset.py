#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Scan an Energon dataset from a checkout: see :mod:`megatron.mllm.cli.scan_dataset`."""

import sys

from megatron.mllm.cli.scan_dataset import main

if __name__ == "__main__":
    sys.exit(main())

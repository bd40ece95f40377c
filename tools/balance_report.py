#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``orchweave-balance-report`` from a checkout: see :mod:`megatron.mllm.cli.balance_report`."""

import sys

from megatron.mllm.cli.balance_report import main

if __name__ == "__main__":
    sys.exit(main())

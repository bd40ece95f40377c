#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Draw loss curves from a checkout: see :mod:`megatron.mllm.cli.plot_loss`."""

import sys

from megatron.mllm.cli.plot_loss import main

if __name__ == "__main__":
    sys.exit(main())

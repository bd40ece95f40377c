#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``orchweave-workload`` from a checkout: see :mod:`megatron.mllm.cli.workload`."""

import sys

from megatron.mllm.cli.workload import main

if __name__ == "__main__":
    sys.exit(main())

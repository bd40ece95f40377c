#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``orchweave-explain-step`` from a checkout: see :mod:`megatron.mllm.cli.explain_step`."""

import sys

from megatron.mllm.cli.explain_step import main

if __name__ == "__main__":
    sys.exit(main())

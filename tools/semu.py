#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``orchweave-semu`` from a checkout: see :mod:`megatron.mllm.cli.semu`."""

import sys

from megatron.mllm.cli.semu import main

if __name__ == "__main__":
    sys.exit(main())

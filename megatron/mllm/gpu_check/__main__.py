# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``python -m megatron.mllm.gpu_check``: the GPU check's driver (see its module)."""

import sys

from megatron.mllm.gpu_check.driver import main

sys.exit(main())

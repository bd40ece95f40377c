# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchMLLM in OrchWeave: workload metadata, cost models, balancing, dispatch, orchestration.

Pure Python/numpy except the dispatcher; it never imports ``megatron.mllm``.
"""

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchWeave's Megatron integration: flags, the multimodal model as module chunks, synthetic
multimodal data, the training loop and the CPU compatibility shim for megatron-core.

``megatron`` itself is a namespace shared with the megatron-core wheel; only ``megatron.mllm``
belongs to OrchWeave.
"""

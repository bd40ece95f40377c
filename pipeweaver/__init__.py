# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""PipeWeaver/DIP in OrchWeave: the schedule IR, the runtime, baseline schedules, the
partitioner, the searcher and SEMU. It never imports ``megatron.mllm``.
"""

#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Pretrain a multimodal (vision + audio + text) LLM with Megatron's flags plus OrchWeave's.

Launch with torchrun, e.g. on CPU::

    torchrun --nproc-per-node 2 scripts/pretrain_mllm.py --num-layers 4 --hidden-size 64 ...

See README.md for every flag.
"""

import os
import sys

# Runnable from a checkout without installing: the repo root holds megatron/mllm,
# orchestration and pipeweaver.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.mllm import logs  # noqa: E402

# Before megatron-core is imported: its imports warn (Apex, Transformer Engine) at once.
logs.configure(logs.level_from_argv(sys.argv[1:]))

from megatron.mllm.training import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

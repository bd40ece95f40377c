# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Packaging for OrchWeave, a Megatron-LM fork for multimodal LLM training.

``megatron/`` is a PEP 420 namespace shared with the megatron-core wheel, so only
``megatron.mllm`` is ours; an editable install merges it with the wheel's ``megatron.core``.
"""

from setuptools import find_namespace_packages, setup

setup(
    name="orchweave",
    version="0.1.0",
    description=(
        "Megatron-LM fork for multimodal LLMs: batch post-balancing across data-parallel ranks "
        "and a dynamic interleaved pipeline"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.12",
    packages=find_namespace_packages(include=["megatron.mllm*", "orchestration*", "pipeweaver*"]),
    package_data={"orchestration": ["workloads/*.json"]},
    # einops: megatron-core's process groups of --num-distributed-optimizer-instances.
    install_requires=["megatron-core==0.19.2", "numpy", "tqdm", "einops"],
    extras_require={
        # Imported only where used, with an error naming the extra when missing.
        "ilp": ["highspy"],  # the ILP lower bound of orchestration.bounds
        "plots": ["matplotlib"],  # SEMU's PNG timeline
        "tensorboard": ["tensorboard"],  # --tensorboard-dir (megatron.mllm.reporting)
        "wandb": ["wandb"],  # --wandb-project, offline by default
        # --data-path: Energon datasets, audio decoding and the tokenizer (make demo-data).
        "data": ["megatron-energon>=7.4,<7.5", "soundfile", "tokenizers", "pillow"],
        # The tests exercise every optional path.
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist",  # make test runs the single-process tests 2 at a time
            "hypothesis>=6",
            "highspy",
            "matplotlib",
            "tensorboard",
            "wandb",
            "megatron-energon>=7.4,<7.5",
            "soundfile",
            "tokenizers",
            "pillow",
        ],
        "gpu": ["transformer-engine[pytorch]"],
    },
    entry_points={
        "console_scripts": [
            "orchweave-semu = megatron.mllm.cli.semu:main",
            "orchweave-workload = megatron.mllm.cli.workload:main",
            "orchweave-balance-report = megatron.mllm.cli.balance_report:main",
            "orchweave-calibrate = megatron.mllm.cli.calibrate:main",
            "orchweave-explain-step = megatron.mllm.cli.explain_step:main",
            "orchweave-plot-loss = megatron.mllm.cli.plot_loss:main",
        ]
    },
)

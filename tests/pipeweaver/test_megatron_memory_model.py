# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU's static memory: Megatron's bytes per parameter, the distributed optimizer and FSDP."""

from __future__ import annotations

import pytest

from megatron.mllm.arguments import ConfigError
from megatron.mllm.config_files import run_from_flags
from pipeweaver.semu.work import ModelCosts

FLAGS = [
    "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "64", "--max-position-embeddings", "64", "--vocab-size", "256",
    "--micro-batch-size", "1", "--vision-num-layers", "2", "--audio-num-layers", "0",
]  # fmt: skip


@pytest.mark.parametrize(
    "flags, sharding, bytes_per_param",
    [
        # Megatron's table (docs/architecture.md [4]): d = 8 data-parallel ranks.
        (["--bf16"], "none", 18.0),
        (["--bf16", "--use-distributed-optimizer"], "none", 6 + 12 / 8),
        ([], "none", 16.0),
        (["--use-distributed-optimizer"], "none", 8 + 8 / 8),
        (["--bf16"], "optim", 6 + 12 / 8),
        (["--bf16"], "optim_grads", 2 + 16 / 8),
        (["--bf16"], "optim_grads_params", 18 / 8),
    ],
)
def test_static_bytes_per_parameter_are_megatrons(flags, sharding, bytes_per_param):
    overrides = {"data_parallel_sharding": sharding} if sharding != "none" else None
    spec = run_from_flags([*FLAGS, *flags], 8, parallel_overrides=overrides).semu
    static = ModelCosts(spec).static_bytes(1000.0, 8, gathered_params=10.0)
    total = static["weights"] + static["gradients"] + static["optimizer"]
    assert total == pytest.approx(1000.0 * bytes_per_param, rel=1e-12)
    # Only sharded weights need a gathered layer (the one computing and the one prefetched).
    assert static.get("gathered", 0.0) == (2 * 10.0 * 2 if sharding.endswith("params") else 0.0)


def test_unknown_parallel_overrides_are_an_error_naming_them():
    with pytest.raises(ConfigError, match="unknown fields \\['zero'\\]"):
        run_from_flags(FLAGS, 1, parallel_overrides={"zero": 3})
    with pytest.raises(ConfigError, match="data_parallel_sharding 'zero3'"):
        run_from_flags(FLAGS, 1, parallel_overrides={"data_parallel_sharding": "zero3"})

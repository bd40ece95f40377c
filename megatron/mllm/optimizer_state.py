# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The distributed optimizer's state in a checkpoint: one shard per data-parallel rank.

With ``--use-distributed-optimizer`` megatron-core's ``DistributedOptimizer`` keeps the fp32
main parameters and the Adam moments of this DP rank's slice of each gradient bucket only;
its ``state_dict()`` holds what every rank shares (parameter groups, the step count, the loss
scaler). Megatron-LM's ``torch`` format gathers every rank's slice on DP rank 0 into one
``distrib_optim.pt``; OrchWeave writes each slice where it lives (``distrib_optim_dp_DDDD.pt``
beside the model file, see :mod:`megatron.mllm.checkpointing`), so saving needs no gather and
no rank ever holds more than its share.

A shard is megatron-core's bucket-ordered form of the state (``dp_reshardable``: per buffer,
dtype and bucket, each parameter's slice of its main copy and moments, with its offsets). The
slices depend on the DP size, which a resume must therefore keep; the checkpoint's loader
checks that before it reads anything.
"""

from __future__ import annotations

from typing import Any

import torch


def resume_problem(saved: dict[str, Any], layout: dict[str, Any]) -> str | None:
    """Why a checkpoint's optimizer state cannot be loaded into this run, or None.

    Args:
        saved: the saving run's layout (``dp``, ``distributed_optimizer``,
            ``optimizer_instances``, ``grad_buckets``).
        layout: this run's.
    """
    mine, theirs = layout["distributed_optimizer"], saved["distributed_optimizer"]
    if mine != theirs:
        return (
            f"was saved {'with' if theirs else 'without'} --use-distributed-optimizer, this run "
            f"{'with' if mine else 'without'} it: resume with the saved optimizer, or pass "
            "--no-load-optim to keep only the model"
        )
    copies, saved_copies = layout["optimizer_instances"], saved["optimizer_instances"]
    if mine and saved_copies != copies:
        return (
            f"holds the distributed optimizer's shards of {saved_copies} instance(s) "
            f"(--num-distributed-optimizer-instances); this run has {copies}: "
            + _resume_hint("count")
        )
    buckets, saved_buckets = layout["grad_buckets"], saved["grad_buckets"]
    if mine and saved_buckets != buckets:
        return (
            f"holds the distributed optimizer's shards cut in {_buckets(saved_buckets)}; this "
            f"run cuts them in {_buckets(buckets)}: "
            + _resume_hint("--overlap-grad-reduce and --ddp-bucket-size")
        )
    if mine and saved["dp"] != layout["dp"]:
        return (
            f"holds the distributed optimizer's shards of {saved['dp']} data-parallel ranks; "
            f"this run has {layout['dp']}: " + _resume_hint("data-parallel size")
        )
    return None


def _resume_hint(what: str) -> str:
    """What a user can do when the saved shards follow another ``what`` of the layout."""
    return (
        f"resume with the saved {what} (the shards are not resharded), or pass --no-load-optim "
        "to keep only the model"
    )


def _buckets(size: int | None) -> str:
    return (
        "one bucket (no --overlap-grad-reduce)" if size is None else f"buckets of {size} parameters"
    )


def optimizer_parts(optimizer) -> list:
    """The optimizers inside megatron-core's optimizer (one, or a ``ChainedOptimizer``'s)."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _detached(value: Any) -> Any:
    # A shard's main parameters are views of the model's parameter buffer (fp32 training): a
    # view would save the whole buffer, so every tensor is copied into its own storage.
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    return value


def shard_state(optimizer) -> list[dict | None]:
    """This DP rank's slice of the optimizer state, one entry per optimizer part (None for a
    part that does not shard); no communication."""
    return [
        (
            _detached(p.get_parameter_state_dp_reshardable())
            if hasattr(p, "get_parameter_state_dp_reshardable")
            else None
        )
        for p in optimizer_parts(optimizer)
    ]


def _untie_steps(part) -> None:
    # Without Apex or Transformer Engine (torch's Adam), megatron-core's load_state_dict gives
    # every parameter's state one shared 'step' tensor, which torch's Adam then advances once
    # per parameter: the bias correction of the next step would be wrong. Each gets its own.
    for state in part.optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = step.clone()


def load_shard_state(optimizer, shards: list[dict | None]) -> None:
    """Put a saved :func:`shard_state` back, after ``optimizer.load_state_dict`` allocated the
    state it fills.

    Raises:
        ValueError: the shard does not fit this optimizer (another model, DP size or bucket
            size); the message says which.
    """
    parts = optimizer_parts(optimizer)
    if not isinstance(shards, list) or len(shards) != len(parts):
        raise ValueError(
            f"it holds {len(shards) if isinstance(shards, list) else 'no'} optimizer shards, "
            f"this run has {len(parts)} optimizers"
        )
    for part, shard in zip(parts, shards):
        if shard is None:
            continue
        _untie_steps(part)
        if not hasattr(part, "load_parameter_state_from_dp_reshardable"):
            raise ValueError("it holds a distributed optimizer's shard for a replicated optimizer")
        for key, buffer in shard.items():
            if not isinstance(key, int):  # per_bucket_numel and per_bucket_numel_unpadded
                continue
            for buckets in buffer.values():
                for bucket in buckets:
                    for entry in bucket:
                        # megatron-core's loader skips the paddings that its sharded-state-dict
                        # form interleaves; this form has none.
                        entry.setdefault("padding", False)
        try:
            # With fp32 training the main parameters are views of the model's parameters,
            # which autograd forbids writing into outside no_grad.
            with torch.no_grad():
                part.load_parameter_state_from_dp_reshardable(shard)
        except (AssertionError, KeyError, IndexError, RuntimeError) as e:
            raise ValueError(
                f"its buckets do not match this run's ({type(e).__name__}: {e}); check "
                "--overlap-grad-reduce, --ddp-bucket-size and the model's sizes against the saved "
                "run's"
            ) from e

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's recompute inside a chunk, set for one F/B pair's forward and backward.

A pair whose memory strategy is :attr:`~pipeweaver.ir.Memory.SELECTIVE` or
:attr:`~pipeweaver.ir.Memory.LAYERS` runs its chunk under megatron-core's own activation
recompute, as if the run's ``--recompute-*`` flags were, for that pair only:

* selective: ``--recompute-granularity selective`` (core attention): every ``Attention`` of the
  chunk checkpoints its core attention, whose forward its backward reruns;
* first n layers: ``--recompute-granularity full --recompute-method block
  --recompute-num-layers n``: every ``TransformerBlock`` of the chunk (one per chunk) keeps only
  the input of each of its first n layers and everything of the others.

megatron-core reads those settings when a forward runs (the block's config, each attention's
``checkpoint_core_attention``, fixed at construction from the flags), so
:func:`pair_recompute` sets them on the chunk's modules around the call and restores them after.
The backward enters it again: a checkpoint's backward reruns its layers' forwards, which must
take the same path (an attention inside a recomputed layer checkpoints its core attention or
not, as in the forward). Every other strategy leaves the run's flags as they are; SEMU models
both the same way (:meth:`pipeweaver.semu.work.ModelCosts.recompute_of`).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch

from megatron.core.transformer.attention import Attention
from megatron.core.transformer.transformer_block import TransformerBlock
from pipeweaver.ir import Compute, Memory

_PER_PAIR = (Memory.SELECTIVE, Memory.LAYERS)

# The blocks and attentions of each chunk module, found once (a chunk's structure is fixed).
_PARTS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[list, list]]" = (
    weakref.WeakKeyDictionary()
)


def _parts(module: torch.nn.Module) -> tuple[list, list]:
    parts = _PARTS.get(module)
    if parts is None:
        # A wrapper that keeps its chunk out of its own submodules (the trainer's
        # ``RuntimeChunk``, so that the chunk is registered once) names it ``chunk``.
        inner = getattr(module, "chunk", None)
        root = inner if isinstance(inner, torch.nn.Module) else module
        blocks = [m for m in root.modules() if isinstance(m, TransformerBlock)]
        attentions = [m for m in root.modules() if isinstance(m, Attention)]
        parts = _PARTS[module] = (blocks, attentions)
    return parts


@contextlib.contextmanager
def pair_recompute(module: torch.nn.Module, a: Compute) -> Iterator[None]:
    """Run ``module`` (a chunk) under the recompute of ``a``'s strategy, then restore its
    settings; does nothing for the strategies that leave them to the run's flags."""
    if a.memory not in _PER_PAIR:
        yield
        return
    selective = a.memory is Memory.SELECTIVE
    saved: list[tuple[object, str, object]] = []

    def put(obj: object, name: str, value: object) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    blocks, attentions = _parts(module)
    if not blocks:
        # Running it plainly would keep everything while SEMU and the plan count less.
        raise ValueError(
            f"{a}: memory strategy {a.strategy} needs a megatron-core TransformerBlock in the "
            f"chunk, {type(module).__name__} has none"
        )
    try:
        for block in blocks:
            if selective:
                # Not full: the block runs its layers one by one, each attention checkpointing.
                put(block.config, "recompute_granularity", "selective")
            else:
                put(block.config, "recompute_granularity", "full")
                put(block.config, "recompute_method", "block")
                put(block.config, "recompute_num_layers", a.recompute_layers)
        for attention in attentions:
            put(attention, "checkpoint_core_attention", selective)
        yield
    finally:
        # Reversed: a config shared by several blocks gets its first saved value back.
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)

# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Checkpoints in Megatron's ``torch`` layout: ``--save``, ``--load``, ``--save-interval``.

Layout, as Megatron-LM writes it::

    SAVE/latest_checkpointed_iteration.txt
    SAVE/iter_0000100/mp_rank_00/model_optim_rng.pt          (PP = 1)
    SAVE/iter_0000100/mp_rank_00_001/model_optim_rng.pt      (PP > 1)

One file per (TP, PP) rank, written by data-parallel rank 0. The data order is a pure function
of the iteration, so restoring the iteration restores the data stream exactly.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from megatron.mllm import distributed

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message names the file or the mismatch."""


def checkpoint_file(root: str, iteration: int, tp_rank: int, pp_rank: int, pp_size: int) -> str:
    """Path of one rank's checkpoint file."""
    rank_dir = f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return os.path.join(root, f"iter_{iteration:07d}", rank_dir, "model_optim_rng.pt")


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    root: str,
    iteration: int,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    layout: dict[str, int],
    dp_rank: int,
    tp_rank: int,
    pp_rank: int,
) -> str:
    """Save this rank's model, optimizer, scheduler and RNG state; collective over all ranks.

    Returns:
        The path written by this (TP, PP) rank.
    """
    path = checkpoint_file(root, iteration, tp_rank, pp_rank, layout["pp"])
    if dp_rank == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        state = {
            "iteration": iteration,
            "layout": layout,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "opt_param_scheduler": scheduler.state_dict(),
            "rng_state": _rng_state(),
        }
        tmp = path + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)
    distributed.barrier()
    if distributed.global_rank() == 0:
        with open(os.path.join(root, TRACKER), "w", encoding="utf-8") as f:
            f.write(str(iteration))
    distributed.barrier()
    return path


def latest_iteration(root: str) -> int | None:
    """The iteration named by the tracker file, or None when there is no checkpoint."""
    tracker = os.path.join(root, TRACKER)
    if not os.path.isfile(tracker):
        return None
    text = open(tracker, encoding="utf-8").read().strip()
    try:
        return int(text)
    except ValueError as e:
        raise CheckpointError(f"{tracker}: expected an iteration number, found {text!r}") from e


def load_checkpoint(
    root: str,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    layout: dict[str, int],
    tp_rank: int,
    pp_rank: int,
    load_optim: bool = True,
    load_rng: bool = True,
) -> int:
    """Restore this rank's state from the latest checkpoint under ``root``.

    Returns:
        The iteration to resume after (0 when ``root`` holds no checkpoint).

    Raises:
        CheckpointError: a missing rank file or a different parallel layout.
    """
    iteration = latest_iteration(root)
    if iteration is None:
        logger.warning("no checkpoint found in %s: starting from scratch", root)
        return 0
    path = checkpoint_file(root, iteration, tp_rank, pp_rank, layout["pp"])
    if not os.path.isfile(path):
        raise CheckpointError(
            f"checkpoint of iteration {iteration} has no file for this rank: {path} (was it "
            "saved with another --tensor-model-parallel-size / --pipeline-model-parallel-size?)"
        )
    state = torch.load(path, map_location="cpu", weights_only=False)
    saved = {k: v for k, v in state["layout"].items() if k in ("tp", "pp", "chunks")}
    wanted = {k: v for k, v in layout.items() if k in ("tp", "pp", "chunks")}
    if saved != wanted:
        raise CheckpointError(f"{path} was saved with layout {saved}, this run uses {wanted}")
    model.load_state_dict(state["model"])
    if load_optim:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["opt_param_scheduler"])
    if load_rng:
        _set_rng_state(state["rng_state"])
    return int(state["iteration"])

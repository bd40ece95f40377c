# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The model's entries of a checkpoint: whether they fit this model, and how they follow a
different split of the modules.

A runtime model's state keys are local to its chunks (``chunks.llm_1.block.layers.0...``); the
checkpoint's layout records each chunk's layers (``llm1:2-4``), which turns every key into its
layout-independent name (``llm.layers.2...``, :func:`megatron.mllm.chunks.global_name`). A run
whose modules are split otherwise (other ``--*-chunks-per-stage``, or the partitioner's ``auto``
splits) finds each of its entries by that name in the pipeline ranks' files.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import torch

from megatron.mllm.chunks import global_name


class ModelStateError(ValueError):
    """A checkpoint's model entries that do not fit this model (the loader raises it as a
    :class:`~megatron.mllm.checkpointing.CheckpointError`)."""


# The flags that size each module's parameters, for a checkpoint of another model size.
_SIZE_FLAGS = {
    "vision": "--vision-hidden-size, --vision-ffn-hidden-size, --vision-patch-size, --hidden-size",
    "audio": "--audio-hidden-size, --audio-ffn-hidden-size, --audio-feature-dim, --hidden-size",
    "llm": "--hidden-size, --ffn-hidden-size, --vocab-size, --max-position-embeddings",
}


def _module_of(name: str) -> str:
    return next((m for m in ("vision", "audio") if name.startswith(m + ".")), "llm")


def check_model(path: str, model: torch.nn.Module, saved: dict[str, Any]) -> None:
    """The saved parameters are this model's, shape for shape (before anything is loaded).

    Raises:
        ModelStateError: naming the entry and the flags that size it.
    """
    inner = getattr(model, "module", model)
    names = inner.global_param_names() if hasattr(inner, "global_param_names") else {}
    own = model.state_dict()
    for key, tensor in own.items():
        name = names.get(key, key)
        theirs = saved.get(key)
        if key not in saved:
            raise ModelStateError(
                f"{path} has no {name}: check --num-layers, --vision-num-layers, "
                "--audio-num-layers and --projector-type against the saved run's"
            )
        if isinstance(tensor, torch.Tensor) and isinstance(theirs, torch.Tensor):
            if theirs.shape != tensor.shape:
                raise ModelStateError(
                    f"{path}: {name} is {list(theirs.shape)} in the checkpoint but "
                    f"{list(tensor.shape)} in this model: check {_SIZE_FLAGS[_module_of(name)]} "
                    "against the saved run's"
                )
    extra = next((key for key in saved if key not in own), None)
    if extra is not None:
        raise ModelStateError(
            f"{path} holds {extra}, which this model lacks: check --num-layers, "
            "--vision-num-layers, --audio-num-layers and --projector-type against the saved run's"
        )


_CHUNK_KEY = re.compile(r"^(?:module\.)?chunks\.([a-z]+)_(\d+)\.(.+)$")
"""A runtime model's state entry: ``chunks.<module>_<chunk>.<local name>``."""

_LAYOUT_CHUNK = re.compile(r"^([a-z]+)(\d+):(\d+)-(\d+)$")
"""A chunk of a layout as checkpoints record it: ``<module><chunk>:<start>-<stop>``."""


def global_names(keys: Iterable[str], chunks: list[str] | None) -> dict[str, str] | None:
    """Each runtime-model state key -> its layout-independent name, given the layout's chunks;
    None when the keys or chunks are not a runtime model's (the baseline's stage model)."""
    starts = {}
    for entry in chunks or []:
        match = _LAYOUT_CHUNK.match(entry)
        if match is None:
            return None
        starts[(match[1], int(match[2]))] = int(match[3])
    names = {}
    for key in keys:
        match = _CHUNK_KEY.match(key)
        start = starts.get((match[1], int(match[2]))) if match else None
        if start is None:
            return None
        names[key] = global_name(match[1], start, match[3])
    return names


def resplit(model: torch.nn.Module, chunks: list[str] | None, state: dict[str, Any],
            load_optim: bool, read_pipeline: Callable[[], list[dict[str, Any]]], path: str,
            directory: str) -> dict[str, Any]:  # fmt: skip
    """This rank's model state from a checkpoint saved with the modules split otherwise (the
    same pipeline size): every entry found by its layout-independent name.

    Args:
        model: this rank's model.
        chunks: its layout's chunks.
        state: this rank's file of the checkpoint (its ``model`` and ``layout``).
        load_optim: whether the optimizer state is to be loaded too (refused: it is kept per
            rank and does not follow the layers).
        read_pipeline: verifies and reads every pipeline rank's file (of this TP rank).
        path, directory: this rank's file and the checkpoint, for messages.

    Raises:
        ModelStateError: naming the chunks, the flag or the entry at fault.
    """
    saved_chunks = state["layout"].get("chunks")
    mismatch = (
        f"{path} holds the chunks {saved_chunks}, this run places {chunks} here: check "
        "--num-layers, --vision-num-layers, --audio-num-layers, --pipeline-schedule and the "
        "--*-chunks-per-stage against the saved run's (with auto, also --cost-calibration, the "
        "workload and the batch sizes the partitioner reads)"
    )
    own = global_names(model.state_dict().keys(), chunks)
    if own is None or global_names(state["model"].keys(), saved_chunks) is None:
        raise ModelStateError(mismatch)
    if load_optim:
        raise ModelStateError(
            f"{mismatch}; or pass --no-load-optim to load the model alone into this split (the "
            "optimizer state is kept per rank and does not follow the layers)"
        )
    by_name: dict[str, Any] = {}
    for saved in read_pipeline():
        names = global_names(saved["model"].keys(), saved["layout"].get("chunks"))
        if names is None:
            raise ModelStateError(mismatch)
        by_name.update({names[key]: value for key, value in saved["model"].items()})
    missing = next((name for name in own.values() if name not in by_name), None)
    if missing is not None:
        raise ModelStateError(
            f"{directory} holds no {missing} in any pipeline rank's file: check --num-layers, "
            "--vision-num-layers, --audio-num-layers against the saved run's"
        )
    return {key: by_name[name] for key, name in own.items()}

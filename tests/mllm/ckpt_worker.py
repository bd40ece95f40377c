# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Checkpoint worker: trains and resumes in one launch, crashes mid-save, runs ``main`` on bad
checkpoints.

Usage::

    ckpt_worker.py train OUT NAME FLAGS... [--- NAME FLAGS...]     (torchrun)
    ckpt_worker.py main OUT NAME FLAGS... [--- NAME FLAGS...]      (one process, no torchrun)

``train``: each configuration trains in these processes with a fresh trainer and writes its
metrics to ``OUT/NAME.jsonl``. A configuration whose trainer fails with a CheckpointError
writes each rank's message to ``OUT/NAME.rank{R}.error``. Two flags are the worker's, not the
trainer's: ``--flip-bytes FILE`` (rank 0 changes bytes inside a tensor of FILE before the
trainer starts) and ``--crash-in-save ITERATION`` (global rank 0 writes ``OUT/NAME.crashed``
and dies with status 3 after its first file of that iteration's save, before its next one:
a kill between files; it must be the launch's last configuration).

``main``: the trainer's entry point per configuration, as ``scripts/pretrain_mllm.py`` runs it;
everything written to stderr (file descriptor 2) goes to ``OUT/NAME.stderr``, stdout to
``OUT/NAME.stdout``, and the exit status to ``OUT/NAME.rc``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import zipfile

import torch.distributed as dist
from grad_worker import configurations

from megatron.core import parallel_state
from megatron.mllm import checkpointing
from megatron.mllm.arguments import parse_arguments
from megatron.mllm.cli.launch import free_port
from megatron.mllm.run_config import RunConfig
from megatron.mllm.training import Trainer, main


def flip_tensor_bytes(path: str) -> None:
    """Change the low byte of 8 float32 values in the middle of the largest tensor of a
    ``torch.save`` file: its size stays, its values stay finite, and torch.load reads it."""
    with zipfile.ZipFile(path) as archive:
        largest = max(
            (i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size
        )
    with open(path, "r+b") as f:
        f.seek(largest.header_offset + 26)  # the local header's name and extra-field lengths
        name_length = int.from_bytes(f.read(2), "little")
        extra_length = int.from_bytes(f.read(2), "little")
        start = largest.header_offset + 30 + name_length + extra_length
        middle = start + largest.file_size // 8 * 4
        for k in range(8):
            f.seek(middle + 4 * k)
            byte = f.read(1)[0]
            f.seek(middle + 4 * k)
            f.write(bytes([byte ^ 0x5A]))


def _pop(flags: list[str], name: str) -> str | None:
    if name not in flags:
        return None
    i = flags.index(name)
    value = flags[i + 1]
    del flags[i : i + 2]
    return value


def _crash_in_save(marker: str, iteration: int) -> None:
    """Make global rank 0 die after its first file of ``iteration``'s save."""
    write_file = checkpointing._write_file
    written = []

    def write_then_die(directory, relative, obj):
        if dist.get_rank() == 0 and os.path.basename(directory) == f"iter_{iteration:07d}":
            if written:
                open(marker, "w").close()
                os._exit(3)
            written.append(relative)
        return write_file(directory, relative, obj)

    checkpointing._write_file = write_then_die


def train(out_dir: str, argv: list[str]) -> None:
    for name, flags in configurations(argv):
        flip, crash = _pop(flags, "--flip-bytes"), _pop(flags, "--crash-in-save")
        if flip:  # (after a first configuration: the trainer starts torch.distributed)
            if dist.get_rank() == 0:
                flip_tensor_bytes(flip)
            dist.barrier()
        if crash:
            _crash_in_save(os.path.join(out_dir, f"{name}.crashed"), int(crash))
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        metrics = os.path.join(out_dir, f"{name}.jsonl")
        try:
            trainer = Trainer(
                RunConfig.from_args(parse_arguments([*flags, "--metrics-jsonl", metrics]))
            )
        except checkpointing.CheckpointError as e:
            with open(os.path.join(out_dir, f"{name}.rank{dist.get_rank()}.error"), "w") as f:
                f.write(str(e))
            continue
        trainer.train()
    dist.destroy_process_group()


def run_main(out_dir: str, argv: list[str]) -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    for name, flags in configurations(argv):
        os.environ["MASTER_PORT"] = str(free_port())
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        base = os.path.join(out_dir, name)
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(2)
        with open(base + ".stderr", "w") as err, open(base + ".stdout", "w") as out:
            os.dup2(err.fileno(), 2)
            try:
                with contextlib.redirect_stdout(out):
                    rc = main(flags)
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
        with open(base + ".rc", "w") as f:
            f.write(str(rc))


if __name__ == "__main__":
    mode, out, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    {"train": train, "main": run_main}[mode](out, rest)

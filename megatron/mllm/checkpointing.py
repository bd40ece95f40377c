# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Checkpoints in Megatron's ``torch`` layout, verified: ``--save``, ``--load``, ``--ckpt-step``.

Layout (Megatron-LM's, plus one random-state file per rank and a manifest)::

    SAVE/latest_checkpointed_iteration.txt              the latest complete iteration
    SAVE/iter_0000100/manifest.json                     size and sha256 of every file below
    SAVE/iter_0000100/mp_rank_00/model_optim_rng.pt     model, optimizer, scheduler (PP = 1)
    SAVE/iter_0000100/mp_rank_00/rng_dp_0000.pt         random states of DP rank 0
    SAVE/iter_0000100/mp_rank_00/rng_dp_0001.pt         ... of DP rank 1
    SAVE/iter_0000100/mp_rank_00/distrib_optim_dp_0000.pt   DP rank 0's optimizer shard
                                                        (--use-distributed-optimizer)
    SAVE/iter_0000100/mp_rank_00_001/...                the same per (TP, PP) rank, PP > 1

Data-parallel rank 0 of each (TP, PP) rank writes its model file; every rank writes its own
random states (Python ``random``, numpy, torch's CPU and CUDA generators, megatron-core's RNG
tracker), because DP ranks draw different dropout masks for their different samples. The data
order is a pure function of the iteration, so model, optimizer and random states restore the
run exactly; the manifest records the data source it is a function of (dataset, seed, global
batch: :mod:`megatron.mllm.data_state`), and ``--load`` refuses another. A run with another DP size gets the same global batches, but its ranks' random
states cannot be mapped onto the saved ones: it resumes with a warning that they are not
restored (dropout then differs from an uninterrupted run). Another TP or PP size is an error:
these files are not resharded. Another split of the modules over the same pipeline (other
``--*-chunks-per-stage``, the partitioner's ``auto``) loads the model with ``--no-load-optim``,
each entry by its layout-independent name from the pipeline ranks' files
(:mod:`megatron.mllm.checkpoint_model`); the optimizer state is per rank and does not follow. With ``--use-distributed-optimizer`` every DP rank also writes
its shard of the optimizer state (:mod:`megatron.mllm.optimizer_state`); those shards are
not resharded either, so such a checkpoint resumes with the same DP size and optimizer.

A save is complete only when its manifest exists: every rank writes its files (each through a
temporary name, fsynced, then renamed), the ranks gather the files' sizes and digests, and
global rank 0 writes the manifest, then the tracker, each atomically. A crash at any point
leaves the tracker on the previous complete iteration. ``--load`` checks the manifest and the
digest of every file it reads before it reads it, and every rank raises the same
:class:`CheckpointError` when any rank finds a problem.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import re
from typing import Any, Callable

import numpy as np
import torch

from megatron.mllm import checkpoint_model, data_state, distributed, optimizer_state

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
MANIFEST = "manifest.json"
_ITERATION_DIR = re.compile(r"iter_(\d+)$")
_MANIFEST_LAYOUT = (
    "tp",
    "pp",
    "dp",
    "distributed_optimizer",
    "optimizer_instances",
    "grad_buckets",
)
"""What a manifest records of the saving run's layout (older ones lack the optimizer's and the
buckets': one bucket, no --overlap-grad-reduce)."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved or resumed from; the message names the file."""


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's coordinates in the parallel layout."""

    dp: int
    tp: int
    pp: int


def iteration_dir(root: str, iteration: int) -> str:
    """Directory of one iteration's checkpoint."""
    return os.path.join(root, f"iter_{iteration:07d}")


def _rank_dir(tp_rank: int, pp_rank: int, pp_size: int) -> str:
    return f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def model_file(ranks: Ranks, pp_size: int) -> str:
    """The model, optimizer and scheduler file of a rank's (TP, PP) rank, relative to its
    iteration (Megatron's name, though the random states now have files of their own)."""
    return os.path.join(_rank_dir(ranks.tp, ranks.pp, pp_size), "model_optim_rng.pt")


def rng_file(ranks: Ranks, pp_size: int) -> str:
    """A rank's random-state file, relative to its iteration."""
    return os.path.join(_rank_dir(ranks.tp, ranks.pp, pp_size), f"rng_dp_{ranks.dp:04d}.pt")


def optimizer_shard_file(ranks: Ranks, pp_size: int) -> str:
    """A DP rank's shard of the distributed optimizer's state, relative to its iteration."""
    return os.path.join(
        _rank_dir(ranks.tp, ranks.pp, pp_size), f"distrib_optim_dp_{ranks.dp:04d}.pt"
    )


# ------------------------------------------------------------------------------ random states


def rng_state() -> dict[str, Any]:
    """Every random state this process draws from."""
    # Imported here: megatron.core is importable on CPU only after the trainer's CPU shim.
    from megatron.core import tensor_parallel

    state = {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        # On CPU the shim's tracker holds no states (dropout draws from the CPU generator).
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    from megatron.core import tensor_parallel

    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


# ------------------------------------------------------------------------------------ files


class _HashingWriter:
    """A file that digests what is written through it, so saving reads nothing back."""

    def __init__(self, file):
        self.file, self.sha256, self.size = file, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def _write_atomically(path: str, write: Callable[[Any], None]) -> _HashingWriter:
    """``write(file)`` into ``path`` through a temporary name, fsynced before the rename."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        writer = _HashingWriter(f)
        write(writer)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return writer


def _write_file(directory: str, relative: str, obj: Any) -> tuple[str, dict[str, Any]]:
    """torch.save ``obj`` as ``directory/relative``; its manifest entry."""
    path = os.path.join(directory, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    writer = _write_atomically(path, lambda f: torch.save(obj, f))
    return relative, {"bytes": writer.size, "sha256": writer.sha256.hexdigest()}


def _write_text(path: str, text: str) -> None:
    """``text`` as ``path``, atomically and durably (the manifest, the tracker)."""
    _write_atomically(path, lambda f: f.write(text.encode()))
    # The rename itself is durable only once its directory is.
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------- agreeing on errors


def _on_every_rank(action: Callable[[], Any]) -> list:
    """Run ``action`` here; if it failed on any rank, raise that failure on every rank.

    A rank that stopped alone would leave the others waiting in their next collective.

    Returns:
        Every rank's result, in global rank order (keep them small: they are gathered).
    """
    try:
        outcome = (None, action())
    except CheckpointError as e:
        outcome = (str(e), None)
    except OSError as e:  # a file system refusing a write or a read
        outcome = (f"{e.filename}: {e.strerror or e}", None)
    outcomes = distributed.all_gather_objects(outcome)
    failed = [(rank, problem) for rank, (problem, _) in enumerate(outcomes) if problem is not None]
    if failed:
        rank, message = failed[0]
        if len(failed) < len(outcomes) or any(p != message for _, p in failed):
            message = f"rank {rank}: {message}"
        raise CheckpointError(message)
    return [result for _, result in outcomes]


# ------------------------------------------------------------------------------------- save


def save_checkpoint(
    root: str,
    iteration: int,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    layout: dict[str, Any],
    ranks: Ranks,
    step_state: dict[str, Any] | None = None,
    data: data_state.StreamSource | None = None,
) -> str:
    """Save this rank's share of ``iteration``; collective over all ranks.

    Args:
        layout: the trainer's parallel layout: ``tp``, ``pp``, ``dp`` sizes, ``chunks`` and
            ``distributed_optimizer``.
        step_state: this rank's training-step state (the balancer's fitted costs and its
            measured times not yet gathered), saved with its random states.
        data: the run's data source; the manifest records it with the samples consumed.

    Returns:
        The iteration's directory.

    Raises:
        CheckpointError: on every rank, when any rank could not write (the file and the reason).
    """
    directory = iteration_dir(root, iteration)
    first = distributed.global_rank() == 0

    def prepare() -> None:
        os.makedirs(directory, exist_ok=True)
        # Saving an iteration again (after resuming from an earlier one): it is incomplete
        # from its first rewritten file on.
        if os.path.exists(os.path.join(directory, MANIFEST)):
            os.remove(os.path.join(directory, MANIFEST))

    def write() -> list:
        entries = []
        if ranks.dp == 0:
            state = {
                "iteration": iteration,
                "layout": layout,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "opt_param_scheduler": scheduler.state_dict(),
            }
            entries.append(_write_file(directory, model_file(ranks, layout["pp"]), state))
        if layout["distributed_optimizer"]:
            shard = optimizer_state.shard_state(optimizer)
            entries.append(_write_file(directory, optimizer_shard_file(ranks, layout["pp"]), shard))
        rank_state = rng_state()
        if step_state:
            rank_state["step"] = step_state
        entries.append(_write_file(directory, rng_file(ranks, layout["pp"]), rank_state))
        return entries

    def commit() -> None:
        manifest = {
            "iteration": iteration,
            "layout": {k: layout[k] for k in _MANIFEST_LAYOUT},
            "files": files,
        }
        if data is not None:
            manifest["data"] = data_state.saved_state(data, iteration)
        _write_text(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1))
        # Only now does the iteration become the one to resume from.
        _write_text(os.path.join(root, TRACKER), str(iteration))

    _on_every_rank(prepare if first else lambda: None)
    # Once gathered, every rank's files are on disk.
    files = dict(entry for entries in _on_every_rank(write) for entry in entries)
    _on_every_rank(commit if first else lambda: None)
    return directory


# ------------------------------------------------------------------------------------- load


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One complete iteration under ``--load``, as its manifest describes it."""

    root: str
    iteration: int
    manifest: dict

    @property
    def directory(self) -> str:
        """The iteration's directory."""
        return iteration_dir(self.root, self.iteration)

    @property
    def layout(self) -> dict[str, int]:
        """The saving run's ``tp``, ``pp`` and ``dp`` sizes, ``distributed_optimizer``,
        ``optimizer_instances`` (``--num-distributed-optimizer-instances``) and
        ``grad_buckets`` (``--ddp-bucket-size`` with ``--overlap-grad-reduce``, else None)."""
        return {
            "distributed_optimizer": False,
            "optimizer_instances": 1,
            "grad_buckets": None,
            **self.manifest["layout"],
        }

    def path(self, relative: str) -> str:
        """A file's path from its name in the manifest."""
        return os.path.join(self.directory, relative)


def latest_iteration(root: str) -> int | None:
    """The iteration named by the tracker file, or None when there is no tracker."""
    tracker = os.path.join(root, TRACKER)
    if not os.path.isfile(tracker):
        return None
    with open(tracker, encoding="utf-8") as f:
        text = f.read().strip()
    try:
        return int(text)
    except ValueError as e:
        raise CheckpointError(f"{tracker}: expected an iteration number, found {text!r}") from e


def _inventory(root: str) -> str:
    """The iterations under ``root``, complete or not, for an error message."""
    found = sorted(
        int(m.group(1)) for name in os.listdir(root) if (m := _ITERATION_DIR.match(name))
    )
    if not found:
        return "it holds no iteration directory"
    complete = [i for i in found if os.path.isfile(os.path.join(iteration_dir(root, i), MANIFEST))]
    incomplete = sorted(set(found) - set(complete))
    text = f"complete iterations: {', '.join(map(str, complete)) or 'none'}"
    return text + (f"; incomplete: {', '.join(map(str, incomplete))}" if incomplete else "")


def find_checkpoint(root: str, ckpt_step: int | None = None) -> Checkpoint | None:
    """The checkpoint that ``--load root`` (and ``--ckpt-step``) names.

    Returns:
        None when ``root`` is a directory without any checkpoint: the run starts from scratch.

    Raises:
        CheckpointError: ``root`` does not exist, or the iteration it names is missing,
            incomplete or has an unreadable manifest.
    """
    if not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist"
        raise CheckpointError(f"--load {root} {what} (an empty directory starts from scratch)")
    if ckpt_step is not None:
        iteration, source = ckpt_step, f"--ckpt-step {ckpt_step}"
    else:
        iteration, source = latest_iteration(root), TRACKER
        if iteration is None:
            if os.path.exists(os.path.join(root, MANIFEST)):
                raise CheckpointError(
                    f"--load {root} is one iteration's directory: pass the directory above it"
                )
            if any(_ITERATION_DIR.match(name) for name in os.listdir(root)):
                raise CheckpointError(
                    f"--load {root} has no {TRACKER} ({_inventory(root)}): choose an iteration "
                    "with --ckpt-step, or remove them to start from scratch"
                )
            return None
    directory = iteration_dir(root, iteration)
    if not os.path.isdir(directory):
        raise CheckpointError(
            f"--load {root}: {source} names iteration {iteration}, but {directory} does not "
            f"exist ({_inventory(root)})"
        )
    manifest_path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise CheckpointError(
            f"{directory} is incomplete: it has no {MANIFEST}, so its save did not finish or "
            f"predates manifests ({_inventory(root)}; choose one with --ckpt-step)"
        )
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        well_formed = (
            manifest["iteration"] == iteration
            and all(isinstance(manifest["layout"][k], int) for k in ("tp", "pp", "dp"))
            and all(
                isinstance(e["bytes"], int) and isinstance(e["sha256"], str)
                for e in manifest["files"].values()
            )
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSON, or not this shape
        raise CheckpointError(f"{manifest_path} is unreadable: {type(e).__name__}: {e}") from e
    if not well_formed:
        raise CheckpointError(
            f"{manifest_path} is unreadable: not a manifest of iteration {iteration}"
        )
    return Checkpoint(root, iteration, manifest)


def _check_sizes(checkpoint: Checkpoint, layout: dict[str, Any]) -> None:
    saved = checkpoint.layout
    if (saved["tp"], saved["pp"]) != (layout["tp"], layout["pp"]):
        raise CheckpointError(
            f"{checkpoint.directory} was saved with --tensor-model-parallel-size {saved['tp']} "
            f"--pipeline-model-parallel-size {saved['pp']}; this run has {layout['tp']} and "
            f"{layout['pp']}: resume with the saved sizes (these files are not resharded)"
        )


def _verify(checkpoint: Checkpoint, relatives: list[str], digests: bool) -> None:
    """Every file is there with its manifest's size, and (``digests``) its sha256."""
    files = checkpoint.manifest["files"]
    for relative in relatives:
        path, entry = checkpoint.path(relative), files.get(relative)
        if entry is None:
            raise CheckpointError(f"{checkpoint.directory}/{MANIFEST} lists no {relative}")
        if not os.path.isfile(path):
            raise CheckpointError(f"{path} is missing (listed in {MANIFEST})")
        size = os.path.getsize(path)
        if size != entry["bytes"]:
            raise CheckpointError(
                f"{path} has {size} bytes, {MANIFEST} says {entry['bytes']}: it was truncated "
                "or overwritten after the save"
            )
        if digests and _sha256(path) != entry["sha256"]:
            raise CheckpointError(
                f"{path} is corrupted: its sha256 differs from {MANIFEST}'s (bytes changed "
                "after the save)"
            )


def _read(path: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 (unpickling raises any type; its digest matched)
        raise CheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from e


def load_checkpoint(
    root: str,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    layout: dict[str, Any],
    ranks: Ranks,
    ckpt_step: int | None = None,
    load_optim: bool = True,
    load_rng: bool = True,
    step=None,
    data: data_state.StreamSource | None = None,
) -> int:
    """Restore this rank's state from the checkpoint under ``root``; collective.

    Every file this rank reads is verified against the manifest first; global rank 0 also
    checks that every file of the manifest is there with its size.

    With the random states (same DP size, not ``--no-load-rng``) the training step's state
    saved beside them is restored into ``step`` (its ``load_state_dict``). The data source the
    manifest records must be ``data`` (the same dataset, seed and global batch size).

    Returns:
        The iteration to resume after (0 when ``root`` holds no checkpoint).

    Raises:
        CheckpointError: on every rank, naming the file, iteration or size at fault.
    """
    first = distributed.global_rank() == 0
    model_relative = model_file(ranks, layout["pp"])
    checkpoint = None

    def verify() -> int | None:
        nonlocal checkpoint
        checkpoint = find_checkpoint(root, ckpt_step)
        if checkpoint is None:
            return None
        _check_sizes(checkpoint, layout)
        if data is not None:
            saved = checkpoint.manifest.get("data")
            problem = data_state.resume_problem(saved, data, checkpoint.directory)
            if problem:
                raise CheckpointError(problem)
        problem = optimizer_state.resume_problem(checkpoint.layout, layout) if load_optim else None
        if problem:
            raise CheckpointError(f"{checkpoint.directory} {problem}")
        reads = [model_relative]
        if load_optim and layout["distributed_optimizer"]:
            reads.append(optimizer_shard_file(ranks, layout["pp"]))
        if load_rng and checkpoint.layout["dp"] == layout["dp"]:
            reads.append(rng_file(ranks, layout["pp"]))
        _verify(checkpoint, reads, digests=True)
        if first:
            _verify(checkpoint, sorted(checkpoint.manifest["files"]), digests=False)
        return checkpoint.iteration

    iterations = _on_every_rank(verify)
    if len(set(iterations)) > 1:
        raise CheckpointError(
            f"ranks find different checkpoints under --load {root} (iterations by rank: "
            f"{iterations}): every rank must see the same directory"
        )
    if checkpoint is None:
        if first:
            logger.warning("--load %s holds no checkpoint: starting from scratch", root)
        return 0
    restore_rng = load_rng and checkpoint.layout["dp"] == layout["dp"]

    def restore() -> None:
        path = checkpoint.path(model_relative)
        state = _read(path)
        if state.get("iteration") != checkpoint.iteration:
            raise CheckpointError(
                f"{path} holds iteration {state.get('iteration')}, not {checkpoint.iteration}"
            )
        saved_chunks, chunks = state["layout"].get("chunks"), layout.get("chunks")
        model_state = state["model"]

        def read_pipeline() -> list[dict[str, Any]]:
            """Every pipeline rank's model file (of this TP rank), verified first."""
            files = [model_file(Ranks(ranks.dp, ranks.tp, p), layout["pp"])
                     for p in range(layout["pp"])]  # fmt: skip
            _verify(checkpoint, files, digests=True)
            return [_read(checkpoint.path(relative)) for relative in files]

        try:
            if saved_chunks != chunks:  # another split of the modules: entries by name
                model_state = checkpoint_model.resplit(
                    model, chunks, state, load_optim, read_pipeline, path, checkpoint.directory
                )
            checkpoint_model.check_model(path, model, model_state)
        except checkpoint_model.ModelStateError as e:
            raise CheckpointError(str(e)) from None
        model.load_state_dict(model_state)
        if not load_optim:
            # Main parameters kept apart from the model's (bf16, or the distributed
            # optimizer's shards of them) follow the loaded model.
            optimizer.reload_model_params()
        if load_optim:
            try:
                optimizer.load_state_dict(state["optimizer"])
            except (ValueError, KeyError, RuntimeError) as e:
                raise CheckpointError(f"{path}: its optimizer state does not fit: {e}") from e
            if layout["distributed_optimizer"]:
                shard_path = checkpoint.path(optimizer_shard_file(ranks, layout["pp"]))
                try:
                    optimizer_state.load_shard_state(optimizer, _read(shard_path))
                except ValueError as e:
                    raise CheckpointError(f"{shard_path} does not fit this run: {e}") from e
            try:
                scheduler.load_state_dict(state["opt_param_scheduler"])
            except AssertionError as e:
                raise CheckpointError(
                    f"{path}: this run's learning-rate schedule differs from the saved run's "
                    f"({e}; steps count samples): keep --train-iters and the --lr* flags as "
                    "saved, or pass --override-opt-param-scheduler to use this run's or "
                    "--use-checkpoint-opt-param-scheduler to use the checkpoint's"
                ) from e
        if restore_rng:
            rank_state = _read(checkpoint.path(rng_file(ranks, layout["pp"])))
            set_rng_state(rank_state)
            if step is not None and "step" in rank_state:
                step.load_state_dict(rank_state["step"])

    _on_every_rank(restore)
    if load_rng and not restore_rng and first:
        logger.warning(
            "%s was saved by %d data-parallel ranks, this run has %d: their random states are "
            "not restored, so dropout differs from an uninterrupted run's (the model, optimizer "
            "and data order are restored; --no-load-rng skips this warning)",
            checkpoint.directory, checkpoint.layout["dp"], layout["dp"],
        )  # fmt: skip
    return checkpoint.iteration

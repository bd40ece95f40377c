# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The data stream's state in checkpoints: what a resume must continue, and its refusals.

Both data sources are stateless by design: stream index ``k`` is a pure function of the source
and its seed (a generated or JSONL workload: ``(seed, k)``; an Energon dataset: sample
``perm_e[k mod N]`` of epoch ``e = k // N``, drawn from ``(seed, e)``), and iteration ``i``
reads stream indices ``i * global_batch_size`` onwards. A resume therefore continues with the
same samples in the same order exactly when it reads the same source, with the same seed and
global batch size. The loader's look-ahead (the next iteration's metadata, gathered one
iteration early) and the plans made ahead from it are recomputed from the stream after a
resume; what they learnt from measured times (the fitted costs) is the step's state, saved
beside each rank's random states.

A checkpoint's manifest records the source (:func:`saved_state`); ``--load`` compares it with
the run's (:func:`resume_problem`) before any file is read, and a different dataset, seed or
global batch size is one error naming the flag and both values. Checkpoints saved before the
source was recorded are not checked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

ENERGON = "energon"
"""The source kind of ``--data-path``."""

WORKLOAD = "workload"
"""The source kind of synthetic data (``--workload``)."""


@dataclass(frozen=True, slots=True)
class StreamSource:
    """Where a run's samples come from, as a checkpoint records it."""

    kind: str
    """:data:`ENERGON` or :data:`WORKLOAD`."""

    path: str
    """The dataset directory (absolute), or the ``--workload`` spec or JSONL."""

    num_samples: int | None
    """Samples of one epoch of the dataset; None for a workload."""

    fingerprint: str | None
    """The dataset's :func:`shard_index_fingerprint`; None for a workload."""

    seed: int
    """Seed of the sample order (``--seed``) or of the generated workload (``--workload-seed``)."""

    global_batch_size: int
    """Stream samples per iteration."""

    @property
    def seed_flag(self) -> str:
        """The flag that sets :attr:`seed`."""
        return "--seed" if self.kind == ENERGON else "--workload-seed"

    def describe(self) -> str:
        """The source for an error message."""
        if self.kind == WORKLOAD:
            return f"synthetic data (--workload {self.path})"
        return f"--data-path {self.path} ({self.num_samples} samples, shards {self.fingerprint})"


def shard_index_fingerprint(path: str) -> str:
    """A cheap fingerprint of the Energon dataset at ``path``: its split and every shard's
    name, sample count and size in bytes (of the tar and of its index), from
    ``.nv-meta/.info.json``, ``.nv-meta/split.yaml`` and one ``stat`` per file.

    It tells another dataset, a re-sharded one, added or removed samples and most rewritten
    shards apart; a sample replaced by one of the same size is not seen (nothing is hashed
    beyond the index files, so the cost is one stat per shard whatever the data's size).
    Moving the dataset keeps it.

    Returns:
        16 hex digits.
    """
    meta = os.path.join(path, ".nv-meta")
    with open(os.path.join(meta, ".info.json"), encoding="utf-8") as f:
        counts = json.load(f).get("shard_counts", {})
    digest = hashlib.sha256()
    split = os.path.join(meta, "split.yaml")
    if os.path.isfile(split):
        with open(split, "rb") as f:
            digest.update(f.read())
    for shard in sorted(counts):
        tar = os.path.join(path, shard)
        sizes = [os.path.getsize(p) if os.path.isfile(p) else -1 for p in (tar, tar + ".idx")]
        digest.update(f"\0{shard}\0{counts[shard]}\0{sizes[0]}\0{sizes[1]}".encode())
    return digest.hexdigest()[:16]


def stream_source(run, stream) -> StreamSource:
    """The source of a run (``megatron.mllm.run_config.RunConfig``) and its stream: an
    :class:`~megatron.mllm.data_energon.EnergonStream` with ``--data-path``, else the
    workload's ``SampleStream``."""
    if run.data is not None:
        path, num_samples, fingerprint, seed = stream.identity()
        return StreamSource(ENERGON, path, num_samples, fingerprint, seed, run.global_batch_size)
    w = run.workload
    seed = run.seed if w.workload_seed is None else w.workload_seed
    return StreamSource(WORKLOAD, w.workload, None, None, seed, run.global_batch_size)


def saved_state(source: StreamSource, iteration: int) -> dict[str, Any]:
    """What a checkpoint of ``iteration`` records of the stream (JSON, in its manifest)."""
    return {**dataclasses.asdict(source), "consumed_samples": iteration * source.global_batch_size}


def resume_problem(saved: dict[str, Any] | None, source: StreamSource, where: str) -> str | None:
    """Why a run with ``source`` cannot continue the stream of a checkpoint that recorded
    ``saved`` (None: nothing recorded, nothing to check), or None when it can.

    Args:
        saved: the checkpoint's :func:`saved_state`.
        source: this run's source.
        where: the checkpoint's directory, for the message.
    """
    if saved is None:
        return None
    kind = saved.get("kind")
    if kind != source.kind:
        flag = "--data-path" if ENERGON in (kind, source.kind) else "--workload"
        was = StreamSource(**{f.name: saved.get(f.name) for f in dataclasses.fields(StreamSource)})
        return (
            f"{flag}: {where} was trained on {was.describe()}; this run reads "
            f"{source.describe()}: resume on the source it was trained on"
        )
    if kind == ENERGON and (saved["num_samples"], saved["fingerprint"]) != (
        source.num_samples,
        source.fingerprint,
    ):
        return (
            f"--data-path {source.path}: not the dataset {where} was trained on: it was "
            f"{saved['path']} with {saved['num_samples']} samples (shards {saved['fingerprint']}), "
            f"this one has {source.num_samples} samples (shards {source.fingerprint}): resume on "
            "the saved dataset (its samples would otherwise be read in another order)"
        )
    if saved["seed"] != source.seed:
        return (
            f"{source.seed_flag} {source.seed}: {where} drew its sample order with "
            f"{source.seed_flag} {saved['seed']}: resume with {source.seed_flag} {saved['seed']}"
        )
    if saved["global_batch_size"] != source.global_batch_size:
        return (
            f"--global-batch-size {source.global_batch_size}: {where} consumed "
            f"{saved['consumed_samples']} samples in global batches of "
            f"{saved['global_batch_size']}; this run would skip or repeat samples: resume with "
            f"--global-batch-size {saved['global_batch_size']}"
        )
    return None

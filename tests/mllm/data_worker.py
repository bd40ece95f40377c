# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker of the real-data tests: train on Energon datasets, resume, meet bad data.

Usage: ``data_worker.py OUT_DIR [NAME] FLAGS... [--- NAME FLAGS...]``. Each configuration
trains with a fresh trainer in the same processes and writes ``OUT_DIR/NAME-rank{R}.json``
(the first one's ``NAME`` may be left out: ``train``): its record when it trains, or the error
it stopped with (``[type, message]``: bad data, a refused checkpoint). One launch for all.

A record holds the rank's ``dp_rank`` and ``pp_rank``, every dataset index this rank read
(``reads``) and, per iteration: the gathered sample ids (``ids``), this rank's own
``(stream index, id)`` pairs as loaded (``own``), the ids of every microbatch this rank packed
and ran, after any post-balancing (``trained``), the loss sum and its token count, and the loss.
"""

import json
import os
import sys

import torch.distributed as dist
from train_worker import fresh_trainer

from megatron.mllm import batch, checkpointing, pipeline, steps
from megatron.mllm.data import SequenceTooLongError
from megatron.mllm.steps import phase_balanced
from orchestration.workload import WorkloadError

PACKERS = (steps, phase_balanced, pipeline)
"""The modules whose ``build_microbatch`` packs what a step runs (megatron-core's engine, the
per-phase balanced LLM microbatches, the runtime's pipeline microbatches)."""

_packed: list[list[list[str]]] = []
"""Per iteration of the run in progress, the sample ids of each microbatch packed."""


def _configs(argv):
    groups, current = [], []
    for a in argv:
        if a == "---":
            groups.append(current)
            current = []
        else:
            current.append(a)
    groups.append(current)
    if not groups[0] or groups[0][0].startswith("--"):  # the first one is unnamed
        groups[0] = ["train", *groups[0]]
    return [(g[0], g[1:]) for g in groups]


def _record_packing() -> None:
    """Record the sample ids of every microbatch packed from now on in :data:`_packed`."""

    def recording(samples, *args, **kwargs):
        if _packed:
            _packed[-1].append([meta.sample_id for meta, _ in samples])
        return batch.build_microbatch(samples, *args, **kwargs)

    for module in PACKERS:
        module.build_microbatch = recording


def train(flags: list[str]) -> dict:
    """Train a fresh trainer of ``flags``; this rank's record."""
    trainer = fresh_trainer(flags)
    stream, reads = trainer.loader.stream, []
    _packed.clear()
    read, train_step = getattr(stream, "read", None), trainer.train_step

    def recording_read(index):
        reads.append(index)
        return read(index)

    def recording_step(iteration):
        _packed.append([])
        return train_step(iteration)

    trainer.train_step = recording_step
    if read is not None:  # one dataset (a blend reads through its datasets' streams)
        stream.read = recording_read
    try:
        results = trainer.train()
    finally:
        stream.close()
    return {
        "dp_rank": trainer.dp_rank,
        "pp_rank": trainer.pp_rank,
        "iterations": [
            {
                "ids": list(r.batch.metadata.sample_ids),
                "own": [[s.index, s.meta.sample_id] for s in r.batch.samples],
                "trained": mbs,
                "loss_sum": r.loss_sum,
                "loss_tokens": r.loss_tokens,
                "loss": r.loss,
            }
            for r, mbs in zip(results, _packed)
        ],
        "reads": reads,
    }


def main() -> None:
    out_dir = sys.argv[1]
    _record_packing()
    for name, flags in _configs(sys.argv[2:]):
        try:
            record = train(flags)
        except (WorkloadError, SequenceTooLongError, checkpointing.CheckpointError) as e:
            record = [type(e).__name__, str(e)]
        with open(os.path.join(out_dir, f"{name}-rank{dist.get_rank()}.json"), "w") as f:
            json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

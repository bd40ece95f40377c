# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker of the real-data test: train on an Energon dataset, then meet bad data.

Usage: ``data_worker.py OUT_DIR FLAGS... [--- NAME FLAGS...]``. The first configuration trains
and writes ``OUT_DIR/train-rank{R}.json``: per iteration the gathered sample ids, this rank's
own ``(stream index, id)`` pairs, the loss sum and its token count, and every dataset index this
rank read. Each further configuration ``NAME`` is a run expected to fail on bad data, or to
train: its error (type and message) or ``["trained", losses per token, sample ids per
iteration]`` goes to ``OUT_DIR/NAME-rank{R}.json``. One launch for all.
"""

import json
import os
import sys

import torch.distributed as dist
from train_worker import fresh_trainer

from megatron.mllm.data import SequenceTooLongError
from orchestration.workload import WorkloadError


def _configs(argv):
    groups, current = [], []
    for a in argv:
        if a == "---":
            groups.append(current)
            current = []
        else:
            current.append(a)
    groups.append(current)
    return groups[0], [(g[0], g[1:]) for g in groups[1:]]


def main() -> None:
    out_dir = sys.argv[1]
    train_flags, bad_runs = _configs(sys.argv[2:])
    rank = None
    trainer = fresh_trainer(train_flags)
    rank = dist.get_rank()
    stream, reads = trainer.loader.stream, []
    read = stream.read

    def recording_read(index):
        reads.append(index)
        return read(index)

    stream.read = recording_read
    results = trainer.train()
    record = {
        "iterations": [
            {
                "ids": list(r.batch.metadata.sample_ids),
                "own": [[s.index, s.meta.sample_id] for s in r.batch.samples],
                "loss_sum": r.loss_sum,
                "loss_tokens": r.loss_tokens,
            }
            for r in results
        ],
        "reads": reads,
    }
    with open(os.path.join(out_dir, f"train-rank{rank}.json"), "w") as f:
        json.dump(record, f)
    stream.close()
    del trainer
    for name, flags in bad_runs:
        try:
            trainer = fresh_trainer(flags)
            results = trainer.train()
            trainer.loader.stream.close()
            error = ["trained", [r.loss_sum / r.loss_tokens for r in results],
                     [list(r.batch.metadata.sample_ids) for r in results]]  # fmt: skip
        except (WorkloadError, SequenceTooLongError) as e:
            error = [type(e).__name__, str(e)]
        with open(os.path.join(out_dir, f"{name}-rank{rank}.json"), "w") as f:
            json.dump(error, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

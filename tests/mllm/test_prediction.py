# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The trainer's step prediction under megatron-core's engine with DP > 1: every replica."""

from __future__ import annotations

import dataclasses

import pytest

from megatron.mllm.config_files import load_run_config, set_flags
from megatron.mllm.prediction import StepInputs, StepPredictor, replica_microbatches
from orchestration.metadata import GatheredMetadata
from orchestration.packing import microbatch_indices
from orchestration.workload_spec import SampleStream
from pipeweaver.generators import generate
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import pack_microbatch, structure_of


def _dp2_run(workload: str = "obelics-interleaved"):
    loaded = load_run_config("cpu-main", set_flags({"workload": workload}), world_size=2)
    run = loaded.run
    stream = SampleStream(run.workload.workload, run.workload.workload_seed,
                          run.workload.workload_token_scale)  # fmt: skip
    m = run.global_batch_size // (run.micro_batch_size * 2)

    def rank_microbatches(iteration: int, rank: int):
        return [[(k, stream.meta(k)) for k in idx]
                for idx in microbatch_indices(iteration, rank, 2, run.micro_batch_size, m)]  # fmt: skip

    return loaded, rank_microbatches


def test_replicas_are_rebuilt_from_the_gathered_metadata_as_loaded():
    _, rank_microbatches = _dp2_run()
    ranks = [rank_microbatches(3, r) for r in range(2)]
    metadata = GatheredMetadata.from_rank_samples([[p for mb in mbs for p in mb] for mbs in ranks])
    own = [[meta for _, meta in mb] for mb in ranks[1]]
    replicas = replica_microbatches(metadata, own)
    # As loaded, but for the workload component each sample was drawn from (the metadata does
    # not carry it; only workload statistics read it).
    assert replicas == [
        [[dataclasses.replace(meta, component=None) for _, meta in mb] for mb in mbs]
        for mbs in ranks
    ]
    # One rank, or a rank holding another number of samples: no replicas (cut unknown).
    assert replica_microbatches(GatheredMetadata.from_rank_samples([ranks[1][0]]), own) is None
    short = GatheredMetadata.from_rank_samples([[p for mb in ranks[0] for p in mb][1:],
                                                [p for mb in ranks[1] for p in mb]])  # fmt: skip
    assert replica_microbatches(short, own) is None


def test_packed_replicas_are_each_ranks_samples_first_fit_decreasing():
    # --pack-sequences: every rank packed its own samples, so each replica is cut by its own
    # sizes, not as the predicting rank's microbatches are; SEMU's packed baseline forms the same.
    from pipeweaver.semu.packed_baseline import pack_first_fit_decreasing

    _, rank_microbatches = _dp2_run()
    ranks = [rank_microbatches(5, r) for r in range(2)]
    metadata = GatheredMetadata.from_rank_samples([[p for mb in mbs for p in mb] for mbs in ranks])
    limit = 160
    samples = [
        [dataclasses.replace(m, component=None) for mb in mbs for _, m in mb] for mbs in ranks
    ]
    own = pack_first_fit_decreasing(samples[1], limit)
    replicas = replica_microbatches(metadata, own, pack_limit=limit)
    assert replicas == [pack_first_fit_decreasing(s, limit) for s in samples]
    assert [len(r) for r in replicas] != [len(mbs) for mbs in ranks]  # the packing cut anew
    for replica in replicas:
        assert all(sum(m.llm_tokens for m in mb) <= limit for mb in replica)


def _predicted(predictor, rank_microbatches, iteration: int):
    """The last rank's prediction of ``iteration`` with every replica's metadata, and with its
    own replica alone; and both ranks' (stream index, metadata) microbatches."""
    ranks = [rank_microbatches(iteration, r) for r in range(2)]
    metadata = GatheredMetadata.from_rank_samples([[p for mb in mbs for p in mb] for mbs in ranks])
    own = [[meta for _, meta in mb] for mb in ranks[1]]
    got = predictor.predict_iteration(StepInputs(iteration + 1, own, None, None,
                                                 metadata=metadata))  # fmt: skip
    alone = predictor.predict_iteration(StepInputs(iteration + 1, own, None, None))
    return got, alone, ranks


@pytest.mark.parametrize("iteration", range(4))
def test_megatron_engine_prediction_is_the_step_of_every_replica(iteration):
    """The predicting rank (the last: replica 1) simulates both replicas: the step waits for
    the slower one, whose pipeline's ranks the prediction's tracks are; never shorter than
    this replica's own step."""
    loaded, rank_microbatches = _dp2_run()
    run, mllm = loaded.run, loaded.model
    predictor = StepPredictor(run, mllm, 2, None, dp_ranks=[0, 1], pp_ranks=[1])
    got, alone, ranks = _predicted(predictor, rank_microbatches, iteration)
    encoders = list(mllm.encoders)
    packed = [
        [pack_microbatch([meta for _, meta in mb], encoders, None, run.seq_length)
         for mb in mbs]
        for mbs in ranks
    ]  # fmt: skip
    placement = Placement.baseline(1, {m: mllm.num_layers(m) for m in (*encoders, "llm")})
    steps = [
        predictor.semu.simulate_step([generate("none", placement, structure_of(mbs, encoders))],
                                     [mbs]).step_time_s
        for mbs in packed
    ]  # fmt: skip
    both = predictor.semu.simulate_step(
        [generate("none", placement, structure_of(mbs, encoders)) for mbs in packed], packed
    )
    assert got.step_s == pytest.approx(both.step_time_s, rel=1e-12)
    assert alone.step_s == pytest.approx(steps[1], rel=1e-12)
    assert got.step_s >= max(steps) - 1e-12 and got.step_s >= alone.step_s
    assert got.ranks == [both.critical_replica] and alone.ranks == [1]


def test_the_other_replica_sets_the_step_in_some_iterations():
    """What the test above covers: on obelics (a few images or dozens per sample), replica 0
    is the slower one in some of those iterations, and then the step is longer than this
    replica's own."""
    loaded, rank_microbatches = _dp2_run()
    predictor = StepPredictor(loaded.run, loaded.model, 2, None, dp_ranks=[0, 1], pp_ranks=[1])
    longer = 0
    for iteration in range(4):
        got, alone, _ = _predicted(predictor, rank_microbatches, iteration)
        longer += got.ranks == [0] and got.step_s > alone.step_s
    assert longer >= 1

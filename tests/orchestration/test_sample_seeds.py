# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The block-seeded sample generators equal numpy's own seeding of ``[seed, index]``."""

import pickle
import threading

import numpy as np
import pytest

from orchestration.sample_seeds import BLOCK, SeedBlocks, pcg64_states


def numpy_rng(seed: int, index: int) -> np.random.Generator:
    """The oracle: numpy's SeedSequence and PCG64 seeding of the two words."""
    return np.random.default_rng(np.array([seed, index], dtype=np.uint32))


@pytest.mark.parametrize("seed", [0, 1, 7, 123_456, 2**31, 2**32 - 1])
def test_states_equal_numpy_seeding(seed):
    indices = [0, 1, 2, BLOCK - 1, BLOCK, BLOCK + 1, 99_991, 2**31, 2**32 - 1]
    states = pcg64_states(seed, np.array(indices))
    for index, (state, inc) in zip(indices, states):
        want = numpy_rng(seed, index).bit_generator.state["state"]
        assert (state, inc) == (want["state"], want["inc"]), (seed, index)


def test_generators_draw_numpy_streams_in_any_order():
    blocks = SeedBlocks(42)
    rs = np.random.RandomState(0)
    indices = [int(k) for k in rs.randint(0, 5 * BLOCK, size=200)] + [2**32 - 1, 2**32 - 2]
    for index in indices:
        got, want = blocks.generator(index), numpy_rng(42, index)
        # Every kind of draw the workload specs use, in one sample's order.
        assert got.random() == want.random()
        assert got.integers(3, 900, endpoint=True) == want.integers(3, 900, endpoint=True)
        assert got.standard_normal() == want.standard_normal()
        assert got.choice(5) == want.choice(5)


def test_blocks_are_bounded_and_remade():
    blocks = SeedBlocks(3)
    for b in range(80):
        blocks.generator(b * BLOCK)
    assert len(blocks._blocks) <= 64
    assert blocks.generator(0).random() == numpy_rng(3, 0).random()


def test_each_thread_has_its_own_generator():
    blocks = SeedBlocks(5)
    mine = blocks.generator(10)
    seen = []
    t = threading.Thread(target=lambda: seen.append(blocks.generator(11)))
    t.start()
    t.join(timeout=30)
    assert seen and seen[0] is not mine
    # The other thread's seeding left this thread's generator where it was.
    assert mine.random() == numpy_rng(5, 10).random()


def test_pickles_as_its_seed():
    blocks = SeedBlocks(9)
    blocks.generator(1)
    copy = pickle.loads(pickle.dumps(blocks))
    assert copy.seed == 9 and not copy._blocks
    assert copy.generator(1).random() == numpy_rng(9, 1).random()


def test_seed_must_be_a_word():
    with pytest.raises(ValueError, match="32-bit"):
        SeedBlocks(2**32)

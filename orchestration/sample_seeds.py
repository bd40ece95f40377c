# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The per-sample random generators of a generated stream, seeded a block of samples at a time.

Sample ``k`` of a stream with seed ``s`` draws from ``numpy.random.default_rng`` seeded with the
two 32-bit words ``[s, k]``: a ``SeedSequence`` hashes them into a 4-word pool and expands the
pool into the 128-bit state and increment of a ``PCG64``. numpy does this in Python-level loops,
about 14 us per generator on our hosts, half of drawing a sample; a simulated 84B step
at DP 320 draws 10^5 samples to replay its cost fits. :class:`SeedBlocks` computes the same
states for 1,024 consecutive indices at once with numpy array arithmetic and sets one reusable
generator to each (about 4 us), so a stream's numbers are bit-identical to ``default_rng``'s.

The hashing is the ``SeedSequence`` of numpy's documentation (after M. O'Neill's
``seed_seq_fe``), the state setup PCG64's ``pcg_setseq_128_srandom_r``; see
docs/architecture.md (facts and their sources).
"""

from __future__ import annotations

import threading

import numpy as np

BLOCK = 1024
"""Indices seeded together (a global batch of the main job is 16; of the 84B model 10,240)."""

MAX_BLOCKS = 64
"""Blocks kept; all are dropped past this (a stream is read forward, and re-seeding is cheap)."""

_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_M128 = (1 << 128) - 1


def _hash_consts(first: int, mult: int, count: int) -> list[int]:
    """The hash multiplier a SeedSequence uses at each of its ``count`` hash steps: it is
    multiplied before every use and never depends on the data, so it is a constant list."""
    out, h = [], first
    for _ in range(count):
        out.append(h)
        h = (h * mult) & _M32
    return out


# Pool of 4 words: 4 entropy hashes, then 12 mixing hashes (each word into each other word).
_A = _hash_consts(_INIT_A, _MULT_A, 17)
# 4 x 64-bit output words: 8 hashes of the pool, cycled.
_B = _hash_consts(_INIT_B, _MULT_B, 9)


def _hashmix(values: np.ndarray, step: int) -> np.ndarray:
    """SeedSequence's ``hashmix`` at hash step ``step`` on uint64 arrays holding 32-bit words."""
    v = ((values ^ _A[step]) * _A[step + 1]) & _M32
    return v ^ (v >> 16)


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = (_MIX_L * x - _MIX_R * y) & _M32
    return r ^ (r >> 16)


def pcg64_states(seed: int, indices: np.ndarray) -> list[tuple[int, int]]:
    """``(state, inc)`` of ``PCG64(SeedSequence([seed, k]))`` for every ``k`` in ``indices``.

    Args:
        seed: the stream's seed, ``0 <= seed < 2**32``.
        indices: sample indices, each ``0 <= k < 2**32``.
    """
    # Integer arrays wrap silently: uint64 holds each 32-bit product whole, masked after.
    words = [np.full(indices.shape, seed, dtype=np.uint64), indices.astype(np.uint64)]
    zero = np.zeros(indices.shape, dtype=np.uint64)
    pool = [_hashmix(words[i] if i < 2 else zero, i) for i in range(4)]
    step = 4
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = _mix(pool[dst], _hashmix(pool[src], step))
                step += 1
    out = []
    for i in range(8):
        v = ((pool[i % 4] ^ _B[i]) * _B[i + 1]) & _M32
        out.append(v ^ (v >> 16))
    # Little-endian pairs of 32-bit words make the 64-bit words; two of those a 128-bit number.
    u = [(out[2 * j] | (out[2 * j + 1] << 32)).tolist() for j in range(4)]
    states = []
    for u0, u1, u2, u3 in zip(*u):
        initstate, inc = (u0 << 64) | u1, ((((u2 << 64) | u3) << 1) | 1) & _M128
        # srandom_r: state 0, one step (0 * mult + inc), add the seed, one more step.
        states.append(((((inc + initstate) & _M128) * _PCG_MULT + inc) & _M128, inc))
    return states


class SeedBlocks:
    """Generators for the samples of one seed's stream, equal to
    ``np.random.default_rng(np.array([seed, k], dtype=np.uint32))``.

    The returned generator is reused: a thread gets the same object back for its next index,
    so one sample's draws must be done before the next is asked for. Each thread has its own.
    """

    def __init__(self, seed: int):
        if not 0 <= seed <= _M32:
            raise ValueError(f"seed must be a 32-bit word, got {seed}")
        self.seed = seed
        self._blocks: dict[int, list[tuple[int, int]]] = {}
        self._local = threading.local()

    def __getstate__(self) -> dict:
        # A copy for another process (a decode worker) travels as its seed: the thread-local
        # generators cannot be pickled, and the blocks are remade on demand.
        return {"seed": self.seed}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["seed"])

    def generator(self, index: int) -> np.random.Generator:
        """Sample ``index``'s generator, at the start of its stream (``0 <= index < 2**32``)."""
        block, offset = divmod(index, BLOCK)
        states = self._blocks.get(block)
        if states is None:
            if len(self._blocks) >= MAX_BLOCKS:
                self._blocks = {}
            start = block * BLOCK
            stop = min(start + BLOCK, _M32 + 1)
            states = self._blocks[block] = pcg64_states(self.seed, np.arange(start, stop))
        state, inc = states[offset]
        local = self._local
        try:
            bit_generator, generator = local.pair
        except AttributeError:
            bit_generator = np.random.PCG64(0)
            generator = np.random.Generator(bit_generator)
            local.pair = bit_generator, generator
        bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": state, "inc": inc},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return generator

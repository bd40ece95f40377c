# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Spatial-temporal subgraph reuse: costed subgraphs and timelines computed once, used often.

PipeWeaver's SEMU is "accelerated by spatial-temporal subgraph reuse" (the paper's abstract; the
paper does not describe the mechanism). OrchWeave's version caches three
levels, each keyed by everything its result depends on, so a hit returns exactly what a miss
would compute (tests check that results are identical with and without reuse):

1. **subgraph**: one compute's cost (time, kept and transient memory), keyed by the chunk's
   *shape* — module, number of layers, whether it holds the input layer or the head, F/B,
   memory strategy, the sorted sequence lengths and output rows — not by its position. Equal
   chunks on different ranks (spatial: every middle LLM chunk), on different DP replicas, and
   the same shapes in later microbatches, rollouts and iterations (temporal) share one entry;
2. **graph** and **microbatch**: the data-flow graph of one (placement, microbatch structure)
   (which inputs of each compute are remote, which consumers it sends to), and all compute costs,
   transfer times and compiled simulator ops of one microbatch under one placement (the
   per-microbatch latency vectors DIP's planner computes first); evaluating many orders of
   the same microbatches (``tools/bench/semu_speed.py``) hits it;
3. **timeline**: the whole pipeline simulation of one (schedule, microbatches, start offsets,
   link layout); identical DP replicas and re-evaluated rollouts hit it.

One :class:`ReuseCache` can be shared by many simulator instances of the same cost model
(the keys include the cost model's fingerprint, so sharing across cost models is safe too).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator


@dataclass
class ReuseCache:
    """The three reuse levels, with hit counters."""

    max_entries: int = 200_000
    """Per level; a level is cleared when it grows past this (simple, bounded memory)."""

    levels: dict[str, dict] = field(
        default_factory=lambda: {"subgraph": {}, "graph": {}, "microbatch": {}, "timeline": {}}
    )
    """level -> key -> value."""

    hits: Counter = field(default_factory=Counter)
    """Hits per level."""

    misses: Counter = field(default_factory=Counter)
    """Misses per level."""

    def __getstate__(self) -> dict:
        # A copy for another process (the schedule search's workers unpickle a Semu) travels
        # empty: the entries can be many, and are recomputed there.
        return dict(vars(ReuseCache(self.max_entries)))

    def get(self, level: str, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The cached value of ``key`` at ``level``, computing and storing it on a miss."""
        table = self.levels[level]
        try:
            value = table[key]
        except KeyError:
            self.misses[level] += 1
            if len(table) >= self.max_entries:
                table.clear()
            value = table[key] = compute()
            return value
        self.hits[level] += 1
        return value

    def hit_rate(self, level: str | None = None) -> float:
        """Hits over lookups, for one level or all."""
        if level is None:
            h, m = sum(self.hits.values()), sum(self.misses.values())
        else:
            h, m = self.hits[level], self.misses[level]
        return h / (h + m) if h + m else 0.0

    def stats(self) -> dict[str, dict[str, float]]:
        """Per level: hits, misses, hit rate, entries."""
        return {
            level: {
                "hits": self.hits[level],
                "misses": self.misses[level],
                "hit_rate": self.hit_rate(level),
                "entries": len(table),
            }
            for level, table in self.levels.items()
        }

    def reset_counters(self) -> None:
        """Zero the hit counters (keeps the entries)."""
        self.hits.clear()
        self.misses.clear()


_PAUSE_LOCK = threading.Lock()
_pauses = [0, False]
"""Blocks inside :func:`collector_paused` now, and whether the collector was on before the
first of them: the trainer may simulate on a search thread while another thread does too."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (back on after it, if it was on).

    Building and simulating a step makes millions of small acyclic objects (actions, op
    tuples, events), which reference counting frees; each collection the allocations trigger
    scans every live one again, about a tenth of a 2,560-GPU step. Results do not change.
    The switch is process-wide, so blocks on several threads count: the collector comes back
    when the last one ends, never while another still runs.
    """
    with _PAUSE_LOCK:
        if _pauses[0] == 0:
            _pauses[1] = gc.isenabled()
            gc.disable()
        _pauses[0] += 1
    try:
        yield
    finally:
        with _PAUSE_LOCK:
            _pauses[0] -= 1
            if _pauses[0] == 0 and _pauses[1]:
                gc.enable()

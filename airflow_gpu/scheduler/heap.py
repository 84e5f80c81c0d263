"""The scheduler's heap and Python's cyclic garbage collector.

The cache holds tens of thousands of pods as wire-format dicts: millions of long-lived objects, freed
by reference counting when a watch event replaces them (they hold no cycles). CPython still walks
all of them in each full collection, which a steady churn of pod events sets off every few seconds:
at 40,000 pods half a second with every thread stopped, in whichever cycle it lands (every other
cycle in the in-process measurement). After each cycle the young generations are collected and
what survives is frozen out of the collector's sight (gc.freeze: a list splice, no walk); every
FULL_EVERY seconds the frozen objects are handed back and collected once, so a reference cycle
that outlived its cycle is freed within that time.
"""

from __future__ import annotations

import gc
import time

FULL_EVERY = 600.0


class Heap:
    def __init__(self, full_every: float = FULL_EVERY):
        self.full_every = full_every
        self._full_at = time.monotonic()

    def after_cycle(self) -> None:
        now = time.monotonic()
        if now - self._full_at >= self.full_every:
            self._full_at = now
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)
        gc.freeze()

    def close(self) -> None:
        """Hand every frozen object back to the collector (the scheduler is stopping)."""
        gc.unfreeze()

"""The scheduler's heap (scheduler/heap.py): after each cycle the survivors are frozen out of the
cyclic collector's sight, and a reference cycle that outlived its cycle is freed at the next full
collection (every full_every seconds)."""

from __future__ import annotations

import gc
import weakref

from airflow_gpu.scheduler.heap import Heap


class _Cyclic:
    def __init__(self):
        self.me = self


def test_survivors_are_frozen_and_a_reference_cycle_is_freed_at_the_next_full_collection():
    heap = Heap(full_every=3600)
    try:
        obj = _Cyclic()
        ref = weakref.ref(obj)
        heap.after_cycle()
        assert gc.get_freeze_count() > 0
        del obj
        gc.collect()  # a full collection does not see frozen objects: the cycle survives it
        assert ref() is not None
        heap.after_cycle()
        assert ref() is not None  # not yet time for the full collection
        heap.full_every = 0
        heap.after_cycle()
        assert ref() is None
    finally:
        heap.close()
    assert gc.get_freeze_count() == 0

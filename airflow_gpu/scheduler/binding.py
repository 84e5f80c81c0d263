"""The binding cycle, off the scheduling cycle (kube-scheduler's split in schedule_one.go: a pod is
assumed in the cache when decided and bound in a goroutine; a failed binding forgets it).

The scheduling cycle assumes an admitted gang's placements in the ClusterCache and hands its writes
(plan record, Bindings, plan closed) to `Writes.bind`; the next cycle starts without waiting for
them. While a gang is binding, its members count as bound in every cycle's
World (capacity held, the gang not decided again) and its plan record belongs to the binding, not
to the cycle (`set_aside`): no cycle completes, rolls back or preempts it meanwhile. When the binding
ends the pods it did not bind are forgotten, so the next cycle sees them pending and completes or
rolls back the plan as after a crash.

The cycle's other per-gang writes (wait reason, PodGroup status) go off the cycle too (`Writes.write`),
and so does telling the owner a gang is bound (annotations, Event: the binding's last writes, which
need not hold its slot): the latest value per gang and kind wins (one queued at a time), one runs at
a time per gang (`_ordered`), and starting a binding drops the gang's queued writes (decided before it
was admitted). So a late "waiting" never overwrites "bound": queued when the binding starts, it is
dropped; being written, the bound annotations wait for it; and no gang binding gets a new one.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from airflow_gpu.scheduler.state import World

log = logging.getLogger(__name__)

# Gangs binding at once, each its Bindings in parallel on the bind pool (whose size bounds the
# Bindings in flight). A binding holds its worker for three round trips (plan record, Bindings, plan
# closed); more workers than the bind pool can serve only lengthen each gang's binding.
GANG_WORKERS = 8
# Gangs binding or queued to bind, at most: seconds of a hundred gangs a second arriving, and more than
# the Bindings the pool sends during one cycle at 5,000 nodes (a cycle admits no more than this room:
# smaller, a fill of 40,000 pods took 3x the cycles and a third of the bindings/s). Bounded because each holds
# capacity the API server has not confirmed: unbounded, decisions would run ever further ahead of a
# slow API server (every failure forgotten and decided again) and pile writes onto the server that
# also answers the Lease renewal. Full, a cycle admits no more gangs (they stay pending for the next
# cycle, which decides them again): a slow API server slows admissions instead of growing a backlog,
# and the cycle never waits for a binding (kube-scheduler's scheduling cycle does not either).
MAX_BINDING = 128 * GANG_WORKERS
STRIPES = 64  # per-gang ordering locks, striped: bounded memory, short holds


class Writes:
    """Per-gang writes off the scheduling cycle: bindings (bounded, counted per gang while in flight)
    on one pool; wait reasons, status and the bound annotations (latest wins per gang and kind) on
    another, so a binding never queues behind a churning cycle's status writes."""

    def __init__(self, write_workers: int, gang_workers: int = GANG_WORKERS, max_binding: int = MAX_BINDING):
        self._bind_pool = ThreadPoolExecutor(max_workers=gang_workers, thread_name_prefix="gang")
        self._write_pool = ThreadPoolExecutor(max_workers=write_workers, thread_name_prefix="write")
        self.max_binding = max_binding
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a binding ended: room for another
        self._binding: Counter[str] = Counter()  # gang key -> bindings in flight
        self._queued: dict[str, dict[str, tuple[int, object]]] = {}  # gang key -> kind -> (token, value)
        self._tokens = itertools.count()
        self._stripes = [threading.Lock() for _ in range(STRIPES)]

    # --- bindings ---------------------------------------------------------------------------
    def bind(self, key: str, work: Callable[[], object]) -> None:
        """Run `work` (a gang's binding) off the cycle; waits while MAX_BINDING are in flight (a cycle
        admits no more than `room()`, so only a plan's completion may wait). The gang's queued wait
        reason and status are dropped: they were decided before it was admitted."""
        with self._freed:
            self._freed.wait_for(lambda: self._room_locked() > 0)
            self._binding[key] += 1
            self._queued.pop(key, None)
        try:
            self._bind_pool.submit(self._run_binding, key, work)
        except RuntimeError:  # shut down: nothing runs
            self._done(key)
            raise

    def _run_binding(self, key: str, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception:  # noqa: BLE001 - one gang's failure must not stop the others
            log.exception("gang %s: binding failed", key)
        finally:
            self._done(key)

    def _done(self, key: str) -> None:
        with self._lock:
            self._binding[key] -= 1
            if self._binding[key] <= 0:
                del self._binding[key]
            self._freed.notify_all()

    def binding(self) -> frozenset[str]:
        """The gangs whose binding is in flight (queued or running)."""
        with self._lock:
            return frozenset(self._binding)

    def room(self) -> int:
        """How many more gangs may start binding now."""
        with self._lock:
            return self._room_locked()

    def _room_locked(self) -> int:
        return max(0, self.max_binding - sum(self._binding.values()))

    def wait_room(self, gangs: int, timeout: float) -> bool:
        """Wait (at most `timeout` s) until `gangs` more may start binding."""
        with self._freed:
            return self._freed.wait_for(lambda: self._room_locked() >= gangs, timeout)

    def settled(self) -> bool:
        """No binding in flight and no write queued or running."""
        with self._lock:
            return not self._binding and not self._queued

    def queued(self) -> int:
        """Writes (not bindings) queued or running."""
        with self._lock:
            return sum(len(lane) for lane in self._queued.values())

    def is_binding(self, key: str) -> bool:
        with self._lock:
            return key in self._binding

    # --- wait reasons and status --------------------------------------------------------------
    def write(self, kind: str, key: str, value: object, work: Callable[[], object]) -> None:
        """Run `work` (write `value` as the gang's `kind`) off the cycle, unless the same value is
        queued already; a newer value queued before it runs replaces it."""
        with self._lock:
            lane = self._queued.setdefault(key, {})
            if kind in lane and lane[kind][1] == value:
                return
            token = next(self._tokens)
            lane[kind] = (token, value)
        self._write_pool.submit(self._run_write, kind, key, token, work)

    def _run_write(self, kind: str, key: str, token: int, work: Callable[[], object]) -> None:
        with self._ordered(key):
            with self._lock:
                if self._queued.get(key, {}).get(kind, (None,))[0] != token:
                    return  # replaced by a newer value, or a binding started since
            try:
                work()
            except Exception:  # noqa: BLE001 - a status write is retried by the next cycle
                log.exception("gang %s: %s not written", key, kind)
            finally:
                with self._lock:
                    lane = self._queued.get(key)
                    if lane and lane.get(kind, (None,))[0] == token:
                        del lane[kind]
                        if not lane:
                            del self._queued[key]

    def _ordered(self, key: str) -> threading.Lock:
        """The gang's lock, held by each of its writes while it runs."""
        return self._stripes[hash(key) % STRIPES]

    def shutdown(self) -> None:
        """Wait for every binding in flight (a gang's Bindings are never cut in half), then the writes."""
        self._bind_pool.shutdown(wait=True)
        self._write_pool.shutdown(wait=True)


def set_aside(world: World, binding: frozenset[str]) -> None:
    """Plans of gangs whose binding is in flight belong to that binding: this cycle neither completes,
    rolls back nor drops them (their members are assumed bound, so they hold their capacity without
    the plan), and their gangs are no preemption victims until the binding is over."""
    if not binding:
        return
    world.plans = {k: p for k, p in world.plans.items() if k not in binding}
    world.plan_ready = {k: r for k, r in world.plan_ready.items() if k not in binding}
    world.rejected_plans = [r for r in world.rejected_plans if r[0].key not in binding]
    if world.state is not None:  # as build_world sets aside the victims of a closing nomination
        world.state.running = [rg for rg in world.state.running if rg.gang.name not in binding]

"""The head of line's reservation (EASY backfilling): where and when the first gang that does not
fit could start if nothing else were admitted (estimate_start), that estimate kept across cycles
while the nodes it reads are unchanged (StartMemo), and the bound on reservations of unknown start
(ReservationHold). What the cycle decides with; the estimates it publishes for every waiting gang
are core.estimate's."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from airflow_gpu.constants import DEFAULT_RESERVATION_HOLD_SECONDS
from airflow_gpu.core.framework import Profile, static_mask
from airflow_gpu.core.gang import place_gang
from airflow_gpu.core.model import Gang, Placement, RunningGang
from airflow_gpu.core.room import RoomEstimate
from airflow_gpu.core.snapshot import Snapshot

if TYPE_CHECKING:
    from airflow_gpu.core.queue import CycleResult


@dataclass(frozen=True)
class Reservation:
    """Nodes held for the head-of-line gang until `start` (its estimated earliest start; math.inf when
    it waits on gangs of unknown duration; now when victims are being preempted for it)."""

    gang: Gang
    nodes: frozenset[str]
    start: float
    placements: tuple[Placement, ...]
    by_preemption: bool = False

    def mask(self, snap: Snapshot) -> np.ndarray:
        return node_mask(snap, self.nodes)

    def lets_through(self, gang: Gang, now: float) -> bool:
        """A gang known to finish before the head can start may use the reserved nodes."""
        return gang.expected_duration is not None and now + gang.expected_duration <= self.start


def node_mask(snap: Snapshot, names: Iterable[str]) -> np.ndarray:
    """[N] bool: the nodes named."""
    m = np.zeros(len(snap), dtype=bool)
    m[[snap.node_index(n) for n in names]] = True
    return m


class StartMemo:
    """The last earliest-start estimate of each head of line, kept while the nodes it may use
    (its pod sets' static filters) are unchanged. Snapshot versions equal means equal node state
    with the same pods, and estimate_start reads only those nodes and the gangs on them, released
    in the same order: a cycle in which only other nodes changed (work on another GPU product or
    capacity type) gets the same answer without a placement. The clock moves only the start: the
    release order (by expected end) and so the placement do not depend on it, and the start is the
    releasing gang's expected end or now, whichever is later (kept as the start found, which is one
    of the two: later it is that end or the later clock). A running gang's declared duration
    changed with no change to its pods (an edited annotation) is seen at the next change on those
    nodes."""

    KEEP = 64  # heads remembered (the head of line rarely changes)

    def __init__(self) -> None:
        self._last: dict[str, tuple[Profile, bytes, Reservation | None]] = {}

    @staticmethod
    def _key(snap: Snapshot, gang: Gang, profile: Profile) -> bytes:
        usable = np.zeros(len(snap), dtype=bool)
        for ps in gang.pod_sets:
            usable |= static_mask(snap, ps.request, profile.filters)
        return snap.version[usable].tobytes()

    def estimate(self, snap: Snapshot, gang: Gang, running: Sequence[RunningGang], profile: Profile,
                 now: float) -> Reservation | None:
        """estimate_start, or the same answer kept from an earlier cycle."""
        key = self._key(snap, gang, profile)
        hit = self._last.get(gang.name)
        if hit is not None and hit[0] is profile and hit[1] == key and (hit[2] is None or hit[2].gang == gang):
            kept = hit[2]
            return kept if kept is None or kept.start >= now else replace(kept, start=now)
        est = estimate_start(snap, gang, running, profile, now)
        self._last.pop(gang.name, None)
        if len(self._last) >= self.KEEP:
            self._last.pop(next(iter(self._last)))
        self._last[gang.name] = (profile, key, est)
        return est


@dataclass
class ReservationHold:
    """Bounded hold: a reservation whose start cannot be estimated (it waits on work of unknown
    duration) keeps its nodes' free GPUs idle against every gang the head cannot take back. It may
    do so for `max_hold` seconds in a row; then the gang holds no reservation for `pause` seconds
    (it is still admitted whenever it fits, and the next gang may hold one), then it may again.
    Without it a head of line that waits on long work idles its nodes for as long as that work
    runs while smaller work of its own priority queues behind it. Pure bookkeeping; the caller
    passes the clock and calls `record` after each cycle."""

    max_hold: float = DEFAULT_RESERVATION_HOLD_SECONDS
    pause: float = DEFAULT_RESERVATION_HOLD_SECONDS
    since: dict[str, float] = field(default_factory=dict)  # gang -> start of its current hold
    paused_until: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_hold <= 0 or self.pause < 0:
            raise ValueError(f"reservation hold: max_hold ({self.max_hold}) must be > 0 and pause ({self.pause}) >= 0")

    def may_reserve(self, name: str, now: float) -> bool:
        return now >= self.paused_until.get(name, -math.inf)

    def why(self, name: str, now: float) -> str:
        return (f"no reservation: it held one {self.max_hold:.0f} s without a known start; "
                f"it may again in ~{max(0.0, self.paused_until[name] - now):.0f} s")

    def record(self, result: CycleResult, now: float) -> None:
        res = result.reservation
        holder = res.gang.name if res is not None and not res.by_preemption and math.isinf(res.start) else None
        for name in [n for n in self.since if n != holder]:
            del self.since[name]  # a hold counts only while it lasts without a break
        if holder is not None:
            since = self.since.setdefault(holder, now)
            if now - since >= self.max_hold:
                del self.since[holder]
                self.paused_until[holder] = now + self.pause
        for name in [n for n, t in self.paused_until.items() if t <= now]:
            del self.paused_until[name]


def estimate_start(snap: Snapshot, gang: Gang, running: Sequence[RunningGang], profile: Profile,
                   now: float) -> Reservation | None:
    """When and where `gang`, which does not fit now, could start if nothing else were admitted:
    running gangs are released by expected end on a copy until it fits. None: it would not fit even
    with all of them gone. (A gang that fits now needs no estimate; releases that add no room for
    it are skipped, so for such a gang the answer is not "now".)

    A room estimate kept up to date per release (core.room.RoomTracker) says when a full
    placement is worth trying, so the whole release order costs about one pass over the pods."""
    ends = sorted(running, key=lambda r: (math.inf if r.expected_end is None else r.expected_end,
                                          r.started_at, r.gang.name))
    work = snap.copy()
    tracker = RoomEstimate.for_gang(snap, gang, profile).tracker(work)
    for r in ends:
        if not tracker.release(r):
            continue
        placed, _, _ = place_gang(work, gang, profile)
        if placed is not None:
            last = r.expected_end
            start = math.inf if last is None else max(now, last)
            return Reservation(gang, frozenset(p.node for p in placed), start, placed)
    return None

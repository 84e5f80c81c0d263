"""Estimated starts as the scheduler publishes them: every waiting gang's (estimate_starts:
conservative backfilling on the cycle's own profile, quota book and the head's reservation, which
core.reservation makes), with run lengths and lateness learned from the gangs that ran
(RunLengths, StartCalibration)."""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.gang import admit
from airflow_gpu.core.model import GPU_MILLI, Gang, Placement, RunningGang
from airflow_gpu.core.quota import Demand
from airflow_gpu.core.reservation import node_mask
from airflow_gpu.core.room import RoomEstimate
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.topology import members_per_node

if TYPE_CHECKING:
    from airflow_gpu.core.queue import CycleResult


class RunLengths:
    """How long gangs run, learned from the ones that left (finished, failed, preempted or
    interrupted: whatever frees their GPUs), per team and tier: the run length of a gang without a
    declared duration, for the estimated starts (estimate_starts). The scheduler feeds it the
    running gangs of every cycle (observe); the replay the same runs as they end (record).

    A running gang of age a is expected to run the median of the learned runs longer than a, minus
    a (so a long runner is not expected to end at once); one older than every learned run, as long
    again as it ran (the median remaining life of a heavy tail). The runs of its team and tier when
    there are MIN_RUNS of them, else of its tier, else of all; fewer than MIN_RUNS in all: unknown.
    The last KEEP runs of each team and tier are kept (the workload drifts)."""

    KEEP = 256
    MIN_RUNS = 5
    QUANTILE = 0.5

    def __init__(self) -> None:
        self._sorted: dict[tuple[str | None, str | None], list[float]] = {}
        self._order: dict[tuple[str | None, str | None], deque[float]] = {}
        self._seen: dict[str, tuple[str, str, float]] = {}  # running at the last observe: name -> (team, tier, since)

    def record(self, team: str, tier: str, seconds: float) -> None:
        """A gang of `team` and `tier` ran `seconds`, then left."""
        for key in ((team, tier), (None, tier), (None, None)):
            runs, order = self._sorted.setdefault(key, []), self._order.setdefault(key, deque())
            keep = self.KEEP if key[0] is not None else 4 * self.KEEP
            if len(order) >= keep:
                runs.pop(bisect.bisect_left(runs, order.popleft()))
            order.append(seconds)
            bisect.insort(runs, seconds)

    def observe(self, running: Iterable[RunningGang], now: float, changed: Iterable[str] | None = None,
                by_name: Mapping[str, RunningGang] | None = None) -> None:
        """The gangs running now; those running at the last call and gone (or restarted) since ran
        from their start until now. `changed` (with `by_name`, the running gangs by name): the only
        names that may have started, left or restarted since the last call (a caller that keeps
        its running gangs by deltas); None: any. The runs are recorded in name order (the oldest
        of KEEP runs go first)."""
        if changed is None or by_name is None:
            by_name = {r.gang.name: r for r in running}
            changed = self._seen.keys() | by_name.keys()
        for name in sorted(changed):
            r, seen = by_name.get(name), self._seen.get(name)
            if seen is not None and (r is None or r.started_at != seen[2]):
                self.record(seen[0], seen[1], max(0.0, now - seen[2]))
            if r is None:
                self._seen.pop(name, None)
            else:
                self._seen[name] = (r.gang.team, r.gang.tier, r.started_at)

    def _runs(self, team: str, tier: str) -> list[float] | None:
        for key in ((team, tier), (None, tier), (None, None)):
            runs = self._sorted.get(key)
            if runs is not None and len(runs) >= self.MIN_RUNS:
                return runs
        return None

    def remaining(self, team: str, tier: str, age: float) -> float | None:
        """Seconds a gang that has run `age` seconds is expected to run on (None: not known)."""
        runs = self._runs(team, tier)
        if runs is None:
            return None
        i = bisect.bisect_right(runs, age)
        if i == len(runs):
            return age
        return runs[i + int((len(runs) - i) * self.QUANTILE)] - age

    def __len__(self) -> int:
        return len(self._sorted.get((None, None), ()))


class StartCalibration:
    """How much later than first estimated gangs of a tier really started, learned online: the
    conservative estimate counts the work running and waiting now, not the work of higher priority
    that arrives while the gang waits and goes ahead of it, so a long predicted wait is too short by
    a factor that grows with the load of the tiers above. For each gang its first raw estimate
    (first_seen) is compared with its real start (started): the ratio real wait / predicted wait,
    per tier and band of the predicted wait (BANDS); an estimate of that tier and band is then
    stretched by the median ratio (RunLengths' fallbacks: the tier's when its band has fewer than
    MIN_RUNS, none with fewer in all). Waits predicted shorter than BANDS[0] are not learned nor
    stretched (a start that close is what the running work decides)."""

    BANDS = (300.0, 3600.0, 4 * 3600.0, 16 * 3600.0)  # predicted wait bands (lower bounds, seconds)
    KEEP = 256
    MIN_RUNS = 5

    def __init__(self) -> None:
        self._first: dict[str, tuple[str, float, float]] = {}  # gang -> (tier, at, predicted wait)
        self._ratios: dict[tuple[str, int | None], deque[float]] = {}

    def _band(self, wait: float) -> int | None:
        return None if wait < self.BANDS[0] else bisect.bisect_right(self.BANDS, wait) - 1

    def first_seen(self, gang: Gang, start: float | None, now: float) -> None:
        """A waiting gang's raw estimate (None: unknown) at `now`; only the first known one counts."""
        if start is not None and gang.name not in self._first:
            self._first[gang.name] = (gang.tier, now, start - now)

    def started(self, name: str, now: float) -> None:
        hit = self._first.pop(name, None)
        if hit is None:
            return
        tier, at, predicted = hit
        band = self._band(predicted)
        if band is None:
            return
        ratio = (now - at) / predicted
        for key in ((tier, band), (tier, None)):
            ratios = self._ratios.setdefault(key, deque(maxlen=self.KEEP))
            ratios.append(ratio)

    def observe(self, running: Mapping[str, RunningGang], now: float) -> None:
        """started() for every gang of `running` (by name) that is waited for here."""
        for name in [n for n in self._first if n in running]:
            self.started(name, running[name].started_at or now)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the first estimates of gangs no longer waiting nor known (deleted before they started)."""
        keep = set(keep)
        for name in [n for n in self._first if n not in keep]:
            del self._first[name]

    def adjust(self, tier: str, start: float, now: float) -> float:
        wait = start - now
        band = self._band(wait)
        if band is None:
            return start
        for key in ((tier, band), (tier, None)):
            ratios = self._ratios.get(key)
            if ratios is not None and len(ratios) >= self.MIN_RUNS:
                return now + wait * float(np.median(ratios))
        return start


def _duration(gang: Gang, run_lengths: RunLengths | None) -> float:
    """A gang's expected run: declared, else learned (math.inf: unknown)."""
    if gang.expected_duration is not None:
        return gang.expected_duration
    learned = run_lengths.remaining(gang.team, gang.tier, 0.0) if run_lengths is not None else None
    return math.inf if learned is None else learned


def _end_of(r: RunningGang, now: float, run_lengths: RunLengths | None) -> float:
    """A running gang's expected end: declared, else learned from its age (math.inf: unknown)."""
    end = r.expected_end
    if end is not None:
        return end
    rest = run_lengths.remaining(r.gang.team, r.gang.tier, now - r.started_at) if run_lengths is not None else None
    return math.inf if rest is None else now + rest


ESTIMATE_LIMIT = 25  # estimated starts for the first N waiting gangs of the cluster's queue (cost bound)
ESTIMATE_TRIES = 64  # full admissions tried per gang at most (cost bound; the room estimate skips most)
# why a waiting gang has no estimated start, or what its estimate waits for
NOTE_NOT_ESTIMATED = "not estimated: only the first {limit} gangs in the cluster's queue are"
NOTE_NO_END = "after running work that has no expected duration"
NOTE_NEVER = "would not fit even if every running gang ended"
NOTE_PREEMPTING = "preempting: starts once its victims are gone"
NOTE_TOO_MANY_TRIES = "not estimated: no start found within {tries} tries"


@dataclass(frozen=True)
class StartEstimate:
    """A waiting gang's estimated start (None: not known, `note` says why) and the nodes it is
    expected to start on."""

    start: float | None
    nodes: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class _Ahead:
    """An estimated gang's future placement, held from `start` to `end` (math.inf: unknown end);
    `whole`: [N] the whole GPUs its placements take per node (_WholeBound)."""

    team: str
    placements: tuple[Placement, ...]
    start: float
    end: float
    whole: np.ndarray = field(compare=False, repr=False)
    demand: Demand | None = field(compare=False, repr=False, default=None)  # its quota (None: no quota book)

    @classmethod
    def of(cls, state: CycleState, team: str, placements: tuple[Placement, ...], start: float, end: float) -> _Ahead:
        snap = state.snap
        whole = np.zeros(len(snap), dtype=np.int64)
        for p in placements:
            whole[snap.node_index(p.node)] += sum(1 for _, milli in p.gpu_shares if milli >= GPU_MILLI)
        return cls(team, placements, start, end, whole, state.demand(placements) if state.usage is not None else None)

    def overlaps(self, t: float, until: float) -> bool:
        return self.start < until and t < self.end


class _WholeBound:
    """A necessary condition for a gang of whole-GPU members to fit at a tried time with the
    estimated gangs ahead held, read before holding them: the whole GPUs free on the nodes it may use
    once released, less per node what the overlapping gangs ahead take there (a held placement takes
    its whole GPUs; one that does not fit keeps its node off, which takes more), add up to its ask.
    Shares ahead count as taking nothing, CPU and memory are not counted: an upper bound of the room,
    so a time it rules out would have been ruled out by the fit on the held copy too (the same
    estimates), without the holding. Most tried times of a deep queue end there: the gangs ahead
    take the room the releases give."""

    def __init__(self, snap: Snapshot, gang: Gang, eligible: np.ndarray):
        self.need = sum(m.gpus for m in gang.members)
        self.nodes = np.flatnonzero(eligible)  # the nodes it may use, and each one's place among them (-1: none)
        self.at = np.full(len(eligible), -1, dtype=np.int64)
        self.at[self.nodes] = np.arange(len(self.nodes))
        self.whole = snap.whole_free_gpus()[self.nodes]  # of the released state, kept up to date by `released`
        self.taken = np.zeros(len(self.nodes), dtype=np.int64)  # by the gangs ahead in `held`
        self.held: dict[int, np.ndarray] = {}  # id(ahead) -> what it takes of `nodes`

    @classmethod
    def for_gang(cls, snap: Snapshot, gang: Gang, eligible: np.ndarray) -> _WholeBound | None:
        """None unless every member asks the same whole GPUs: with several pod sets the fit on the
        held copy counts each set alone, so it may pass where the GPUs do not add up (and the
        admission tried then counts towards ESTIMATE_TRIES): ruling those times out here would
        change estimates that reach that bound."""
        if len(gang.pod_sets) != 1 or gang.pod_sets[0].request.gpus <= 0:
            return None
        return cls(snap, gang, eligible)

    def released(self, touched: Iterable[tuple[int, list[int], int, int]]) -> None:
        """Nodes' free GPU rows (lists, as _Releases.touched gives them) after a release."""
        at = self.at
        for n, row, _, _ in touched:
            i = at[n]
            if i >= 0:
                self.whole[i] = row.count(GPU_MILLI)

    def may_hold(self, overlapping: Sequence[_Ahead]) -> bool:
        held = self.held
        if len(held) != len(overlapping) or any(id(a) not in held for a in overlapping):
            # the gangs ahead overlapping a tried time change a few at a time: only those are summed
            want = {id(a): a for a in overlapping}
            for key in [key for key in held if key not in want]:
                self.taken -= held.pop(key)
            for key, a in want.items():
                if key not in held:
                    held[key] = a.whole[self.nodes]
                    self.taken += held[key]
        return int(np.maximum(self.whole - self.taken, 0).sum()) >= self.need


def estimate_starts(state: CycleState, waiting: Sequence[Gang], result: CycleResult, profile: Profile,
                    now: float, limit: int = ESTIMATE_LIMIT,
                    nominated: Mapping[str, Sequence[str]] | None = None,
                    run_lengths: RunLengths | None = None,
                    calibration: StartCalibration | None = None) -> dict[str, StartEstimate]:
    """When and where each of the first `limit` gangs of `waiting` (queue order, what the cycle of
    `result` left waiting) is expected to start, under the cycle's own profile, quota book and
    reservation (conservative backfilling: each estimate holds its placement on the what-if from its
    start, so the gangs behind it never delay it):
    - the head of line's capacity reservation starts when the cycle said (Reservation.start);
    - a gang with a preemption plan (of this cycle, or `nominated`: gang name -> nodes of a held
      nomination) starts now, once its victims are gone;
    - any other: running gangs (and the gangs admitted in this cycle) are released on a copy by
      expected end until core.gang.admit admits it, capacity AND quota (a quota-blocked gang gets
      the end of the gang of its team or cohort that frees its quota, not the time capacity frees).
      Releases that add no room for it and free no quota of its cohort are skipped (RoomEstimate).
    A gang's run is its declared expected duration, else (with `run_lengths`) the run learned for
    its team and tier given how long it has run (RunLengths); a head whose reservation waits on
    work of unknown end is then estimated like the others, first. With `calibration`, each gang's
    first raw estimate is recorded and the estimates returned are stretched (StartCalibration); the
    gangs ahead are held at their raw estimates.
    `state` is the cycle's state before the cycle (changed nothing)."""
    out = _estimate_starts(state, waiting, result, profile, now, limit, nominated, run_lengths)
    if calibration is None:
        return out
    by_name = {g.name: g for g in waiting}
    for name, est in out.items():
        calibration.first_seen(by_name[name], est.start, now)
        if est.start is not None and est.start > now:
            out[name] = replace(est, start=calibration.adjust(by_name[name].tier, est.start, now))
    return out


def _estimate_starts(state: CycleState, waiting: Sequence[Gang], result: CycleResult, profile: Profile,
                     now: float, limit: int, nominated: Mapping[str, Sequence[str]] | None,
                     run_lengths: RunLengths | None) -> dict[str, StartEstimate]:
    order = list(waiting)
    out: dict[str, StartEstimate] = {}
    base = state.capacity_view()
    ends: list[RunningGang] = list(state.running)
    planned = {p.gang.name: p for p in result.preemptions}
    for d in result.admitted:  # admitted this cycle: held from now, until their own expected end
        base.hold(d.gang.team, d.placements)
        ends.append(RunningGang(d.gang, d.placements, now, borrowed=d.borrowed))
    for plan in result.preemptions:  # its victims leave now and it takes their place
        gone = {v.gang.name for v in plan.victims}
        for v in plan.victims:
            base.release(v)
        # by name, then the very victim: the admitted rest of a partly bound gang bears its name too
        ends = [r for r in ends if r.gang.name not in gone or not any(r is v for v in plan.victims)]
        _hold_where_free(base, plan.gang.team, plan.placements)
        ends.append(RunningGang(plan.gang, tuple(plan.placements), now))
    ends = sorted(((_end_of(r, now, run_lengths), r) for r in ends),
                  key=lambda e: (e[0], e[1].started_at, e[1].gang.name))
    releases = _Releases(base, ends, now) if _SHARE_RELEASES else None  # base is final from here
    ahead: list[_Ahead] = []
    nominated = dict(nominated or {})
    res = result.reservation
    head = res.gang.name if res is not None and not res.by_preemption else None
    if head is not None and head in {g.name for g in order[:limit]}:
        # the scheduler keeps every other gang off the head's nodes, those ahead of it in the queue too
        # (a quota-blocked gang is never head): its reservation is held first
        start, placements = res.start, tuple(res.placements)
        if math.isinf(start) and run_lengths is not None:
            est, placements = _estimate_one(base, ends, ahead, res.gang, profile, now, run_lengths, releases)
            out[head] = est
            start = math.inf if est.start is None else est.start
        else:
            out[head] = StartEstimate(None if math.isinf(start) else start, tuple(sorted(res.nodes)),
                                      NOTE_NO_END if math.isinf(start) else "")
        if not math.isinf(start):
            ahead.append(_Ahead.of(base, res.gang.team, placements, start,
                                   start + _duration(res.gang, run_lengths)))
    for i, gang in enumerate(order):
        if i >= limit:
            out[gang.name] = StartEstimate(None, (), NOTE_NOT_ESTIMATED.format(limit=limit))
            continue
        if gang.name == head:
            continue
        if gang.name in planned or gang.name in nominated:
            plan = planned.get(gang.name)
            nodes = tuple(sorted({p.node for p in plan.placements})) if plan is not None else nominated[gang.name]
            out[gang.name] = StartEstimate(now, tuple(nodes), NOTE_PREEMPTING)
            continue
        est, placements = _estimate_one(base, ends, ahead, gang, profile, now, run_lengths, releases)
        out[gang.name] = est
        if est.start is not None:
            ahead.append(_Ahead.of(base, gang.team, tuple(placements), est.start,
                                   est.start + _duration(gang, run_lengths)))
    return out


def _hold_where_free(state: CycleState, team: str, placements: Iterable[Placement],
                     assumed: list[str] | None = None, demand: Demand | None = None) -> set[str]:
    """Hold what fits of `placements` on `state` (quota counted whole); the nodes where a placement
    does not fit (still taken at that time) are returned, to be kept off instead. `assumed`: the pods
    held are appended to it."""
    placements = tuple(placements)
    placed = state.snap.placements
    todo = [p for p in placements if p.pod not in placed]
    failed = state.snap.assume_many(todo)
    blocked = {p.node for p in failed}
    if assumed is not None:
        refused = {id(p) for p in failed}
        assumed.extend(p.pod for p in todo if id(p) not in refused)
    if state.usage is not None:
        state.usage.add(team, demand if demand is not None else state.demand(placements))
    return blocked


class _Held:
    """`work` (a what-if being released; set when it is made, before the first holding) with the
    estimated gangs ahead that overlap a tried time held on a copy (_hold_where_free), kept from one
    tried time to the next: releases are mirrored, the holds of gangs that stopped overlapping
    dropped, those of gangs that started overlapping added, and the placements that did not fit
    (their nodes kept off) tried again, in queue order. Holding them afresh on a new copy at every
    tried time cost most of an estimate on a deep queue."""

    def __init__(self, work: CycleState | None):
        self.work = work
        self.trial: CycleState | None = None
        # id(ahead) -> (ahead, pods held for it, its placements that did not fit), in queue order
        self.held: dict[int, tuple[_Ahead, list[str], list[Placement]]] = {}
        self.changed = False
        self.freed: set[str] = set()  # nodes with room freed since the last holding (retry only there)

    @property
    def kept_off(self) -> set[str]:
        return {p.node for _, _, failed in self.held.values() for p in failed}

    def released(self, r: RunningGang, demand) -> None:
        """`r` was released on `work`: the same on the copy."""
        if self.trial is None:
            return
        snap = self.trial.snap
        self.freed.update(snap.nodes[i].name for i in snap.forget_placed(r.placements))
        if demand is not None and self.trial.usage is not None:
            self.trial.usage.remove(r.gang.team, demand)
        self.changed = True

    def holding(self, overlapping: Sequence[_Ahead]) -> CycleState:
        if self.trial is None:
            self.trial = self.work.capacity_view()
        want = [id(a) for a in overlapping]
        if not self.changed and list(self.held) == want:
            return self.trial
        trial, wanted = self.trial, set(want)
        for key in [key for key in self.held if key not in wanted]:  # its hold ended
            a, pods, _ = self.held.pop(key)
            self.freed.update(trial.snap.placements[pod].node for pod in pods)
            trial.snap.forget_many(pods)
            if trial.usage is not None:
                trial.usage.remove(a.team, a.demand)
        for a in overlapping:
            entry = self.held.get(id(a))
            if entry is None:
                pods: list[str] = []
                _hold_where_free(trial, a.team, a.placements, pods, a.demand)
                held = set(pods)
                self.held[id(a)] = (a, pods, [p for p in a.placements if p.pod not in held
                                              and p.pod not in trial.snap.placements])
            elif entry[2] and self.freed:  # what did not fit may now, where room was freed
                retry = [p for p in entry[2] if p.node in self.freed]
                refused = {id(p) for p in trial.snap.assume_many(retry)}
                entry[1].extend(p.pod for p in retry if id(p) not in refused)
                entry[2][:] = [p for p in entry[2] if p.node not in self.freed or id(p) in refused]
        self.held = {key: self.held[key] for key in want}
        self.changed = False
        self.freed.clear()
        return trial


# Off: each estimate releases on its own copy at once and keeps its own room tracker, as before the
# sharing (_Releases: the freed rows, the room per gang shape, the released state; tests compare the two)
_SHARE_RELEASES = True
# Off: every tried time with gangs ahead holds them before the fit is read (tests compare the two)
_WHOLE_BOUND = True


class _Releases:
    """The release sequence of one estimate_starts call, shared by the gangs it estimates: every
    estimate releases the same running gangs in the same order from the same state, so the nodes
    each release frees and their free capacity after it are computed once (on one copy), and an
    estimate's room tracker reads them; its own copy catches up only when a placement is tried."""

    def __init__(self, base: CycleState, ends: Sequence[tuple[float, RunningGang]], now: float):
        self.ends = ends
        self.now = now
        self.snap: Snapshot | None = None  # made on first use
        self.base = base
        self.freed: list[list[tuple[int, list[int], int, int]]] = []  # per release: (node, GPU row, CPU, memory) after
        self._rooms: dict[tuple, _ShapeRoom] = {}
        self._state: CycleState | None = None  # the base with releases 0.._state_at-1 done (state_after)
        self._state_at = 0
        self._end_times: list[float] | None = None
        self.end_keys = [end for end, _ in ends]  # sorted: the releases up to a time are one bisect
        self._cohorts: list[str | None] | None = None

    def end_times(self) -> list[float]:
        """The distinct finite expected ends after `now`, in order (`ends` is sorted by end)."""
        if self._end_times is None:
            out: list[float] = []
            for end, _ in self.ends:
                if self.now < end < math.inf and (not out or end != out[-1]):
                    out.append(end)
            self._end_times = out
        return self._end_times

    def state_after(self, k: int) -> CycleState:
        """A copy of the base with releases 0..k-1 done (capacity and quota), made from one state
        kept along the sequence: each estimate released its own copy gang by gang up to its start,
        and the estimates of a queue mostly reach later releases in queue order (an earlier release
        than the kept state's is made from the base)."""
        if k < self._state_at:
            state = self.base.capacity_view()
            _catch_up(state, [self.ends[i][1] for i in range(k)])
            return state
        if self._state is None:
            self._state = self.base.capacity_view()
        _catch_up(self._state, [self.ends[i][1] for i in range(self._state_at, k)])
        self._state_at = k
        return self._state.capacity_view()

    def room(self, gang: Gang, profile: Profile) -> _ShapeRoom:
        """The room of gangs shaped as `gang` along this release sequence (what RoomEstimate reads of
        a gang: its pod sets, topology and product mixing)."""
        key = (id(profile), gang.pod_set_shapes, gang.topology, gang.products_mixed)
        got = self._rooms.get(key)
        if got is None:
            got = self._rooms[key] = _ShapeRoom(RoomEstimate.for_gang(self.base.snap, gang, profile), self)
        return got

    def cohorts(self, k: int, upto: int) -> set[str | None]:
        """The quota cohorts of the teams of releases k..upto-1 (their quota frees room there)."""
        if self._cohorts is None:
            self._cohorts = [_cohort_of(self.base, r.gang.team) for _, r in self.ends]
        return set(self._cohorts[k:upto])

    def touched_span(self, k: int, upto: int) -> Iterator[tuple[int, list[int], int, int]]:
        """What releases k..upto-1 freed, in release order (touched, one after the other)."""
        self.touched(upto - 1)
        return (entry for freed in self.freed[k:upto] for entry in freed)

    def touched(self, k: int) -> list[tuple[int, list[int], int, int]]:
        """The nodes release k freed, with their free capacity once releases 0..k are done."""
        while len(self.freed) <= k:
            if self.snap is None:
                self.snap = self.base.snap.copy()
            snap, r = self.snap, self.ends[len(self.freed)][1]
            touched = snap.forget_placed(r.placements)
            self.freed.append([(n, snap.gpu_free[n].tolist(), int(snap.cpu_free[n]), int(snap.mem_free[n]))
                               for n in touched])
        return self.freed[k]


class _ShapeRoom:
    """The room estimate of one gang shape walked once along the release sequence of an
    estimate_starts call (a RoomTracker on the state before the releases, fed the freed rows):
    whether release k may let such a gang in somewhere (RoomTracker.update) and whether some domain
    holds it after the releases up to a tried time (RoomTracker.holds). Every estimate of that shape
    reads them: a deep queue is a few shapes, and each estimate walked the same releases again."""

    def __init__(self, room: RoomEstimate, releases: _Releases):
        self.room, self.releases = room, releases
        self.tracker = room.tracker(releases.base.snap)  # only fed rows: the base stays as it is
        self.holds_before = self.tracker.holds()
        self.hits_before = [0]  # [k]: how many of releases 0..k-1 may let such a gang in
        self.holds: list[bool | None] = []  # [k]: some domain holds it after release k (read where a span ends)

    def span(self, k: int, upto: int) -> tuple[bool, bool]:
        """Whether any of releases k..upto-1 may let such a gang in, and whether some domain holds
        it after them. A span ends where the expected end changes (every gang ending by a tried
        time is released at it), so the room is read only there."""
        keys = self.releases.end_keys
        while len(self.hits_before) <= upto:
            j = len(self.hits_before) - 1
            hit = self.tracker.update(self.releases.touched(j))
            self.hits_before.append(self.hits_before[-1] + hit)
            last = j + 1 == len(keys) or keys[j + 1] != keys[j]
            self.holds.append(self.tracker.holds() if last else None)
        return self.hits_before[upto] > self.hits_before[k], self.holds[upto - 1]


def _estimate_one(base: CycleState, ends: Sequence[tuple[float, RunningGang]], ahead: Sequence[_Ahead], gang: Gang,
                  profile: Profile, now: float, run_lengths: RunLengths | None = None,
                  releases: _Releases | None = None) -> tuple[StartEstimate, tuple[Placement, ...]]:
    """estimate_starts for one gang that is neither head nor preempting. `ends`: (expected end,
    running gang) by end (math.inf: unknown); `releases`: their release sequence, shared with the
    other estimates of the call."""
    releases = releases if releases is not None else _Releases(base, ends, now)
    # with the shared releases made when first read, at the release reached then (_Releases.state_after)
    work = None if _SHARE_RELEASES else base.capacity_view()
    if _SHARE_RELEASES:  # the room along the releases, shared by the estimates of gangs of its shape
        shaped, tracker = releases.room(gang, profile), None
        room, room_holds = shaped.room, shaped.holds_before
    else:
        shaped, tracker = None, RoomEstimate.for_gang(work.snap, gang, profile).tracker(work.snap)
        room = tracker.room
    bound = _WholeBound.for_gang(base.snap, gang, room.eligible) if _WHOLE_BOUND else None
    cohort = _cohort_of(base, gang.team)
    duration = _duration(gang, run_lengths)
    times = _tried_times(releases.end_times(), now, ahead)
    k, tries = 0, 0
    held = _Held(work)
    # released by the tracker, not yet on `work` / on the held copy: each catches up when it is read
    lag: list[RunningGang] = []
    lag_held: list[RunningGang] = []
    for t in times:
        worth = t == now
        # the running gangs that end by t, released at once (gangs started together with one
        # duration end together: a sweep, thousands at 5,000 nodes)
        upto = bisect.bisect_right(releases.end_keys, t, k)
        if upto > k:
            if shaped is not None:
                hit, room_holds = shaped.span(k, upto)
                worth = hit or worth
            else:
                for j in range(k, upto):
                    worth = tracker.update(releases.touched(j)) or worth
            if bound is not None:
                bound.released(releases.touched_span(k, upto))
            if base.usage is not None and not worth:
                worth = cohort in releases.cohorts(k, upto)
            gone = [r for _, r in ends[k:upto]]
            lag.extend(gone)
            if held.trial is not None:
                lag_held.extend(gone)
            k = upto
        if not _SHARE_RELEASES:
            _catch_up(work, lag)
            _catch_up_held(work, held, lag_held)
        worth = worth or any(a.end == t for a in ahead)
        if not worth or not (room_holds if shaped is not None else room.holds(tracker.fit)):
            continue
        overlapping = [a for a in ahead if a.overlaps(t, t + duration)]
        if overlapping and bound is not None and not bound.may_hold(overlapping):
            continue  # the gangs ahead take the room: not worth holding them
        if not overlapping or held.trial is None:  # admitted on `work`, or the held copy made from it
            if work is None:
                work = held.work = releases.state_after(k)
                lag.clear()
            else:
                _catch_up(work, lag)
        _catch_up_held(work, held, lag_held)
        trial = held.holding(overlapping) if overlapping else work  # admit changes neither snap nor usage
        kept_off = held.kept_off if overlapping else set()
        exclude = node_mask(trial.snap, kept_off) if kept_off else None
        if overlapping:  # the room the estimated gangs ahead leave (the tracker does not see them): often none
            fit = members_per_node(trial.snap, gang, room.by_set)
            if not room.holds(fit if exclude is None else np.where(exclude, 0, fit)):
                continue
        tries += 1
        if tries > ESTIMATE_TRIES:
            return StartEstimate(None, (), NOTE_TOO_MANY_TRIES.format(tries=ESTIMATE_TRIES)), ()
        decision = admit(trial.snap, gang, profile, trial.book, trial.usage, exclude, explain=False)
        if decision.admitted:
            nodes = tuple(sorted({p.node for p in decision.placements}))
            if math.isinf(t):
                return StartEstimate(None, nodes, NOTE_NO_END), ()
            return StartEstimate(t, nodes), decision.placements
    return StartEstimate(None, (), NOTE_NEVER), ()


def _tried_times(end_times: list[float], now: float, ahead: Sequence[_Ahead]) -> Iterator[float]:
    """The times an estimate tries, in order: now, each later expected end of a running gang
    (`end_times`: distinct, sorted) or of an estimated gang ahead, then math.inf (every gang gone,
    the unknown ones too). Made as they are read: most estimates stop after a few, and the ends of
    thousands of running gangs were a set sorted again per estimate."""
    last = None
    for t in heapq.merge(end_times, sorted({now} | {a.end for a in ahead if now < a.end < math.inf})):
        if t != last:
            yield t
            last = t
    yield math.inf


def _catch_up(work: CycleState, lag: list[RunningGang]) -> None:
    """Release on `work` the gangs its room tracker released already (their pods at once: each
    node's row written once, however many of them ended there)."""
    if lag:
        work.snap.forget_placed([p for r in lag for p in r.placements])
    if work.usage is not None:
        for r in lag:
            work.usage.remove(r.gang.team, work.demand_of(r))
    lag.clear()


def _catch_up_held(work: CycleState, held: _Held, lag: list[RunningGang]) -> None:
    """The same on the held copy (made after them, it mirrors them)."""
    for r in lag:
        held.released(r, work.demand_of(r) if work.usage is not None else None)
    lag.clear()


def _cohort_of(state: CycleState, team: str) -> str | None:
    """The quota cohort of `team` (None without a quota book: quota frees nothing)."""
    if state.book is None:
        return None
    quota = state.book.teams.get(team)
    return quota.cohort if quota is not None else team

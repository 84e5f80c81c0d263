"""How right the published estimated start is (issue 30): the replay records, for every waiting gang
at its submission (and at each re-queue after a stop) and every simulated hour, the estimate the
scheduler would publish after that cycle (core.estimate.estimate_starts with the cycle's own state,
result, profile and learned run lengths, the inputs core.visibility.waiting_entries gives it), and
the time the gang really started; the error per tier follows.

What is sampled: at submission every new gang (one beyond the first ESTIMATE_LIMIT of the queue is
"not estimated": unknown, as published); every hour the gangs the scheduler estimates (the first
ESTIMATE_LIMIT of the queue; the long tail behind them is counted at its submission, not hourly).
The error of a sample is |estimated start - real start|; "within 25 %" compares it with the wait
still ahead at that sample (real start - observed_at). A gang that never started is left out of the
errors (its estimate is counted in unknown_pct when it said unknown). Each row of
<platform>.estimates.csv is one sample, so every number can be recomputed from it."""

from __future__ import annotations

import bisect
import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.estimate import ESTIMATE_LIMIT, NOTE_NOT_ESTIMATED, estimate_starts
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.model import Gang
from airflow_gpu.core.queue import QUEUE_KEY, CycleResult

SAMPLE_INTERVAL = 3600.0  # simulated seconds between two samples of the whole estimated queue
WITHIN_SECONDS = 900.0  # "within 15 min"
WITHIN_FRACTION = 0.25  # "within 25 % of the actual wait"
SUBMIT, REQUEUE, HOURLY = "submit", "requeue", "hourly"
ESTIMATE_COLUMNS = ("gang", "team", "tier", "observed_at", "kind", "position", "estimated_start", "note", "started_at")


@dataclass
class Sample:
    """One published estimate and, once known, the gang's real start (times rounded to the ms, as
    written: the CSV recomputes the same numbers)."""

    gang: str
    team: str
    tier: str
    observed_at: float
    kind: str
    position: int  # in the cluster's queue, from 1 (as published)
    estimated_start: float | None
    note: str
    started_at: float | None = None

    def row(self) -> tuple:
        return (self.gang, self.team, self.tier, f"{self.observed_at:.3f}", self.kind, self.position,
                "" if self.estimated_start is None else f"{self.estimated_start:.3f}", self.note,
                "" if self.started_at is None else f"{self.started_at:.3f}")


class StartRecorder:
    """The replay's estimate bookkeeping: `enqueued` when a gang joins the queue, `due`/`sample` after
    the last cycle of an instant (before its admissions bind: the state the cycle read), `started`
    when a gang binds."""

    def __init__(self, limit: int = ESTIMATE_LIMIT, interval: float = SAMPLE_INTERVAL):
        self.limit, self.interval = limit, interval
        self.samples: list[Sample] = []
        self._open: dict[str, list[Sample]] = {}  # gang -> its samples waiting for its start
        self._fresh: dict[str, tuple[Gang, str]] = {}  # gang -> (gang, kind) enqueued since the last sample
        self._next = 0.0  # next hourly sample

    def enqueued(self, gang: Gang, kind: str) -> None:
        self._fresh[gang.name] = (gang, kind)

    def started(self, name: str, now: float) -> None:
        self._fresh.pop(name, None)
        for s in self._open.pop(name, ()):
            s.started_at = round(now, 3)

    def due(self, now: float) -> bool:
        return bool(self._fresh) or now >= self._next

    def sample(self, state: CycleState, queue: Sequence[Gang], result: CycleResult, profile: Profile,
               now: float, run_lengths=None, calibration=None) -> None:
        """Record what the scheduler would publish after the cycle of `result` (`state`: before it;
        `queue`: the pending gangs in queue order, as the cycle got them). Only the prefix of the
        queue the recorded gangs depend on is estimated (each estimate depends on the gangs ahead of
        it and the head's reservation only), which keeps a sample at submission cheap."""
        hourly = now >= self._next
        if hourly:
            self._next = (now // self.interval + 1) * self.interval
        admitted = [d.gang.queue_key for d in result.admitted]
        admitted_names = {d.gang.name for d in result.admitted}

        def position(gang: Gang) -> int:  # in the waiting queue (pending minus this cycle's admissions)
            i = bisect.bisect_left(queue, gang.queue_key, key=QUEUE_KEY)
            return i - sum(1 for k in admitted if k < gang.queue_key)

        fresh = {n: gk for n, gk in self._fresh.items() if n not in admitted_names}
        self._fresh.clear()
        need = self.limit if hourly else 0
        late = []
        for name, (gang, kind) in fresh.items():
            p = position(gang)
            if p >= self.limit:
                late.append((gang, kind, p))
            else:
                need = max(need, p + 1)
        res = result.reservation
        if need and res is not None and not res.by_preemption and res.gang.name not in admitted_names:
            p = position(res.gang)
            if p < self.limit:
                need = max(need, p + 1)  # the head's reservation is held before every other estimate
        prefix: list[Gang] = []
        for g in queue:
            if len(prefix) >= need:
                break
            if g.name not in admitted_names:
                prefix.append(g)
        starts = estimate_starts(state, prefix, result, profile, now, self.limit,
                                 run_lengths=run_lengths, calibration=calibration) if prefix else {}
        t = round(now, 3)
        for i, gang in enumerate(prefix, start=1):
            kind = fresh[gang.name][1] if gang.name in fresh else HOURLY if hourly else None
            if kind is not None:
                est = starts[gang.name]
                self._add(Sample(gang.name, gang.team, gang.tier, t, kind, i,
                                 None if est.start is None else round(est.start, 3), est.note))
        note = NOTE_NOT_ESTIMATED.format(limit=self.limit)
        for gang, kind, p in late:
            self._add(Sample(gang.name, gang.team, gang.tier, t, kind, p + 1, None, note))

    def _add(self, s: Sample) -> None:
        self.samples.append(s)
        self._open.setdefault(s.gang, []).append(s)


def _pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 1) if whole else None


def error_table(samples: Sequence[Sample]) -> dict[str, dict]:
    """Per tier: median and p90 absolute error (s) of the estimates of gangs that started, the share
    within 15 min and within 25 % of the wait still ahead, the share of samples that said unknown."""
    by_tier: dict[str, list[Sample]] = {}
    for s in samples:
        by_tier.setdefault(s.tier, []).append(s)
    out = {}
    for tier, rows in sorted(by_tier.items()):
        unknown = sum(1 for s in rows if s.estimated_start is None)
        known = [s for s in rows if s.estimated_start is not None and s.started_at is not None]
        err = np.array([abs(s.estimated_start - s.started_at) for s in known], dtype=float)
        ahead = np.array([s.started_at - s.observed_at for s in known], dtype=float)
        out[tier] = {
            "median_s": round(float(np.percentile(err, 50)), 1) if len(err) else None,
            "p90_s": round(float(np.percentile(err, 90)), 1) if len(err) else None,
            "within_15min_pct": _pct(int(np.sum(err <= WITHIN_SECONDS)), len(err)),
            "within_25pct_pct": _pct(int(np.sum(err <= WITHIN_FRACTION * ahead)), len(err)),
            "unknown_pct": _pct(unknown, len(rows)),
            "samples": len(rows), "measured": len(err),
        }
    return out


def write_estimates(samples: Sequence[Sample], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(ESTIMATE_COLUMNS)
        w.writerows(s.row() for s in samples)
    return path


def error_table_yaml(table: dict[str, dict], doc: dict) -> str:
    """A quota-file `scheduling.estimate_error_seconds` snippet from one platform's error table (the
    p90 absolute error per tier, whole seconds): the scheduler then publishes each estimated start
    with it and the queue page shows the interval. Tiers without a measured error are left out."""
    lines = [f"# p90 absolute error of the estimated start, measured by `airflow-gpu simulate replay` on "
             f"{doc.get('trace')} (capacity {doc.get('capacity')}, seed {doc.get('seed')}, {doc.get('jobs')} jobs)",
             "scheduling:", "  estimate_error_seconds:"]
    rows = [(tier, e["p90_s"]) for tier, e in sorted(table.items()) if e.get("p90_s") is not None]
    lines += [f"    {tier}: {round(p90)}" for tier, p90 in rows] or ["    {}"]
    return "\n".join(lines) + "\n"

"""Time replay of jobs on a simulated clock, driving the scheduler's own cycle (core.queue).

The clock jumps from event to event (arrival, finish, spot interruption, node back). After the
events of one instant, one scheduling cycle runs; its admissions bind at once and its preemption
victims stop at once (SIGTERM + grace: a checkpoint at the stop when the platform has one), the
preemptor binding in the next cycle of the same instant. Everything that decides (order, gangs,
quota and borrowing, reservations, victims, placement, spot eligibility) is core/; this module only
keeps the clock and the books. The coupling to core's cycle is `_Cycle` (one small adapter).

Stopped work (preempted, interrupted) goes back to the queue with its place (submit time) and
resumes from its last checkpoint: with `sigterm_checkpoint` everything up to the stop when the
checkpoint fits in the grace period (core.model.sigterm_checkpoint_commits: the spot notice for an
interruption, Setting.grace_seconds for a preemption), else the last periodic checkpoint, without
checkpoints nothing. Every restart first computes nothing for its gang's restart overhead
(core.model.restart_lost_gpu_seconds), charged as lost.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import pickle
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from queue import Empty

import numpy as np

from airflow_gpu.constants import (CAPACITY_SPOT, DEFAULT_CHECKPOINT_SECONDS, DEFAULT_GRACE_SECONDS,
                                   DEFAULT_PLACEMENT_HOLD_BUDGET, DEFAULT_PLACEMENT_HOLD_SECONDS,
                                   DEFAULT_RESERVATION_HOLD_SECONDS)
from airflow_gpu.core.framework import place_pod
from airflow_gpu.core.gang import place_gang
from airflow_gpu.core.holding import PlacementHolds
from airflow_gpu.core.model import (GPU_MILLI, Gang, Node, Placement, RunningGang, TopologyLevel, TopologyRequirement,
                                    periodic_checkpoint_work, restart_lost_gpu_seconds, sigterm_checkpoint_commits,
                                    work_kept_at_stop)
from airflow_gpu.core.plugins.fgd import TypicalPods
from airflow_gpu.core.policies import DEFAULT_POLICY, SPREAD_POLICY, make_profile
from airflow_gpu.core.preemption import PreemptionPolicy
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.backoff import Backoff, NoPlanMemo, RefusedAsks
from airflow_gpu.core.estimate import RunLengths, StartCalibration
from airflow_gpu.core.reservation import ReservationHold, StartMemo
from airflow_gpu.core.queue import QUEUE_KEY, Queue
from airflow_gpu.core.live import LiveState
from airflow_gpu.core.quota import QuotaBook, TeamQuota
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.tiers import TierPolicy, decide
from airflow_gpu.sim.start_accuracy import REQUEUE, SUBMIT, Sample, StartRecorder
from airflow_gpu.sim.workload import Job, mark_spot, whole_gpus

FINISHED, PREEMPTED, INTERRUPTED, FAILED = "finished", "preempted", "interrupted", "failed"
UNASSIGNED = "(unassigned)"  # the quota book's lender of the GPUs no team is guaranteed
ESTIMATES = ("learned", "runs", "declared", "off")  # Setting.estimates
NEVER = 1e15  # back-off of a gang that did not fit: until room appears (Queue.room_appeared)


@dataclass(frozen=True)
class Platform:
    """One way to run the cluster. `queue`: "cycle" = core.queue.Queue (the scheduler's),
    "fifo" = kube-scheduler-like: pods one by one in arrival order, whatever fits binds."""

    name: str
    queue: str = "cycle"
    gang: bool = True  # all workers at once; False: one by one, partial gangs hold their GPUs
    preemption: bool = True
    shares: bool = True  # GPU shares / MIG slices; False: a whole GPU for every share
    spot: bool = True
    spot_fallback: bool = True  # tiers with spot_fallback in the config may overflow onto spot
    quotas: bool = True
    borrowing: bool = True
    checkpoints: bool = True
    sigterm_checkpoint: bool = True  # save at SIGTERM (preemption, spot notice); False: interval only
    policy: str = DEFAULT_POLICY
    hold: bool = True  # held placements when the setting budgets them (Setting.placement_hold)


FULL = Platform("full")
PLATFORMS: dict[str, Platform] = {
    "naive": Platform("naive", queue="fifo", gang=False, preemption=False, shares=False, spot=False, quotas=False,
                      borrowing=False, checkpoints=False, sigterm_checkpoint=False, policy=SPREAD_POLICY),
    "full": FULL,
    "no-preemption": replace(FULL, name="no-preemption", preemption=False),
    "no-gang": replace(FULL, name="no-gang", gang=False),
    "no-mig": replace(FULL, name="no-mig", shares=False),
    "no-spot": replace(FULL, name="no-spot", spot=False),
    "no-spot-fallback": replace(FULL, name="no-spot-fallback", spot_fallback=False),
    "no-borrowing": replace(FULL, name="no-borrowing", borrowing=False),
    "bestfit-placement": replace(FULL, name="bestfit-placement", policy="bestfit"),
    "interval-checkpoints": replace(FULL, name="interval-checkpoints", sigterm_checkpoint=False),
    "no-hold": replace(FULL, name="no-hold", hold=False),  # full without held placements (their gain)
}


@dataclass(frozen=True)
class SpotModel:
    share: float = 0.25  # fraction of nodes that are spot (on platforms with spot)
    interruptions_per_node_day: float = 0.5
    notice_seconds: float = 120.0
    replace_after_seconds: float = 900.0


@dataclass(frozen=True)
class Setting:
    """Everything a replay needs besides the platform: same for every platform of one run."""

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    tiers: dict[str, TierPolicy]  # the config's tiers (QuotaConfig.tier_policies), as the scheduler reads them
    teams: dict[str, float]  # team -> guaranteed share of every product's GPUs
    preemption_policy: PreemptionPolicy
    borrowed_priority: int | None
    prices: dict[str, tuple[float, float]]  # gpu product -> (on-demand, spot) per GPU-hour
    spot: SpotModel = SpotModel()
    seed: int = 0
    # Gang.expected_duration given to the queue = this x the job's work (0: none, as a gang without
    # the expected-duration annotation). 1.0 is an oracle; users' estimates are usually longer.
    duration_estimate: float = 0.0
    # core.reservation.ReservationHold: seconds a reservation of unknown start holds its nodes in a row
    # (then it pauses as long); 0: unbounded. From the config's scheduling section, as the scheduler.
    reservation_hold: float = DEFAULT_RESERVATION_HOLD_SECONDS
    # core.holding.PlacementHolds: at most this fraction of the GPU capacity held (a share that strands
    # capacity reserved, not bound), each for at most placement_hold_seconds; 0: off. An experiment
    # (simulate replay --placement-hold): the scheduler holds nothing
    placement_hold: float = DEFAULT_PLACEMENT_HOLD_BUDGET
    placement_hold_seconds: float = DEFAULT_PLACEMENT_HOLD_SECONDS
    # gpu product -> relative speed (absent: 1.0): a job's work is in seconds on the reference
    # product and runs `speed` times as fast on another (sim/hetero.py)
    speeds: dict[str, float] = field(default_factory=dict)
    # gpu product -> rank in the platform's product order (QuotaBook.product_rank); {}: the author's
    product_rank: dict[str, int] = field(default_factory=dict)
    # a job's SIGTERM checkpoint takes this long unless it says (Job.checkpoint_seconds); it commits
    # only within the grace period: the spot notice, or for a preemption the pods' grace period
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    # the estimated starts the scheduler would publish, recorded (sim/start_accuracy.py): "learned"
    # as the scheduler's: run lengths learned from the gangs that left (core.estimate.RunLengths) and
    # the stretch learned from earlier estimates and starts (StartCalibration); "runs": run lengths
    # only; "declared": declared durations only (the estimator before both); "off": not recorded
    estimates: str = "learned"
    # jobs of the source left out because they can never start on these nodes -> why (never_fit)
    left_out: dict[str, str] = field(default_factory=dict)
    # what reading the source dropped, said before a replay ("1,088 pods without a GPU")
    notes: tuple[str, ...] = ()


@dataclass
class Attempt:
    job: Job
    attempt: int
    holds: list[tuple[str, float, Placement]] = field(default_factory=list)  # (unit, since, placement)
    start: float | None = None  # all workers bound: the work runs
    end: float | None = None
    outcome: str = ""
    kept: float = 0.0  # seconds of this attempt's work kept (finished, or saved by a checkpoint)
    speed: float = 1.0  # work seconds per second on the product it runs on (its slowest GPU's)
    overhead: float = 0.0  # seconds of restart overhead before its work runs (0 for a first attempt)
    restart_lost: float = 0.0  # GPU-seconds its restart overhead took (restart_lost_gpu_seconds)


@dataclass
class JobState:
    job: Job
    units: dict[str, Gang]  # unit name -> the gang the queue sees
    done: float = 0.0  # work seconds saved so far
    attempt: Attempt | None = None
    attempts: int = 0
    first_start: float | None = None
    finished_at: float | None = None
    borrowed: dict[str, bool] = field(default_factory=dict)


@dataclass
class ReplayResult:
    platform: Platform
    setting: Setting
    attempts: list[Attempt]
    jobs: dict[str, JobState]
    nodes: tuple[Node, ...]
    quota: QuotaBook | None
    horizon: float
    end: float
    preemptions: int
    interruptions: int
    guarantee: dict[str, tuple[float, float]]  # team -> (met, wanted) GPU-seconds within guarantee
    # (time, allocated GPU fraction, fraction computing (the running work's own ask), some GPU work waits)
    util_curve: list[tuple[float, float, float, bool]]
    seconds: float = 0.0  # wall clock of the replay
    cpu_seconds: float = 0.0  # CPU time of the replay (its process's)
    # the estimated starts the scheduler would have published, and the real starts (sim/start_accuracy.py);
    # None: the platform publishes none (the naive FIFO)
    start_samples: list[Sample] | None = None
    holds: HoldBooks | None = None  # the cost of held placements (None: the platform held none)


@dataclass
class HoldBooks:
    """What held placements cost: the GPUs they reserved while idle and the wait they added."""

    held: int = 0  # pods held (each once)
    displaced: int = 0  # held pods that gave their room to a larger pod (then pending again)
    idle_gpu_seconds: float = 0.0  # GPU milli reserved by held pods x the time they were held, in GPU-s
    added_wait_seconds: float = 0.0  # summed time pods spent held (their start delayed by as much)

    def ended(self, h, now: float, displaced: bool = False) -> None:
        """A held pod left the hold at `now` (bound, or displaced)."""
        held_for = max(0.0, now - h.since)
        self.idle_gpu_seconds += held_for * sum(m for _, m in h.placement.gpu_shares) / GPU_MILLI
        self.added_wait_seconds += held_for
        self.displaced += displaced


def _wall(work: float, speed: float) -> float:
    """Clock seconds `work` reference seconds take at `speed` (unchanged at 1.0, to the bit)."""
    return work if speed == 1.0 else work / speed


def _work(wall: float, speed: float) -> float:
    return wall if speed == 1.0 else wall * speed


def quota_book(setting: Setting, nodes: list[Node], platform: Platform) -> QuotaBook | None:
    if not platform.quotas:
        return None
    per_product: dict[str, int] = defaultdict(int)
    for n in nodes:
        if n.gpu_product:
            per_product[n.gpu_product] += n.gpu_count
    teams = {}
    for team, share in setting.teams.items():
        nominal = {p: math.floor(c * share * 1000) / 1000 for p, c in per_product.items()}
        borrow = dict(per_product) if platform.borrowing else {}
        teams[team] = TeamQuota.from_gpus(team, nominal, borrow)
    # GPUs no team is guaranteed belong to the cohort as a lender with no work of its own (Kueue: a
    # ClusterQueue that only lends), so borrowers may use them; without it they would idle for good
    rest = {p: c - sum(t.nominal.get((p, None), 0) for t in teams.values()) / GPU_MILLI for p, c in per_product.items()}
    rest = {p: math.floor(r * 1000) / 1000 for p, r in rest.items() if r >= 0.001}
    if rest and platform.borrowing:
        teams[UNASSIGNED] = TeamQuota.from_gpus(UNASSIGNED, rest, {})
    return QuotaBook(teams, borrowed_priority=setting.borrowed_priority, speeds=setting.speeds,
                     product_rank=setting.product_rank)


def measured_horizon(jobs: Sequence[Job], nodes: Sequence[Node]) -> float:
    """The window utilisation and cost are measured over, from 0, the same on every platform: the
    arrivals' (to the last submission), or, when the trace's GPU work cannot fit into it even packed
    without a gap on every GPU (a batch submitted at once, an overloaded trace), the time that
    packing would take."""
    last = max((j.submit for j in jobs), default=0.0)
    gpus = sum(n.gpu_count for n in nodes) * GPU_MILLI
    packed = sum(j.work * j.gpu_milli for j in jobs) / gpus if gpus else 0.0
    return max(last, packed)


def never_fit(setting: Setting) -> dict[str, str]:
    """Jobs that can never start on the setting's nodes, whatever runs beside them: all their workers
    at once have no placement on the empty cluster (core.gang.place_gang, the scheduler's own answer,
    as `full` asks: spot counted as on-demand) -> core's reason. One answer per ask and gang size."""
    snap = Snapshot.from_nodes(setting.nodes)
    profile = make_profile(DEFAULT_POLICY, typical=TypicalPods.from_pods([j.worker for j in setting.jobs]),
                           prefer_products=False)  # as the replay's (a learning one would learn every job)
    platform = replace(FULL, spot=False)
    answers: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for job in setting.jobs:
        key = (replace(job.worker, name=""), job.workers)
        if key not in answers:
            gang = next(iter(_unit_gangs(job, platform, setting.tiers).values()))
            placed, _, why = place_gang(snap, gang, profile)
            answers[key] = "" if placed is not None else why
        if answers[key]:
            out[job.name] = answers[key]
    return out


def _unit_gangs(job: Job, platform: Platform, tiers: dict[str, TierPolicy],
                duration_estimate: float = 0.0) -> dict[str, Gang]:
    """The gangs the queue sees for `job`: its tier applied by core.tiers.decide (the scheduler's and
    the operator's rule), on what the platform has (no spot: nobody is spot-eligible; fifo: one priority)."""
    policy = tiers.get(job.tier)  # a tier the config lacks: core's unknown-tier rule, as the scheduler
    if policy is not None and not (platform.spot and platform.spot_fallback):
        policy = replace(policy, spot_eligible=platform.spot and policy.spot_eligible, spot_fallback=False)
    worker = job.worker if platform.shares else whole_gpus(job.worker)
    checkpointable = job.checkpointable and platform.checkpoints
    members = tuple(replace(worker, name=f"{job.name}/w{i}") for i in range(job.workers))
    decision = decide(policy, members, checkpointable, priority=0 if platform.queue == "fifo" else None)
    common = dict(team=job.team, tier=job.tier, priority=decision.priority, preemptible=decision.preemptible,
                  checkpointable=checkpointable, spot_eligible=decision.spot_eligible, created_at=job.submit,
                  topology=TopologyRequirement(TopologyLevel.CLIQUE, hard=False),
                  expected_duration=job.work * duration_estimate if duration_estimate > 0 else None,
                  restart_overhead=decision.restart_overhead, checkpoint_seconds=job.checkpoint_seconds,
                  # fifo: one priority and arrival order, no wait bands
                  **({} if platform.queue == "fifo" else
                     {"max_wait": decision.max_wait, "band_priority": decision.band_priority}))
    if platform.gang:
        return {job.name: Gang(name=job.name, members=decision.members, **common)}
    return {m.name: Gang(name=m.name, members=(m,), **common) for m in decision.members}


def _requeued(gang: Gang, now: float) -> Gang:
    """A stopped gang back in the queue: its place (created_at) kept, its wait bound counted from now,
    as the scheduler's relaunch (a new gang) counts it; otherwise a preempted sweep would be overdue at
    once and go ahead of the production work that just preempted it, to be preempted again."""
    return gang if gang.max_wait is None else replace(gang, queued_at=now)


class _NoPlans(NoPlanMemo):
    """The no-preemption platforms: every ask is known to have no plan, so none is searched (and no
    backfill onto a reservation counts on being preempted later)."""

    def failed(self, gang: Gang, where: tuple = ()) -> bool:
        return True


class _Cycle:
    """The one adapter to core's queue: pending + running in, admissions and victims out."""

    def __init__(self, platform: Platform, profile, quota: QuotaBook | None, policy: PreemptionPolicy,
                 hold: float = 0.0, holds: PlacementHolds | None = None):
        self.platform, self.profile, self.quota = platform, profile, quota
        self.holds = holds if holds is not None and holds.enabled else None
        # no_plan: valid until the running set or the capacity changes; without preemption no plan is
        # ever searched. explain=False: the replay reads no wait reasons
        self.queue = Queue(profile, policy, Backoff(base=NEVER, cap=NEVER),
                           ReservationHold(hold, hold) if hold > 0 else None,
                           NoPlanMemo() if platform.preemption else _NoPlans(), StartMemo(), explain=False)

    def run(self, live: LiveState, pending: list[Gang], running: list[RunningGang], now: float,
            lone: Callable[[Gang], bool] = lambda g: False):
        """-> (admitted [(gang, placements, borrowed)], plans [PreemptionPlan], CycleHolds | None).
        `live` holds every running gang's capacity and quota (what CycleState.build would count);
        `running`: the same gangs as the cycle sees them now (their last checkpoint moves). With
        held placements (as Scheduler.cycle runs them): the held pods are assumed on a copy and not
        queued, admitted lone shares that strand capacity are held instead of bound, and the pods
        released or admitted by displacement are bound; `lone(gang)`: may it be held."""
        snap = live.snap.copy() if self.holds is not None else live.snap  # held pods go on a copy
        if live.ledger is not None:
            state = live.ledger.cycle_state(snap, running)
        else:
            state = CycleState(snap, None, None, running, snap.shape.node_product)
        holds = None
        if self.holds is not None:
            pending, holds = self.holds.reserve(state, pending, now)
        result = self.queue.cycle(state, pending, now)
        self.last = (state, result)  # what the scheduler publishes from (sim/start_accuracy.py)
        admitted = [(d.gang, d.placements, d.borrowed) for d in result.admitted]
        if self.holds is not None:
            holds = self.holds.after(state, result.admitted, [g for g in pending if g.name in result.waiting],
                                     {g.name for g in pending if lone(g)}, self.profile, now, holds)
            admitted = [a for a in admitted if a[0].name not in holds.kept]
            admitted += [(h.gang, (h.placement,), h.borrowed) for h in holds.bind]
        return admitted, result.preemptions, holds

    def room_appeared(self, snap: Snapshot, nodes: list[int], quota_freed: Iterable[str]) -> None:
        """Pods ended on `nodes` (or a node came back), quota usage fell on the GPU products
        `quota_freed`: the gangs this may help try again."""
        self.queue.room_appeared(snap, nodes, quota_freed)


class _Fifo:
    """kube-scheduler-like queue for the naive platform: pods in arrival order, whatever fits binds.

    Same decisions as trying every pending pod in order each cycle, without the cost of a long
    backlog: within a cycle capacity only shrinks, so when no room appeared since the last cycle
    only the new arrivals can fit; when room appeared, a vectorised fit test (CPU, memory and the
    GPU form against every node's free capacity: necessary for a fit) picks the pods worth a
    placement, in arrival order."""

    def __init__(self, units: list[Gang], profile):
        self.profile = profile
        order = sorted(range(len(units)), key=lambda i: (units[i].created_at, units[i].name))
        self.units = [units[i] for i in order]
        self.rank = {g.name: r for r, g in enumerate(self.units)}
        pods = [g.members[0] for g in self.units]
        self.cpu = np.array([p.cpu_milli for p in pods], dtype=np.int64)
        self.mem = np.array([p.memory_mib for p in pods], dtype=np.int64)
        self.gpus = np.array([p.gpus for p in pods], dtype=np.int64)
        self.milli = np.array([p.gpu_milli for p in pods], dtype=np.int64)
        self.pending = np.zeros(len(self.units), dtype=bool)
        self.new: list[int] = []  # ranks enqueued since the last cycle
        self.room = True

    def enqueue(self, name: str) -> None:
        r = self.rank[name]
        self.pending[r] = True
        self.new.append(r)

    def dequeue(self, name: str) -> None:
        self.pending[self.rank[name]] = False

    def room_appeared(self) -> None:
        self.room = True

    def _candidates(self, snap: Snapshot) -> np.ndarray:
        if not self.room:
            return np.unique(np.array([r for r in self.new if self.pending[r]], dtype=np.int64))
        idx = np.flatnonzero(self.pending)
        if not len(idx):
            return idx
        whole, share = snap.whole_free_gpus(), snap.max_gpu_free()
        fits = ((self.cpu[idx, None] <= snap.cpu_free[None, :]) & (self.mem[idx, None] <= snap.mem_free[None, :])
                & (self.gpus[idx, None] <= whole[None, :]) & (self.milli[idx, None] <= share[None, :]))
        return idx[fits.any(axis=1)]

    def run(self, snap: Snapshot):
        work = snap.copy()
        refused = RefusedAsks(by_team=False)  # capacity only shrinks within a cycle
        out = []
        for r in self._candidates(snap):
            gang = self.units[r]
            if refused.covering(gang, False) is not None:
                continue
            placement, _ = place_pod(work, gang.members[0], self.profile)
            if placement is None:
                refused.add(gang, False, "")
                if not work.gpu_free.any():
                    break  # nothing left for any GPU ask
                continue
            work.assume(placement)
            out.append((gang, (placement,), False))
        self.new.clear()
        self.room = False
        return out


class Replay:
    def __init__(self, setting: Setting, platform: Platform):
        self.setting, self.platform = setting, platform
        nodes = list(setting.nodes)
        if platform.spot:
            nodes = mark_spot(nodes, setting.spot.share, setting.seed)
        self.nodes = tuple(nodes)
        self.quota = quota_book(setting, nodes, platform)
        # what runs: capacity and quota usage kept by deltas (core.live, as the scheduler's cache);
        # the books below (placed, running) are the replay's own: jobs, attempts, checkpoints
        self.live = LiveState.from_nodes(self.nodes, self.quota)
        self.snap = self.live.snap
        workers = [j.worker if platform.shares else whole_gpus(j.worker) for j in setting.jobs]
        tie = np.random.default_rng(setting.seed + 2).permutation(len(self.nodes))
        profile = make_profile(platform.policy, typical=TypicalPods.from_pods(workers), tie_rank=tie,
                               prefer_products=False)
        policy = setting.preemption_policy
        if not platform.preemption:  # no tier preempts: nothing may backfill a reservation counting on it
            policy = replace(policy, never_preempting_tiers=frozenset(setting.tiers))
        holds = None
        if platform.hold and platform.queue == "cycle" and setting.placement_hold > 0:
            holds = PlacementHolds(setting.placement_hold, setting.placement_hold_seconds)
            holds.typical = TypicalPods.from_pods(workers)  # the profile's typical pods
        self.cycle = _Cycle(platform, profile, self.quota, policy, setting.reservation_hold, holds)
        self.hold_books = HoldBooks() if self.cycle.holds is not None else None
        self.node_product = {n.name: n.gpu_product for n in self.nodes}
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.states: dict[str, JobState] = {}
        self.job_of: dict[str, str] = {}  # unit (gang) name -> its job's name (a job's name may hold "/")
        self.pending: dict[str, Gang] = {}
        # the same gangs in queue order (core.queue.queue_order), kept sorted as gangs come and go: the
        # cycle sorts its input, and a sorted backlog of thousands costs it one pass instead of a sort
        self.queue: list[Gang] = []
        self.placed: dict[str, tuple[str, tuple[Placement, ...], float]] = {}  # unit -> (job, placements, since)
        self.attempts: list[Attempt] = []
        self.jobs_started = 0  # jobs with a first attempt: the progress reported (every job starts once at most)
        self.preemptions = self.interruptions = 0
        self.down: dict[str, Placement] = {}
        self.team_alloc: dict[str, float] = defaultdict(float)
        self.team_pending: dict[str, float] = defaultdict(float)
        self.guarantee = {t: [0.0, 0.0] for t in setting.teams}
        self.allocated = 0  # GPU milli held
        self.computing = 0  # GPU milli the running work asked for (a share on a whole GPU counts the share)
        self.util_curve: list[tuple[float, float, float, bool]] = []
        self.total_milli = sum(n.gpu_count for n in self.nodes) * GPU_MILLI
        self.guaranteed = {t: sum(self.quota.team(t).nominal.values()) if self.quota is not None
                           else self.total_milli * share for t, share in setting.teams.items()}
        self.last_t = 0.0
        self.running: dict[str, tuple[RunningGang, float]] = {}  # unit -> (as the cycle sees it, valid until)
        self.fifo: _Fifo | None = None  # the naive platform's queue (built with the jobs' units)
        if setting.estimates not in ESTIMATES:
            raise ValueError(f"estimates: {setting.estimates!r}; choose from {', '.join(ESTIMATES)}")
        record = platform.queue == "cycle" and setting.estimates != "off"
        self.recorder = StartRecorder() if record else None
        self.run_lengths = RunLengths() if record and setting.estimates in ("learned", "runs") else None
        self.calibration = StartCalibration() if record and setting.estimates == "learned" else None

    # --- events -----------------------------------------------------------------------------------
    def push(self, t: float, kind: str, what: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, what))

    def _schedule_interruptions(self, horizon: float) -> None:
        s = self.setting.spot
        rng = np.random.default_rng(self.setting.seed + 3)
        rate = s.interruptions_per_node_day / 86400
        for n in self.nodes:
            if n.capacity_type != CAPACITY_SPOT or rate <= 0:
                continue
            t = 0.0
            while True:
                t += rng.exponential(1 / rate)
                if t > horizon:
                    break
                self.push(t + s.notice_seconds, "interrupt", n.name)
                t += s.notice_seconds + s.replace_after_seconds

    # --- books ------------------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        dt = now - self.last_t
        if dt > 0:
            for team, acc in self.guarantee.items():
                guar = self.guaranteed[team]
                acc[0] += dt * min(self.team_alloc[team], guar)
                acc[1] += dt * min(self.team_alloc[team] + self.team_pending[team], guar)
        self.last_t = now

    def _enqueue(self, st: JobState, kind: str = SUBMIT, now: float = 0.0) -> None:
        if kind == REQUEUE:
            st.units = {name: _requeued(gang, now) for name, gang in st.units.items()}
        for name, gang in st.units.items():
            if self.recorder is not None:
                self.recorder.enqueued(gang, kind)
            if name in self.pending:
                self._dequeue(self.pending[name])
            self.pending[name] = gang
            bisect.insort(self.queue, gang, key=QUEUE_KEY)
            if self.fifo is not None:
                self.fifo.enqueue(name)
        self.team_pending[st.job.team] += sum(g.gpu_milli_total for g in st.units.values())

    def _dequeue(self, gang: Gang) -> None:
        i = bisect.bisect_left(self.queue, gang.queue_key, key=QUEUE_KEY)
        assert self.queue[i] is gang, gang.name
        del self.queue[i]

    def _bind(self, gang: Gang, placements: tuple[Placement, ...], borrowed: bool, now: float) -> None:
        job_name = self.job_of[gang.name]
        st = self.states[job_name]
        self.live.start(RunningGang(gang, placements, now, borrowed=borrowed))
        del self.pending[gang.name]
        self._dequeue(gang)
        if self.fifo is not None:
            self.fifo.dequeue(gang.name)
        milli = gang.gpu_milli_total
        self.team_pending[gang.team] -= milli
        self.team_alloc[gang.team] += milli
        self.allocated += milli
        self.placed[gang.name] = (job_name, placements, now)
        st.borrowed[gang.name] = borrowed
        if self.recorder is not None:
            self.recorder.started(gang.name, now)
        if self.calibration is not None:
            self.calibration.started(gang.name, now)
        if st.attempt is None:
            self.jobs_started += st.attempts == 0
            st.attempts += 1
            st.attempt = Attempt(st.job, st.attempts)
            self.attempts.append(st.attempt)
        st.attempt.holds += [(gang.name, now, p) for p in placements]
        if all(u in self.placed for u in st.units):
            st.attempt.start = now
            if st.attempts > 1:  # a restart: it computes nothing for its restart overhead first
                st.attempt.overhead = gang.restart_overhead
            self.computing += st.job.gpu_milli
            st.first_start = now if st.first_start is None else st.first_start
            if self.setting.speeds:
                st.attempt.speed = min((self.setting.speeds.get(self.node_product[p.node] or "", 1.0)
                                        for _, _, p in st.attempt.holds if p.gpu_shares or p.mig_profile), default=1.0)
            self.push(now + st.attempt.overhead + _wall(st.job.work - st.done, st.attempt.speed), "finish",
                      (job_name, st.attempts))
        aging = self.cycle.queue.policy.min_runtime_of(gang.tier) if self.platform.preemption else 0.0
        if aging > 0:  # no victim before then: once it may be one, gangs waiting for a plan try again
            self.push(now + aging, "aged", (gang.name, now))

    def _release(self, st: JobState, now: float, outcome: str) -> None:
        a = st.attempt
        freed: set[int] = set()
        products: set[str] = set()
        for unit in st.units:
            if unit in self.placed:
                _, placements, since = self.placed.pop(unit)
                self.running.pop(unit, None)
                self.live.end(unit)
                if self.run_lengths is not None:
                    self.run_lengths.record(st.job.team, st.job.tier, now - since)
                freed.update(self.snap.node_index(p.node) for p in placements)
                if self.quota is not None:
                    products.update(self.node_product[p.node] for p in placements if self.node_product[p.node])
                milli = st.units[unit].gpu_milli_total
                self.team_alloc[st.job.team] -= milli
                self.allocated -= milli
            else:
                if self.pending.pop(unit, None) is not None:
                    self._dequeue(st.units[unit])
                if self.fifo is not None:
                    self.fifo.dequeue(unit)
                self.team_pending[st.job.team] -= st.units[unit].gpu_milli_total
        a.end, a.outcome = now, outcome
        if a.start is not None:
            self.computing -= st.job.gpu_milli
        ran = 0.0 if a.start is None else _work(max(0.0, now - a.start - a.overhead), a.speed)
        if a.start is not None:
            a.restart_lost = restart_lost_gpu_seconds(st.job.gpu_milli / GPU_MILLI, a.overhead, now - a.start)
        if outcome == FINISHED:
            a.kept = ran
        elif not st.units[next(iter(st.units))].checkpointable:
            a.kept = 0.0
        else:
            s = self.setting
            grace = s.spot.notice_seconds if outcome == INTERRUPTED else s.grace_seconds
            checkpoint = st.job.checkpoint_seconds if st.job.checkpoint_seconds is not None else s.checkpoint_seconds
            committed = self.platform.sigterm_checkpoint and (outcome == FAILED
                                                              or sigterm_checkpoint_commits(checkpoint, grace))
            a.kept = work_kept_at_stop(st.done, ran, st.job.checkpoint_interval, committed)
        st.done += a.kept
        st.attempt = None
        if outcome == FINISHED:
            st.finished_at = now
        else:
            self._enqueue(st, REQUEUE, now)
        self._room_appeared(sorted(freed), products)

    def _room_appeared(self, nodes: list[int], quota_freed: Iterable[str] = ()) -> None:
        self.cycle.room_appeared(self.snap, nodes, quota_freed)
        if self.fifo is not None:
            self.fifo.room_appeared()

    def _interrupt(self, node: str, now: float) -> None:
        hit = {job for job, placements, _ in self.placed.values() if any(p.node == node for p in placements)}
        for job in sorted(hit):
            self.interruptions += 1
            self._release(self.states[job], now, INTERRUPTED)
        n = self.nodes[self.snap.node_index(node)]
        block = Placement(f"__down__/{node}", node, tuple((i, GPU_MILLI) for i in range(n.gpu_count)),
                          cpu_milli=n.cpu_milli, memory_mib=n.memory_mib)
        self.snap.assume(block)
        self.down[node] = block
        self.push(now + self.setting.spot.replace_after_seconds, "back", node)

    def _running(self, now: float) -> list[RunningGang]:
        """Running units as core sees them; each is rebuilt only when its last checkpoint moved."""
        out = []
        for unit, (job, placements, since) in self.placed.items():
            cached = self.running.get(unit)
            if cached is not None and now < cached[1]:
                out.append(cached[0])
                continue
            st = self.states[job]
            gang = st.units[unit]
            ckpt, until = None, math.inf
            a = st.attempt
            if a is None or a.start is None:
                until = -math.inf  # the gang is not complete yet: look again next cycle
            elif gang.checkpointable and st.job.checkpoint_interval > 0:
                iv = st.job.checkpoint_interval
                begin = a.start + a.overhead  # its work runs after the restart overhead
                # work runs `speed` times as fast as the clock; saved: work the last checkpoint covers
                saved = periodic_checkpoint_work(st.done + max(0.0, now - begin) * a.speed, iv)
                ckpt = begin + (saved - st.done) / a.speed
                until = begin + (saved + iv - st.done) / a.speed
                ckpt = ckpt if ckpt >= a.start else None
            rg = RunningGang(gang, placements, since, last_checkpoint_at=ckpt, borrowed=st.borrowed.get(unit, False),
                             speed=a.speed if a is not None else 1.0)
            self.running[unit] = (rg, until)
            out.append(rg)
        return out

    # --- the loop ---------------------------------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None) -> ReplayResult:
        import time

        t0, c0 = time.perf_counter(), time.process_time()
        jobs = self.setting.jobs
        horizon = measured_horizon(jobs, self.nodes)
        for j in jobs:
            self.states[j.name] = JobState(j, _unit_gangs(j, self.platform, self.setting.tiers,
                                                          self.setting.duration_estimate))
            self.job_of.update((unit, j.name) for unit in self.states[j.name].units)
            self.push(j.submit, "arrive", j.name)
        if self.platform.queue == "fifo":
            self.fifo = _Fifo([g for st in self.states.values() for g in st.units.values()], self.cycle.profile)
        if self.platform.spot:
            self._schedule_interruptions(horizon)
        handled = 0
        now = 0.0
        with _young_collections_rarely():
            while self.events:
                now = self.events[0][0]
                self._advance(now)
                while self.events and self.events[0][0] == now:
                    _, _, kind, what = heapq.heappop(self.events)
                    handled += 1
                    self._handle(kind, what, now)
                self._cycles(now)
                if progress is not None and handled % 500 < 5:
                    # jobs started, not events handled: the events grow as jobs end and restart
                    progress(self.jobs_started, len(jobs))
        if progress is not None:
            progress(len(jobs), len(jobs))  # over (a job that never started is not waited for)
        end = now
        for st in self.states.values():  # partial gangs that never completed: they held GPUs for nothing
            if st.attempt is not None:
                self._release(st, end, FAILED)
        result = ReplayResult(self.platform, self.setting, self.attempts, self.states, self.nodes, self.quota,
                              horizon, end, self.preemptions, self.interruptions,
                              {t: (a[0], a[1]) for t, a in self.guarantee.items()}, self.util_curve,
                              start_samples=None if self.recorder is None else self.recorder.samples,
                              holds=self.hold_books)
        result.seconds, result.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        return result

    def _handle(self, kind: str, what, now: float) -> None:
        if kind == "arrive":
            self._enqueue(self.states[what])
        elif kind == "finish":
            job, attempt = what
            st = self.states[job]
            if st.attempt is not None and st.attempts == attempt and st.attempt.start is not None:
                self._release(st, now, FINISHED)
        elif kind == "interrupt":
            self._interrupt(what, now)
        elif kind == "back":
            self.snap.forget(self.down.pop(what).pod)
            self._room_appeared([self.snap.node_index(what)])
        elif kind == "held":
            pass  # a held pod's time is up: this instant's cycle binds it
        elif kind == "aged":
            unit, since = what
            held = self.placed.get(unit)
            if held is not None and held[2] == since and self.pending:
                self.cycle.queue.reset()  # a new preemption candidate: plans refused before may exist now

    def _lone(self, gang: Gang) -> bool:
        """A job of one pod (never a gang's member): what may be held."""
        return len(gang.members) == 1 and len(self.states[self.job_of[gang.name]].units) == 1

    def _book_holds(self, holds, now: float) -> None:
        """Held placements this cycle: a cycle at each new hold's end (it binds then at the latest)
        and the cost of those that ended (bound now, or displaced)."""
        for h in holds.held:
            if h.gang.name in holds.kept:
                self.hold_books.held += 1
                self.push(h.until, "held", h.gang.name)
        for h in holds.bind:  # released (a pod admitted by displacement was held 0 s)
            self.hold_books.ended(h, now)
        for h in holds.displaced:
            self.hold_books.ended(h, now, displaced=True)

    def _cycles(self, now: float) -> None:
        for i in range(4):  # victims stop at once and the preemptor binds its plan; then another cycle
            if not self.pending:
                break
            if self.fifo is not None:
                admitted, plans = self.fifo.run(self.snap), []
            else:
                admitted, plans, holds = self.cycle.run(self.live, list(self.queue), self._running(now), now,
                                                        self._lone)
                if holds is not None:
                    self._book_holds(holds, now)
                if self.recorder is not None and (not plans or i == 3) and self.recorder.due(now):  # the instant's last cycle, before it binds
                    state, result = self.cycle.last
                    self.recorder.sample(state, self.queue, result, self.cycle.profile, now, self.run_lengths,
                                         self.calibration)
            for gang, placements, borrowed in admitted:
                self._bind(gang, placements, borrowed, now)
            for job in sorted({self.job_of[v.gang.name] for p in plans for v in p.victims}):
                st = self.states[job]
                if st.attempt is not None:
                    self.preemptions += 1
                    self._release(st, now, PREEMPTED)
            # As the scheduler does: the nomination holds the freed GPUs for the gang that asked, which
            # binds its plan once the victims are gone. (Re-queueing it instead let an older victim of
            # the same priority take the room back first, and preempting it again looped.)
            for plan in plans:
                if plan.gang.name in self.pending:
                    self._bind(plan.gang, plan.placements, plan.borrowed, now)
            if not plans:
                break
        waiting = any(v > 0 for v in self.team_pending.values())
        total = self.total_milli or 1
        self.util_curve.append((now, self.allocated / total, self.computing / total, waiting))


def replay(setting: Setting, platform: Platform, progress=None) -> ReplayResult:
    return Replay(setting, platform).run(progress)


# Platforms of one run share nothing but the setting, so they run in parallel processes. Slowest
# first (CPU seconds measured on openb 0.005/42, the `bench replay` setting), naive (a plain FIFO) last.
_SLOWEST_FIRST = ("no-spot-fallback", "no-mig", "no-borrowing", "interval-checkpoints", "no-gang", "no-spot",
                  "full", "bestfit-placement", "no-preemption")
_progress_queue = None  # a worker's end of the parent's progress queue (set by _init_worker)
_worker_setting: Setting | None = None  # the worker's setting, inherited at fork (set by _init_worker)


def _init_worker(queue, setting: Setting) -> None:
    global _progress_queue, _worker_setting
    _progress_queue, _worker_setting = queue, setting


def _replay_in_worker(name: str) -> bytes:
    report = None
    if _progress_queue is not None:
        def report(done: int, total: int) -> None:
            _progress_queue.put((name, done, total))
    result = replay(_worker_setting, PLATFORMS[name], report)
    with _no_gc():
        return pickle.dumps(_packed(result), protocol=pickle.HIGHEST_PROTOCOL)


@contextmanager
def _young_collections_rarely():
    """The cycle collector's youngest generation collected every 50,000 allocations, not 700: a
    cycle allocates thousands of short-lived objects and nearly none form cycles (at 20,000 jobs
    the default threshold ran 1,300 collections, 0.9 s of a 31 s replay; this one 0.2 s)."""
    was = gc.get_threshold()
    gc.set_threshold(50_000, *was[1:])
    try:
        yield
    finally:
        gc.set_threshold(*was)


@contextmanager
def _no_gc():
    """Without the cycle collector: building 100,000s of objects that all stay alive triggered it
    again and again (at 80,000 jobs, loading a result took 1.6 s with it, 0.55 s without)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_ATTEMPT_FIELDS = tuple(f.name for f in fields(Attempt))
_STATE_FIELDS = tuple(f.name for f in fields(JobState) if f.name not in ("job", "units", "attempt"))
_PLACEMENT_FIELDS = tuple(f.name for f in fields(Placement))


def _packed(r: ReplayResult) -> tuple:
    """A worker's result in plain tuples, to send to the parent: without the setting and with the jobs
    by name (the parent has them), without the queue's gangs (JobState.units: only the replay reads
    them). At 80,000 jobs the dataclasses pickled to 63 MB and took 6 s to dump and load, most of
    it after the last platform ended; these tuples pickle to 21 MB and take 1.2 s (without the
    cycle collector, _no_gc)."""
    index = {id(a): i for i, a in enumerate(r.attempts)}
    attempts = [tuple(a.job.name if f == "job" else
                      [(unit, since, _placement_tuple(p)) for unit, since, p in a.holds] if f == "holds" else
                      getattr(a, f) for f in _ATTEMPT_FIELDS) for a in r.attempts]
    states = [(name, st.job.name, index.get(id(st.attempt)), tuple(getattr(st, f) for f in _STATE_FIELDS))
              for name, st in r.jobs.items()]
    rest = {f.name: getattr(r, f.name) for f in fields(ReplayResult) if f.name not in ("setting", "attempts", "jobs")}
    return attempts, states, rest


def _placement_tuple(p: Placement) -> tuple:
    return tuple(getattr(p, f) for f in _PLACEMENT_FIELDS)


def _unpacked(packed: tuple, setting: Setting) -> ReplayResult:
    """_packed's result again, its jobs taken from `setting` by name."""
    attempts_in, states_in, rest = packed
    jobs = {j.name: j for j in setting.jobs}
    at_job, at_holds = _ATTEMPT_FIELDS.index("job"), _ATTEMPT_FIELDS.index("holds")
    attempts = []
    for values in attempts_in:
        values = list(values)
        values[at_job] = jobs[values[at_job]]
        values[at_holds] = [(unit, since, Placement(*p)) for unit, since, p in values[at_holds]]
        attempts.append(Attempt(*values))
    states = {}
    for name, job, attempt, values in states_in:
        st = JobState(jobs[job], {}, attempt=None if attempt is None else attempts[attempt])
        for f, v in zip(_STATE_FIELDS, values):
            setattr(st, f, v)
        states[name] = st
    return ReplayResult(setting=setting, attempts=attempts, jobs=states, **rest)


def replay_platforms(setting: Setting, names: list[str], jobs: int | None = None,
                     progress: Callable[[str, int, int], None] | None = None) -> list[ReplayResult]:
    """Replay `setting` on each named platform, in `jobs` processes (default: one per CPU; 1 = in this
    process). Results in the order of `names`, identical to one-by-one replays but for JobState.units
    (the queue's gangs, which only the replay reads: empty from a worker). `progress(name, done,
    total)` is called in this process as the platforms advance."""
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor

    jobs = min(jobs or os.cpu_count() or 1, len(names))
    if jobs <= 1:
        return [replay(setting, PLATFORMS[n], None if progress is None else
                       (lambda d, t, n=n: progress(n, d, t))) for n in names]
    ctx = mp.get_context("fork")  # the setting is inherited, not pickled per worker
    queue = ctx.Queue() if progress is not None else None
    order = sorted(names, key=lambda n: _SLOWEST_FIRST.index(n) if n in _SLOWEST_FIRST else len(_SLOWEST_FIRST))
    # with fork the initializer's arguments are inherited, not pickled: the setting is not sent per task
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(queue, setting)) as pool:
        futures = {n: pool.submit(_replay_in_worker, n) for n in order}
        while queue is not None and not all(f.done() for f in futures.values()):
            try:
                progress(*queue.get(timeout=0.2))
            except Empty:
                pass
        while queue is not None:  # what the last platforms said before they returned
            try:
                progress(*queue.get(timeout=0.05))
            except Empty:
                break
        results = {n: futures[n].result() for n in names}
    with _no_gc():
        return [_unpacked(pickle.loads(results[n]), setting) for n in names]

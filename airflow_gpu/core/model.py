"""The vocabulary of every decision: what is asked for, what exists, what was placed where.

Plain frozen dataclasses, shared by the scheduler, the simulator and the operator's dry run.
Units: CPU in millicores, memory in MiB, GPU shares in milli-GPU (1000 = one whole GPU), times in
seconds on whatever clock the caller runs (wall clock in the scheduler, simulated in sim/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

GPU_MILLI = 1000  # one whole GPU


def gpu_seconds_lost(gpus: float, started_at: float, until: float, last_checkpoint_at: float | None) -> float:
    """GPU-seconds of work thrown away when work started at `started_at` stops at `until`: since its
    last checkpoint (one before the start saved nothing of it), else since the start. `gpus` in any
    unit (GPUs, milli-GPUs): the result is in that unit x seconds. The one rule for preemption's cost,
    the operator's and the chargeback's lost GPU-seconds."""
    since = started_at if last_checkpoint_at is None else max(started_at, last_checkpoint_at)
    return max(0.0, until - since) * gpus


def periodic_checkpoint_work(work: float, interval: float) -> float:
    """Work seconds a periodic checkpoint (every `interval` seconds of work, > 0) has saved once `work`
    seconds of it are done: what a stop without a checkpoint of its own keeps."""
    return math.floor(work / interval) * interval


def sigterm_checkpoint_commits(checkpoint_seconds: float, grace_seconds: float) -> bool:
    """A checkpoint begun at SIGTERM is committed only if it is written within the grace period
    (SIGKILL comes then): otherwise the work since the last periodic checkpoint is lost."""
    return checkpoint_seconds <= grace_seconds


def work_kept_at_stop(done: float, ran: float, interval: float, sigterm_committed: bool) -> float:
    """Work seconds kept of an attempt stopped after `ran` seconds of work, `done` saved before it:
    all of it when its SIGTERM checkpoint commits, else what the last periodic checkpoint (every
    `interval` seconds of work; 0: none) covers. The one rule of the replay and the victim's cost."""
    if sigterm_committed:
        return ran
    if interval <= 0:
        return 0.0
    return max(0.0, periodic_checkpoint_work(done + ran, interval) - done)


def restart_lost_gpu_seconds(gpus: float, overhead: float, ran: float) -> float:
    """GPU-seconds a restarted attempt computes nothing: its restart overhead (pod start, loading the
    model and optimizer state, NCCL setup), or as much of it as the attempt ran (`ran` seconds of
    clock). Charged as lost, to the preemption or interruption that caused the restart."""
    return gpus * min(max(0.0, overhead), max(0.0, ran))


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True)
class Toleration:
    key: str = ""  # empty key with operator Exists tolerates everything
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class Node:
    """A node as the scheduler sees it: capacity, identity and topology. Free capacity lives in Snapshot."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_product: str | None = None
    gpu_memory_mib: int = 0
    mig_slices: tuple[tuple[str, int], ...] = ()  # (profile, count) in the mixed strategy
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    capacity_type: str = "on-demand"  # on-demand | spot
    zone: str = ""
    rack: str = ""
    clique: str = ""  # NVLink domain (nvidia.com/gpu.clique)

    def label(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class PodRequest:
    """One pod's ask. Exactly one GPU form is used: whole `gpus`, a shared `gpu_milli` < 1000 of one
    GPU, or one `mig_profile` slice; all zero means a CPU-only pod."""

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    mig_profile: str | None = None
    gpu_products: tuple[str, ...] = ()  # accepted products in preference order; empty = any
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    capacity_types: tuple[str, ...] = ()  # accepted node capacity types (on-demand | spot); empty = any

    def __post_init__(self) -> None:
        forms = (self.gpus > 0) + (self.gpu_milli > 0) + (self.mig_profile is not None)
        if forms > 1:
            raise ValueError(f"pod {self.name}: use one of gpus, gpu_milli or mig_profile, not several")
        if self.gpus < 0 or self.gpu_milli < 0 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"pod {self.name}: requests must not be negative")
        if self.gpu_milli >= GPU_MILLI:
            raise ValueError(f"pod {self.name}: gpu_milli={self.gpu_milli} is a whole GPU or more; use gpus")

    @property
    def gpu_milli_total(self) -> int:
        """GPU demand in milli-GPU (a MIG slice counts 0 here; its size is a config matter)."""
        return self.gpus * GPU_MILLI + self.gpu_milli

    @property
    def uses_gpu(self) -> bool:
        return bool(self.gpus or self.gpu_milli or self.mig_profile)

    @property
    def shape(self) -> tuple:
        """Everything but the name: pods of one shape are interchangeable (one pod set)."""
        return (self.cpu_milli, self.memory_mib, self.gpus, self.gpu_milli, self.mig_profile, self.gpu_products,
                self.node_selector, self.tolerations, self.capacity_types)


@dataclass(frozen=True)
class PodSet:
    """Members of a gang with one shape: the launcher, the workers (Kueue's podSets). Each set has
    its own count, request, products and node constraints."""

    request: PodRequest  # the first member; every member of the set has its shape
    count: int


class TopologyLevel(str, Enum):
    """How close a multi-node gang's members must be, tightest first."""

    NODE = "node"
    CLIQUE = "clique"
    RACK = "rack"
    ZONE = "zone"
    ANY = "any"


@dataclass(frozen=True)
class TopologyRequirement:
    level: TopologyLevel = TopologyLevel.CLIQUE
    hard: bool = False  # hard: never place wider than `level`; soft: prefer, then widen


class HashedTuple(tuple):
    """A tuple that computes its hash once (a plain tuple hashes all its items on every lookup)."""

    def __new__(cls, items) -> HashedTuple:
        t = super().__new__(cls, items)
        t._hash = tuple.__hash__(t)
        return t

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return HashedTuple, (tuple(self),)  # hashed again where it is loaded (str hashes differ per process)


@dataclass(frozen=True)
class Gang:
    """A unit of admission: all members are placed at once or none is (a PodGroup)."""

    name: str
    team: str
    tier: str
    priority: int
    members: tuple[PodRequest, ...]
    topology: TopologyRequirement = field(default_factory=TopologyRequirement)
    preemptible: bool = True
    checkpointable: bool = False
    spot_eligible: bool = False
    created_at: float = 0.0
    expected_duration: float | None = None  # seconds, if known: lets smaller gangs backfill safely
    # Nodes where members of this gang already run (a replacement of a partly bound gang): they pin
    # its topology domain, as kube-scheduler's topology placement keeps a group together.
    pinned: tuple[str, ...] = ()
    # coscheduling's minMember: at least this many members placed together (0: all of them); the
    # others may come later, in the domain the placed ones pin
    min_member: int = 0
    # Opt-in: the GPU members may straddle GPU products (some on H100, some on A100). Off by default,
    # as Kueue gives each pod set one flavor: a data-parallel job runs at the pace of its slowest GPU,
    # its collectives cross NVLink domains and its ranks see different memory sizes.
    products_mixed: bool = False
    # seconds each restart of it computes nothing (its tier's, or its own annotation): what stopping
    # it costs beyond the work lost (core.model.restart_lost_gpu_seconds); 0 for a gang built bare
    restart_overhead: float = 0.0
    # seconds its SIGTERM checkpoint takes (its own hint, else the config's default); None: unknown
    checkpoint_seconds: float | None = None
    # its tier's wait bound (core.tiers.wait_bands): None, ordered by priority; else ordered by its due
    # time (created_at + max_wait) among every bounded tier's gangs, at `band_priority`
    max_wait: float | None = None
    band_priority: int | None = None
    # when its current wait began, if not at created_at (the replay's re-queue after a stop keeps the
    # gang's place, created_at; the scheduler's relaunch is a new gang): its due time counts from it
    queued_at: float | None = None

    @cached_property
    def gpu_milli_total(self) -> int:
        return sum(m.gpu_milli_total for m in self.members)

    @cached_property
    def product_variants(self) -> dict:
        """core.gang.only_products' answers for this gang, per product list (built once each)."""
        return {}

    @cached_property
    def pod_sets(self) -> tuple[PodSet, ...]:
        """Members grouped by shape, largest GPU ask first (the hardest to fit)."""
        first: dict[tuple, PodRequest] = {}
        counts: dict[tuple, int] = {}
        for m in self.members:
            first.setdefault(m.shape, m)
            counts[m.shape] = counts.get(m.shape, 0) + 1
        sets = [PodSet(first[k], counts[k]) for k in first]
        return tuple(sorted(sets, key=lambda ps: (-ps.request.gpu_milli_total, -ps.request.cpu_milli)))

    @cached_property
    def uses_gpu(self) -> bool:
        return any(m.uses_gpu for m in self.members)

    @cached_property
    def largest_first(self) -> tuple[PodRequest, ...]:
        """Its members, largest first (stable): the hardest to fit are placed first, small ones
        fill around them. Kept: a gang waiting is placed in most cycles."""
        return tuple(sorted(self.members, key=lambda m: (-m.gpu_milli_total, -m.cpu_milli, -m.memory_mib)))

    @cached_property
    def ask(self) -> tuple:
        """Its members' shapes in member order (everything but their names): gangs of one ask and
        team are charged and refused by quota alike."""
        return tuple(m.shape for m in self.members)

    @cached_property
    def plan_ask(self) -> HashedTuple:
        """What a preemption plan search reads of it (core.backoff.NoPlanMemo): gangs of one plan ask
        get one answer. Hashed once: a cycle over a long backlog looks it up for every gang."""
        return HashedTuple((self.team, self.tier, self.priority, self.topology, self.min_member, self.pinned,
                            self.pod_set_shapes, self.products_mixed))

    @cached_property
    def pod_set_shapes(self) -> tuple:
        """(shape, count) of each pod set: what placement and a preemption plan read of its members."""
        return tuple((ps.request.shape, ps.count) for ps in self.pod_sets)

    @cached_property
    def due_at(self) -> float | None:
        """When its tier's wait bound is up (its current wait's start + max_wait); None: its tier has
        no bound. From then on it keeps its place ahead of gangs of the band submitted later."""
        if self.max_wait is None or self.band_priority is None:
            return None
        return (self.created_at if self.queued_at is None else self.queued_at) + self.max_wait

    @cached_property
    def queue_key(self) -> tuple[int, float, str]:
        """Its place in the queue (core.queue.queue_order): priority first, then first come first served;
        a gang of a tier with a wait bound by its due time, in the bounded tiers' band (core.tiers.wait_bands)."""
        if self.due_at is not None:
            return (-self.band_priority, self.due_at, self.name)
        return (-self.priority, self.created_at, self.name)


@dataclass(frozen=True)
class Placement:
    """Where one pod goes: the node, and for GPU pods which GPUs and how much of each."""

    pod: str
    node: str
    gpu_shares: tuple[tuple[int, int], ...] = ()  # (gpu index on the node, milli taken)
    mig_profile: str | None = None
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class RunningGang:
    """An admitted gang as preemption and quota accounting see it."""

    gang: Gang
    placements: tuple[Placement, ...]
    started_at: float
    last_checkpoint_at: float | None = None  # None: never checkpointed (all work since start is at risk)
    borrowed: bool = False  # admitted on another team's idle quota: first to be reclaimed
    # relative speed of the GPU product it runs on (core.quota.placement_speed): its expected
    # duration is declared for the reference product (1.0) and lasts duration / speed here
    speed: float = 1.0

    @property
    def expected_end(self) -> float | None:
        d = self.gang.expected_duration
        if d is None:
            return None
        return self.started_at + (d if self.speed == 1.0 else d / self.speed)

    def gpu_seconds_at_risk(self, now: float) -> float:
        """GPU-seconds of work lost if the gang stopped now: since its last checkpoint, or since start."""
        ckpt = self.last_checkpoint_at if (self.gang.checkpointable and self.last_checkpoint_at) else None
        return gpu_seconds_lost(self.gang.gpu_milli_total, self.started_at, now, ckpt) / GPU_MILLI

    def restart_cost(self) -> float:
        """GPU-seconds its next restart will compute nothing (its whole restart overhead)."""
        overhead = self.gang.restart_overhead
        return restart_lost_gpu_seconds(self.gang.gpu_milli_total / GPU_MILLI, overhead, overhead)

    def preemption_cost(self, now: float) -> float:
        """GPU-seconds stopping it now costs: the work at risk plus the restart it will pay
        (core.preemption.victim_order's "loses least work")."""
        return self.gpu_seconds_at_risk(now) + self.restart_cost()

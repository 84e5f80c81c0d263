"""Guaranteed quotas per team and GPU product, and borrowing of idle quota (Kueue cohort semantics).

Pure: plain dataclasses in, verdicts out. The YAML config (airflow_gpu.config) is converted by the
caller with `QuotaBook.from_teams(cfg.teams)`; core never loads files.

Units. A quota key is `(product, None)` for whole and shared GPUs, counted in milli-GPU (1000 = one
GPU), or `(product, mig_profile)` for MIG slices, counted in instances. Products are the quota
config's names (e.g. "a100-80gb"); `QuotaBook.aliases` maps a node's `gpu_product` label to them.

Semantics, per key and per cohort (all teams share the cohort "default" unless told otherwise):
- nominal N: the team's guaranteed quota; borrowing limit B: how far above N it may go (absent = 0);
  lending limit L: how much of N others may borrow (absent = all of N). G = N - L is never lent.
- A team's usage up to G is its own; usage above G draws on the cohort pool, whose size is the sum of
  every member's L. So a team within N can still be short when others borrowed its lendable part:
  it then reclaims by preempting borrowers (see core.preemption).
- A gang fits when the team stays within N + B and the cohort pool is not over-drawn. It is
  *guaranteed* if the team stays within N on every key, else *borrowed* (runs at best-effort priority
  and is reclaimed first).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from airflow_gpu.core.model import GPU_MILLI, Gang, Placement, RunningGang

QuotaKey = tuple[str, str | None]  # (product, MIG profile or None for whole/shared GPUs)
Demand = dict[QuotaKey, int]
DEFAULT_COHORT = "default"

# Kueue's flavorFungibility.whenCanBorrow: on a product where the gang fits only by borrowing, stop
# there (MayStopSearch, Kueue's default) or try the next product first (TryNextFlavor, and come
# back to the first borrowing product when none fits without borrowing). whenCanPreempt is always
# Kueue's default TryNextFlavor: admission tries every product before a preemption is planned.
MAY_STOP_SEARCH = "MayStopSearch"
TRY_NEXT_FLAVOR = "TryNextFlavor"


def key_name(key: QuotaKey) -> str:
    product, profile = key
    return product if profile is None else f"{product} {profile} MIG slices"


def fmt_amount(key: QuotaKey, amount: int) -> str:
    """Milli-GPU as GPUs ("8", "7.5"); MIG instances as a count."""
    if key[1] is not None:
        return str(amount)
    gpus = amount / GPU_MILLI
    return str(int(gpus)) if gpus == int(gpus) else f"{gpus:g}"


@dataclass(frozen=True)
class TeamQuota:
    team: str
    nominal: Mapping[QuotaKey, int] = field(default_factory=dict)
    borrowing_limit: Mapping[QuotaKey, int] = field(default_factory=dict)  # absent key = 0
    lending_limit: Mapping[QuotaKey, int] = field(default_factory=dict)  # absent key = all of nominal
    cohort: str = DEFAULT_COHORT
    # Kueue's borrowWithinCohort (opt-in): while borrowing, this team may preempt other teams'
    # borrowers of lower priority up to this one. None: off (Kueue's default).
    borrow_within_cohort: int | None = None
    when_can_borrow: str = MAY_STOP_SEARCH  # Kueue's flavorFungibility.whenCanBorrow
    # Kueue's rule: a gang may preempt only if it fits within the nominal quota on its own (on
    # some accepted product). True keeps the older behaviour: a gang larger than the nominal quota
    # preempts its own team's lower-priority gangs to borrow the rest.
    preempt_beyond_nominal: bool = False

    def __post_init__(self) -> None:
        if self.when_can_borrow not in (MAY_STOP_SEARCH, TRY_NEXT_FLAVOR):
            raise ValueError(f"team {self.team}: when_can_borrow must be {MAY_STOP_SEARCH} or {TRY_NEXT_FLAVOR} "
                             f"(got {self.when_can_borrow!r})")
        for what, table in (("quota", self.nominal), ("borrowing_limit", self.borrowing_limit),
                            ("lending_limit", self.lending_limit)):
            for key, amount in table.items():
                if amount < 0:
                    raise ValueError(f"team {self.team}: {what}[{key_name(key)}] = {amount} must be >= 0")

    @classmethod
    def from_gpus(
        cls,
        team: str,
        quota: Mapping[str, float] | None = None,
        borrowing_limit: Mapping[str, float] | None = None,
        lending_limit: Mapping[str, float] | None = None,
        mig_quota: Mapping[str, Mapping[str, int]] | None = None,
        cohort: str = DEFAULT_COHORT,
        borrow_within_cohort: int | None = None,
        when_can_borrow: str = MAY_STOP_SEARCH,
        preempt_beyond_nominal: bool = False,
    ) -> TeamQuota:
        """Build from the config's units: whole GPUs per product, MIG instances per product and profile."""

        def milli(table: Mapping[str, float] | None) -> dict[QuotaKey, int]:
            return {(p, None): round(g * GPU_MILLI) for p, g in (table or {}).items()}

        nominal = milli(quota)
        for product, profiles in (mig_quota or {}).items():
            for profile, count in profiles.items():
                nominal[(product, profile)] = int(count)
        return cls(team, nominal, milli(borrowing_limit), milli(lending_limit), cohort, borrow_within_cohort,
                   when_can_borrow, preempt_beyond_nominal)

    def n(self, key: QuotaKey) -> int:
        return self.nominal.get(key, 0)

    def b(self, key: QuotaKey) -> int:
        return self.borrowing_limit.get(key, 0)

    def kept(self, key: QuotaKey) -> int:
        """Part of the nominal quota never lent to others (G = N - L)."""
        n = self.n(key)
        return n - min(n, self.lending_limit.get(key, n))


@dataclass(frozen=True)
class QuotaBook:
    """Every team's quota. `borrowed_priority` is the priority a borrowed gang runs at for preemption."""

    teams: Mapping[str, TeamQuota]
    aliases: Mapping[str, str] = field(default_factory=dict)  # node gpu_product label -> quota product
    borrowed_priority: int | None = None  # None: borrowed gangs keep their own priority
    # Normalised units: node gpu_product label -> GPUs of quota one GPU of it costs (H100 = 2.5 when
    # A100 = 1). Alias several labels to one quota product to share one normalised quota.
    weights: Mapping[str, float] = field(default_factory=dict)
    # quota product -> relative speed (the reference product = 1.0): a gang's expected duration is
    # declared for the reference product and lasts duration / speed on another
    speeds: Mapping[str, float] = field(default_factory=dict)
    # quota product -> its rank in the platform's product order (lower first); empty: each gang's
    # own order (the author's). See airflow_gpu.config's scheduling.product_order.
    product_rank: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_teams(cls, teams: Iterable[object], aliases: Mapping[str, str] | None = None,
                   borrowed_priority: int | None = None, speeds: Mapping[str, float] | None = None,
                   product_rank: Mapping[str, int] | None = None) -> QuotaBook:
        """From objects shaped like airflow_gpu.config.Team (name, quota, borrowing_limit, lending_limit,
        mig_quota), duck-typed so that core does not import the config layer."""
        book = {}
        for t in teams:
            tq = TeamQuota.from_gpus(t.name, t.quota, t.borrowing_limit, t.lending_limit,  # type: ignore[attr-defined]
                                     getattr(t, "mig_quota", None), getattr(t, "cohort", DEFAULT_COHORT),
                                     getattr(t, "borrow_within_cohort", None),
                                     getattr(t, "when_can_borrow", MAY_STOP_SEARCH),
                                     getattr(t, "preempt_beyond_nominal", False))
            book[tq.team] = tq
        return cls(book, dict(aliases or {}), borrowed_priority, speeds=dict(speeds or {}),
                   product_rank=dict(product_rank or {}))

    def weight(self, node_product: str | None) -> float:
        return self.weights.get(node_product, 1.0) if node_product is not None else 1.0

    def product(self, node_product: str | None) -> str | None:
        if node_product is None:
            return None
        return self.aliases.get(node_product, node_product)

    def speed(self, node_product: str | None) -> float:
        """Relative speed of a node GPU product (1.0: the reference, or unknown)."""
        return self.speeds.get(self.product(node_product), 1.0) if node_product is not None else 1.0

    def team(self, name: str) -> TeamQuota | None:
        return self.teams.get(name)

    def cohort_members(self, cohort: str) -> tuple[TeamQuota, ...]:
        return self._cohorts.get(cohort, ())

    @cached_property
    def _cohorts(self) -> dict[str, tuple[TeamQuota, ...]]:
        """Cohort -> its teams, grouped once (every quota check of every admission reads it)."""
        out: dict[str, list[TeamQuota]] = defaultdict(list)
        for t in self.teams.values():
            out[t.cohort].append(t)
        return {c: tuple(ts) for c, ts in out.items()}

    def pool_shape(self, cohort: str, key: QuotaKey) -> tuple[int, tuple[tuple[str, int], ...]]:
        """(size of the cohort's lendable pool for `key`, (team, kept quota) per member): static, so
        built once per key (pool_state runs in every quota check of every admission)."""
        shape = self._pool_shapes.get((cohort, key))
        if shape is None:
            members = self.cohort_members(cohort)
            kept = tuple((t.team, t.kept(key)) for t in members)
            shape = self._pool_shapes[(cohort, key)] = (sum(t.n(key) for t in members) - sum(k for _, k in kept), kept)
        return shape

    @cached_property
    def _pool_shapes(self) -> dict[tuple[str, QuotaKey], tuple[int, tuple[tuple[str, int], ...]]]:
        return {}

    def effective_priority(self, running: RunningGang) -> int:
        if running.borrowed and self.borrowed_priority is not None:
            return min(running.gang.priority, self.borrowed_priority)
        return running.gang.priority


def demand_of_placements(placements: Iterable[Placement], node_product: Mapping[str, str | None],
                         book: QuotaBook | None = None) -> Demand:
    """Quota demand of placed pods; `node_product` maps node name -> its gpu_product label."""
    out: Demand = defaultdict(int)
    for p in placements:
        label = node_product.get(p.node)
        product = book.product(label) if book is not None else label
        if product is None:
            continue
        if p.mig_profile is not None:
            out[(product, p.mig_profile)] += 1
        else:
            milli = sum(m for _, m in p.gpu_shares)
            if milli:
                out[(product, None)] += round(milli * book.weight(label)) if book is not None else milli
    return dict(out)


def placement_speed(placements: Iterable[Placement], node_product: Mapping[str, str | None],
                    book: QuotaBook | None) -> float:
    """Relative speed of a gang where it is placed: its slowest GPU's product (a data-parallel job
    runs at the pace of its slowest rank); 1.0 without speeds or without GPUs."""
    if book is None or not book.speeds:
        return 1.0
    return min((book.speed(node_product.get(p.node)) for p in placements if p.gpu_shares or p.mig_profile),
               default=1.0)


def demand_on_product(gang: Gang, product: str, weight: float = 1.0, label: str | None = None) -> Demand:
    """Quota demand of a gang if its GPU members ran on `product` (a quota product name), each GPU
    costing `weight` GPUs of quota (normalised units). With `label` (the node product), only the
    members that accept it count: a pod set bound to another product is charged there."""
    out: Demand = defaultdict(int)
    for ps in gang.pod_sets:  # members of a set are alike: one charge times the count
        m = ps.request
        if label is not None and m.gpu_products and label not in m.gpu_products:
            continue
        if m.mig_profile is not None:
            out[(product, m.mig_profile)] += ps.count
        elif m.gpu_milli_total:
            out[(product, None)] += round(m.gpu_milli_total * weight) * ps.count
    return dict(out)


@dataclass
class QuotaUsage:
    """What each team uses now, per key. Mutable; copy() before trying things."""

    used: dict[str, dict[QuotaKey, int]] = field(default_factory=dict)
    version: int = field(default=0, compare=False)  # counts changes (add, remove): answers kept per state

    def copy(self) -> QuotaUsage:
        return QuotaUsage({t: dict(d) for t, d in self.used.items()})

    def of(self, team: str, key: QuotaKey) -> int:
        return self.used.get(team, {}).get(key, 0)

    def add(self, team: str, demand: Mapping[QuotaKey, int]) -> None:
        d = self.used.setdefault(team, {})
        self.version += 1
        for k, v in demand.items():
            d[k] = d.get(k, 0) + v

    def remove(self, team: str, demand: Mapping[QuotaKey, int]) -> None:
        d = self.used.setdefault(team, {})
        self.version += 1
        for k, v in demand.items():
            left = d.get(k, 0) - v
            if left < 0:
                raise ValueError(f"team {team}: releasing {fmt_amount(k, v)} {key_name(k)} more than it uses")
            d[k] = left

    @classmethod
    def from_running(cls, running: Iterable[RunningGang], node_product: Mapping[str, str | None],
                     book: QuotaBook | None = None) -> QuotaUsage:
        usage = cls()
        for rg in running:
            usage.add(rg.gang.team, demand_of_placements(rg.placements, node_product, book))
        return usage


@dataclass(frozen=True)
class QuotaVerdict:
    fits: bool
    borrowed: bool = False  # fits only by borrowing idle quota of the cohort
    reason: str = ""  # why it does not fit, in words for a human
    reclaimable: bool = False  # does not fit now, but would once borrowers in the cohort gave quota back
    own_excess: bool = False  # over the team's own ceiling: only the team's own gangs can make room
    # refused by the cohort pool (not the team's own ceiling): the key and the pool's size, so that a
    # caller who knows the cluster can tell a pool as large as the cluster (a capacity shortage)
    pool_key: QuotaKey | None = None
    pool_size: int = 0


def pool_state(book: QuotaBook, usage: QuotaUsage, cohort: str, key: QuotaKey) -> tuple[int, int]:
    """(size of the cohort's lendable pool, how much of it is drawn) for one key."""
    size, kept = book.pool_shape(cohort, key)
    return size, sum(max(0, usage.of(team, key) - k) for team, k in kept)


def check(book: QuotaBook, usage: QuotaUsage, team: str, demand: Mapping[QuotaKey, int]) -> QuotaVerdict:
    """May `team` take `demand` on top of `usage`? Every key must fit; the first refusal is the reason."""
    demand = {k: v for k, v in demand.items() if v > 0}
    if not demand:
        return QuotaVerdict(True)
    tq = book.team(team)
    if tq is None:
        known = ", ".join(sorted(book.teams)) or "none"
        return QuotaVerdict(False, reason=f"team quota: team {team!r} has no quota (teams with quota: {known})",
                            own_excess=True)
    borrowed = False
    for key, d in sorted(demand.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        n, b, g = tq.n(key), tq.b(key), tq.kept(key)
        u = usage.of(team, key)
        after = u + d
        if after > n + b:
            limit = f"{fmt_amount(key, n)} {key_name(key)}"
            if b:
                limit += f" (+{fmt_amount(key, b)} borrowable)"
            return QuotaVerdict(False, reason=f"team quota: {team} uses {fmt_amount(key, u)} of {limit}; "
                                              f"gang needs {fmt_amount(key, d)}", own_excess=True)
        size, drawn = pool_state(book, usage, tq.cohort, key)
        extra = max(0, after - g) - max(0, u - g)
        if drawn + extra > size:
            idle = max(0, size - drawn)
            if after <= n:
                # Within its guarantee: short only because others borrowed its lendable part.
                return QuotaVerdict(False, reason=f"team quota: {team} uses {fmt_amount(key, u)} of "
                                                  f"{fmt_amount(key, n)} {key_name(key)} but other teams borrowed it; "
                                                  f"reclaiming {fmt_amount(key, drawn + extra - size)}",
                                    reclaimable=True, pool_key=key, pool_size=size)
            return QuotaVerdict(False, reason=f"cohort quota: {team} would borrow "
                                              f"{fmt_amount(key, after - n)} {key_name(key)} beyond its "
                                              f"{fmt_amount(key, n)}; {fmt_amount(key, idle)} idle in cohort "
                                              f"{tq.cohort}", pool_key=key, pool_size=size)
        if after > n:
            borrowed = True
    return QuotaVerdict(True, borrowed=borrowed)


def borrowing(book: QuotaBook, usage: QuotaUsage, team: str, keys: Iterable[QuotaKey]) -> bool:
    """Is `team` above its guarantee now on one of `keys`? (Kueue: the ClusterQueue borrows; what
    counts is its usage now, not how its workloads were admitted.)"""
    tq = book.team(team)
    return any(usage.of(team, k) > (tq.n(k) if tq else 0) for k in keys)


def within_limits(book: QuotaBook, usage: QuotaUsage) -> list[str]:
    """Invariant check: every team within N + B and every cohort pool not over-drawn. Returns violations."""
    bad = []
    keys = {k for d in usage.used.values() for k in d} | {k for t in book.teams.values() for k in t.nominal}
    for team, d in usage.used.items():
        tq = book.team(team)
        for key, u in d.items():
            if u and (tq is None or u > tq.n(key) + tq.b(key)):
                bad.append(f"{team} uses {fmt_amount(key, u)} {key_name(key)} over its ceiling")
    for cohort in {t.cohort for t in book.teams.values()}:
        for key in keys:
            size, drawn = pool_state(book, usage, cohort, key)
            if drawn > size:
                bad.append(f"cohort {cohort} pool for {key_name(key)} over-drawn: {drawn} of {size}")
    return bad

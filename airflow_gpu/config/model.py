"""Pydantic models of the quota configuration. Pure data: no I/O, no Airflow, no Kubernetes client.

Units:
- GPU counts in the file (quota, borrowing and lending limits, capacity) are whole GPUs.
- MIG quota counts are instances of one profile (e.g. 14 x 1g.10gb).
- Airflow pool slots are *slices*: one slot = 1/7 GPU (`SLOTS_PER_GPU`). A100 and H100 MIG split a GPU
  into at most seven compute slices and every MIG profile is named by its compute slices ("3g.40gb" =
  3 of 7), so a whole GPU is 7 slots and every profile an integer number of slots proportional to its
  compute share. A profile may declare `slices` explicitly to charge by memory instead.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from airflow_gpu import constants
from airflow_gpu.core.tiers import TIER_CLASS_GUARANTEED, TierPolicy, priority_class_name, tier_class, wait_bands

SLOTS_PER_GPU = 7
"""Airflow pool slots per whole GPU: one slot is one MIG compute slice (1/7 GPU)."""


def format_gpus(slots: int) -> str:
    """Slots -> GPUs for people: 56 -> '8', 59 -> '8 3/7'."""
    whole, rest = divmod(slots, SLOTS_PER_GPU)
    return f"{whole}" if not rest else f"{whole} {rest}/{SLOTS_PER_GPU}"


# Kubernetes user-defined PriorityClass values must not exceed one billion (higher is reserved).
MAX_USER_PRIORITY = 1_000_000_000

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MIG_PROFILE = r"^([1-7])g\.([1-9][0-9]*)gb$"
# a Kubernetes label value (what nvidia.com/gpu.product holds): 1-63 of A-Z a-z 0-9 - _ ., alphanumeric ends
LABEL_VALUE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

MAX_GPUS = 1_000_000  # per team and product: far above any cluster, far below what overflows quota arithmetic
# the cluster's own namespaces and the scheduler's (its plan records): never a team's
RESERVED_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", constants.DEFAULT_SCHEDULER_NAMESPACE})
GpuCount = Annotated[StrictInt, Field(ge=0, le=MAX_GPUS)]
"""A whole, non-negative number of GPUs (2.5, -1 and "8" are rejected)."""
InstanceCount = Annotated[StrictInt, Field(ge=0, le=7 * MAX_GPUS)]
Money = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=7 * 86400, allow_inf_nan=False)]


class _Strict(BaseModel):
    # Unknown keys are errors (a typo must not silently drop a quota); models are immutable.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(_Strict):
    """Price of one GPU-hour, in the currency of the chargeback ledger."""

    on_demand: Money
    spot: Money


class MigProfile(_Strict):
    """A MIG profile offered on a product, e.g. `1g.10gb` (Kubernetes resource nvidia.com/mig-1g.10gb)."""

    name: Annotated[str, Field(pattern=MIG_PROFILE)]
    memory_gb: Annotated[float, Field(gt=0, allow_inf_nan=False)]  # default: from the name ("10gb")
    slices: Annotated[StrictInt, Field(ge=1, le=SLOTS_PER_GPU)]  # pool slots; default: the name's "Ng"

    @model_validator(mode="before")
    @classmethod
    def _defaults_from_name(cls, data):
        match = re.match(MIG_PROFILE, data.get("name", "")) if isinstance(data, dict) and isinstance(
            data.get("name"), str) else None
        if match:  # a bad name is reported by the field pattern
            data = {"slices": int(match.group(1)), "memory_gb": float(match.group(2)), **data}
        return data

    @property
    def resource(self) -> str:
        """Extended resource name under the NVIDIA device plugin's mixed MIG strategy."""
        return f"{constants.RESOURCE_MIG_PREFIX}{self.name}"

    @property
    def gpu_fraction(self) -> float:
        return self.slices / SLOTS_PER_GPU


class GpuProduct(_Strict):
    """A GPU model offered by the cluster (one Airflow pool per team and product)."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=40)]
    memory_gb: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    relative_speed: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0  # A100 = 1.0
    price_per_gpu_hour: Price
    mig_profiles: list[MigProfile] = []
    # value of nvidia.com/gpu.product on its nodes, e.g. NVIDIA-A100-SXM4-80GB
    node_label: Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)] | None = None

    def mig_profile(self, name: str) -> MigProfile:
        for profile in self.mig_profiles:
            if profile.name == name:
                return profile
        allowed = ", ".join(p.name for p in self.mig_profiles) or "none"
        raise KeyError(f"product {self.name!r} has no MIG profile {name!r} (profiles: {allowed})")


class Tier(_Strict):
    """A workload tier; rendered as a Kubernetes PriorityClass `airflow-gpu-<name>`."""

    name: Literal[constants.TIERS]  # type: ignore[valid-type]  # the four tiers, one name each
    priority: Annotated[StrictInt, Field(ge=-MAX_USER_PRIORITY, le=MAX_USER_PRIORITY)]
    preemptible: StrictBool  # may be chosen as a preemption victim
    spot_eligible: StrictBool  # may run on spot capacity (checkpointable and retriable work only)
    # not spot-eligible, yet its checkpointable work may take spot capacity when no on-demand room is
    # left (placed on-demand first): DESIGN.md's production "spot only if allowed and slack remains"
    spot_fallback: StrictBool = False
    # while its team borrows, preempt other teams' borrowers of lower priority (Kueue's
    # borrowWithinCohort, threshold just below this tier); a team's own borrow_within_cohort wins
    borrow_within_cohort: StrictBool = False
    # waiting behind another gang's head-of-line reservation, the first refused gang of each team may
    # still preempt (off the reserved nodes), as each Kueue ClusterQueue's head may in every cycle
    preempt_behind_head: StrictBool = False
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"
    # seconds each restart of its gangs computes nothing (pod start, loading state, NCCL setup);
    # absent: scheduling.restart_overhead_seconds. Charged as lost GPU-seconds, counted by victim choice
    restart_overhead_seconds: Seconds | None = None
    # a gang of this tier is no preemption victim before it ran this long (0: off): bounds thrashing
    min_runtime_seconds: Seconds = 0.0
    # true: reclaim of borrowed quota (a team taking back its guarantee) ignores min_runtime_seconds
    reclaim_ignores_min_runtime: StrictBool = False
    # wait bound: its gangs are due at submission + this and are queued by due time among the gangs of
    # every tier with a bound (core.tiers.wait_bands); absent: queued by priority alone. Queue order only
    max_wait_seconds: Seconds | None = None
    description: str = ""

    @property
    def priority_class_name(self) -> str:
        return priority_class_name(self.name)


class Team(_Strict):
    """A team: its namespace and per-product GPU quota (guaranteed), borrowing and lending limits.

    Kueue cohort semantics: `quota` is guaranteed; a team may use up to `quota + borrowing_limit` GPUs
    of a product by borrowing idle quota (reclaimed by preemption); `lending_limit` caps how much of its
    own idle quota others may borrow. Absent borrowing limit = 0 (no borrowing), absent lending limit =
    the whole quota.
    """

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=50)]
    namespace: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    airflow_team: Annotated[str, Field(min_length=1, max_length=50)] | None = None  # multi_team name
    quota: dict[str, GpuCount] = {}
    mig_quota: dict[str, dict[str, InstanceCount]] = {}  # product -> MIG profile -> instances
    borrowing_limit: dict[str, GpuCount] = {}
    lending_limit: dict[str, GpuCount] = {}
    tiers: list[str] | None = None  # tiers this team may submit; None = all
    cohort: Annotated[str, Field(pattern=DNS_LABEL)] = "default"  # teams that lend to each other
    # Kueue's borrowWithinCohort: while borrowing, preempt other teams' borrowers of lower priority
    # up to this priority. Absent: off (Kueue's default; reclaim within the guarantee still works).
    borrow_within_cohort: int | None = None
    # Kueue's flavorFungibility.whenCanBorrow for a gang accepting several products: MayStopSearch
    # (default) takes the first product it fits on, borrowing or not; TryNextFlavor first tries the
    # next products for one it fits on without borrowing
    when_can_borrow: Literal["MayStopSearch", "TryNextFlavor"] = "MayStopSearch"
    # Kueue's rule: only a gang that fits within the team's nominal quota on its own may preempt.
    # true keeps the older behaviour: a gang larger than the quota preempts the team's own
    # lower-priority gangs in order to borrow the rest
    preempt_beyond_nominal: StrictBool = False

    @model_validator(mode="after")
    def _own_namespace(self) -> "Team":
        if self.namespace in RESERVED_NAMESPACES or self.namespace.startswith("kube-"):
            raise ValueError(f"namespace {self.namespace!r} belongs to the cluster or to airflow-gpu itself, not to a "
                             f"team: give team {self.name!r} a namespace of its own (e.g. team-{self.name})")
        return self

    @property
    def airflow_team_name(self) -> str:
        return self.airflow_team or self.name

    def quota_gpus(self, product: str) -> int:
        return self.quota.get(product, 0)

    def borrowing_gpus(self, product: str) -> int:
        return self.borrowing_limit.get(product, 0)

    def lending_gpus(self, product: str) -> int:
        return self.lending_limit.get(product, self.quota_gpus(product))

    def ceiling_gpus(self, product: str) -> int:
        """Most whole GPUs of `product` the team may hold at once: own quota plus what it may borrow."""
        return self.quota_gpus(product) + self.borrowing_gpus(product)

    def mig_instances(self, product: str, profile: str) -> int:
        return self.mig_quota.get(product, {}).get(profile, 0)

    def products(self) -> list[str]:
        """Products the team has any quota entry for (file order, whole GPUs first, then MIG)."""
        names = list(self.quota)
        names += [p for p in self.borrowing_limit if p not in names]
        names += [p for p in self.mig_quota if p not in names]
        return names

    def allows_tier(self, tier: str) -> bool:
        return self.tiers is None or tier in self.tiers


class Scheduling(_Strict):
    """How the scheduler's queue behaves. The replay (`airflow-gpu simulate replay`) reads the same
    section, so the policy it measures is the one the scheduler runs."""

    # core.reservation.ReservationHold: a head of line whose start cannot be estimated (it waits on work of
    # unknown duration) holds its nodes' free GPUs at most this long in a row, then pauses as long;
    # 0 = hold for as long as it waits (EASY backfilling without a bound)
    reservation_hold_seconds: Annotated[float, Field(ge=0, le=7 * 86400, allow_inf_nan=False)] = \
        constants.DEFAULT_RESERVATION_HOLD_SECONDS
    # the order a gang accepting several GPU products tries them in: `author` (its own list),
    # `listed` (the products' order in this file), `cheapest_per_work` (on-demand price per GPU-hour /
    # relative_speed, lowest first), `fastest` (relative_speed, highest first)
    product_order: Literal["author", "listed", "cheapest_per_work", "fastest"] = "author"
    # seconds each restart of a stopped gang computes nothing (the default of every tier; a tier's
    # restart_overhead_seconds and a gang's annotation win): charged as lost GPU-seconds
    restart_overhead_seconds: Seconds = constants.DEFAULT_RESTART_OVERHEAD_SECONDS
    # seconds a SIGTERM checkpoint takes when the gang declares none: it is lost (and the work since
    # the last periodic checkpoint with it) when the pod's grace period is shorter
    checkpoint_seconds: Seconds = constants.DEFAULT_CHECKPOINT_SECONDS
    # tier -> how far off the published estimated start may be, in seconds: the p90 absolute error
    # `airflow-gpu simulate replay --error-table FILE` measured on this cluster's history. The queue
    # shows each estimate as an interval of +/- this; a tier not listed shows the estimate alone
    estimate_error_seconds: dict[str, Annotated[float, Field(ge=0, le=365 * 86400, allow_inf_nan=False)]] = {}


class QuotaConfig(_Strict):
    """The whole file. Cross-references are checked by `airflow_gpu.config.load` before this is built."""

    version: Literal[1] = 1
    products: Annotated[list[GpuProduct], Field(min_length=1)]
    tiers: list[Tier]
    teams: list[Team] = []
    capacity: dict[str, GpuCount] | None = None  # declared whole GPUs per product in the cluster
    scheduling: Scheduling = Scheduling()

    def product(self, name: str) -> GpuProduct:
        for product in self.products:
            if product.name == name:
                return product
        raise KeyError(f"unknown GPU product {name!r} (products: {', '.join(p.name for p in self.products)})")

    def tier(self, name: str) -> Tier:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(f"unknown tier {name!r} (tiers: {', '.join(t.name for t in self.tiers)})")

    def team(self, name: str) -> Team:
        for team in self.teams:
            if team.name == name:
                return team
        raise KeyError(f"unknown team {name!r} (teams: {', '.join(t.name for t in self.teams)})")

    def tier_policies(self) -> dict[str, TierPolicy]:
        """The one adapter from this file to core's tier rule: tier name -> core.tiers.TierPolicy."""
        overhead = self.scheduling.restart_overhead_seconds
        return wait_bands({t.name: TierPolicy(
            t.priority, t.preemptible, t.spot_eligible, t.preemption_policy != "Never", t.spot_fallback,
            t.borrow_within_cohort, t.preempt_behind_head,
            t.restart_overhead_seconds if t.restart_overhead_seconds is not None else overhead,
            t.min_runtime_seconds, t.reclaim_ignores_min_runtime, t.max_wait_seconds) for t in self.tiers})

    def product_speeds(self) -> dict[str, float]:
        """Product -> relative_speed (the reference product is 1.0)."""
        return {p.name: p.relative_speed for p in self.products}

    def product_ranks(self) -> dict[str, int]:
        """Product -> rank in scheduling.product_order (lower first); {} for the author's order."""
        order = self.scheduling.product_order
        if order == "author":
            return {}
        keys = {"listed": lambda k, p: k,
                "cheapest_per_work": lambda k, p: (p.price_per_gpu_hour.on_demand / p.relative_speed, k),
                "fastest": lambda k, p: (-p.relative_speed, k)}[order]
        ranked = sorted(enumerate(self.products), key=lambda kp: keys(*kp))
        return {p.name: rank for rank, (_, p) in enumerate(ranked)}

    def node_label_aliases(self) -> dict[str, str]:
        """nvidia.com/gpu.product node label value -> product name, for products that declare one."""
        return {p.node_label: p.name for p in self.products if p.node_label}

    def pool_slots(self, product: str, gpus: int = 0, mig_profile: str | None = None, count: int = 1) -> int:
        """Airflow pool_slots for a task: `gpus` whole GPUs, or `count` instances of a MIG profile."""
        if (gpus > 0) == (mig_profile is not None):
            raise ValueError("give either gpus > 0 or a mig_profile")
        if mig_profile is not None:
            return count * self.product(product).mig_profile(mig_profile).slices
        self.product(product)
        return gpus * SLOTS_PER_GPU

    def team_slots(self, team: str | Team, product: str) -> int:
        """Slots of the team's Airflow pool for `product`: its GPU ceiling plus its MIG instance quota."""
        t = team if isinstance(team, Team) else self.team(team)
        prod = self.product(product)
        mig = sum(n * prod.mig_profile(profile).slices for profile, n in t.mig_quota.get(product, {}).items())
        return t.ceiling_gpus(product) * SLOTS_PER_GPU + mig

    def guaranteed_slots(self, team: str | Team, product: str) -> int:
        """Slots the team is guaranteed (quota without borrowing): what counts against capacity."""
        t = team if isinstance(team, Team) else self.team(team)
        return self.team_slots(t, product) - t.borrowing_gpus(product) * SLOTS_PER_GPU

    def tier_class(self, tier: str) -> str:
        """"guaranteed" or "preemptible": which of the team's pools and ResourceQuotas the tier uses."""
        return tier_class(self.tier_policies()[self.tier(tier).name])

    def team_tier_classes(self, team: str | Team) -> list[str]:
        """Tier classes of the tiers the team may use, guaranteed first."""
        t = team if isinstance(team, Team) else self.team(team)
        classes = {self.tier_class(tier.name) for tier in self.tiers if t.allows_tier(tier.name)}
        return sorted(classes, key=lambda c: c != TIER_CLASS_GUARANTEED)

    def class_slots(self, team: str | Team, cls: str) -> int:
        """Slots of the team's pool for a tier class, over every product: the guarantee for
        non-preemptible tiers, quota + borrowing for preemptible ones (MIG instances in both)."""
        t = team if isinstance(team, Team) else self.team(team)
        size = self.guaranteed_slots if cls == TIER_CLASS_GUARANTEED else self.team_slots
        return sum(size(t, product) for product in t.products())

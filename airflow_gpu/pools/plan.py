"""Desired pools from a quota config, the pools Airflow has, and the diff between them. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_gpu import constants
from airflow_gpu.config import SLOTS_PER_GPU, QuotaConfig, format_gpus
from airflow_gpu.core.tiers import TIER_CLASS_GUARANTEED, TIER_CLASSES


POOL_PREFIX = "gpu."


def pool_name(team: str, tier_class: str) -> str:
    """Airflow pool of a team's GPUs for one tier class ("guaranteed" | "preemptible"), over every
    product. Dots never occur in team names."""
    return f"{POOL_PREFIX}{team}.{tier_class}"


def parse_pool_name(name: str) -> tuple[str, str] | None:
    """gpu.<team>.<tier class> -> (team, tier class); None for any other pool."""
    if not name.startswith(POOL_PREFIX):
        return None
    team, dot, cls = name[len(POOL_PREFIX):].partition(".")
    return (team, cls) if dot and team and cls in TIER_CLASSES else None


def is_managed(description: str | None) -> bool:
    return bool(description) and description.startswith(constants.POOL_DESCRIPTION_MARKER)


@dataclass(frozen=True)
class PoolState:
    """A pool as Airflow stores it (the fields the pool manager owns), and how many of its slots task
    instances use now (running, queued, scheduled or deferred: read, never written, by the sync)."""

    name: str
    slots: int
    description: str | None
    include_deferred: bool
    team_name: str | None = None
    in_use: int = field(default=0, compare=False)

    @property
    def managed(self) -> bool:
        return is_managed(self.description)

    @property
    def retired(self) -> bool:
        return self.managed and self.description.startswith(RETIRED_MARKER)


# A managed pool that is no longer wanted but still used by task instances keeps its slots (a task
# in a missing pool is never scheduled) and is marked retired; the first sync after it empties deletes it.
RETIRED_MARKER = f"{constants.POOL_DESCRIPTION_MARKER} retired"


@dataclass(frozen=True)
class Change:
    action: str  # "create" | "update" | "retire" | "delete"
    name: str
    old: PoolState | None
    new: PoolState | None
    note: str = ""  # e.g. what a migrated pool was replaced by

    def describe(self) -> str:
        note = f" ({self.note})" if self.note else ""
        if self.action == "create":
            return f"create {self.name}: slots {self.new.slots} ({format_gpus(self.new.slots)} GPU){note}"
        if self.action == "delete":
            return f"delete {self.name}: slots {self.old.slots} -> (deleted){note}"
        if self.action == "retire":
            return (f"retire {self.name}: {self.old.in_use} of {self.old.slots} slots still in use, kept with its "
                    f"slots until no task uses it, then deleted by a later sync{note}")
        fields = []
        if self.old.slots != self.new.slots:
            fields.append(f"slots {self.old.slots} -> {self.new.slots} ({format_gpus(self.new.slots)} GPU)")
        if self.old.include_deferred != self.new.include_deferred:
            fields.append(f"include_deferred {self.old.include_deferred} -> {self.new.include_deferred}")
        if self.old.team_name != self.new.team_name:
            fields.append(f"team_name {self.old.team_name} -> {self.new.team_name}")
        if self.old.description != self.new.description:
            fields.append("description")
        return f"update {self.name}: {', '.join(fields)}{note}"


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # unmanaged pools in the way of a desired pool
    notes: list[str] = field(default_factory=list)

    def of(self, action: str) -> list[Change]:
        return [c for c in self.changes if c.action == action]

    def summary(self) -> str:
        retire = f"{len(self.of('retire'))} to retire, " if self.of("retire") else ""
        return (f"{len(self.of('create'))} to create, {len(self.of('update'))} to update, {retire}"
                f"{len(self.of('delete'))} to delete, {len(self.unchanged)} unchanged")


def desired_pools(cfg: QuotaConfig, multi_team: bool) -> list[PoolState]:
    """Per team, one pool per tier class its tiers use: `gpu.<team>.guaranteed` (non-preemptible tiers)
    sized at the guarantee, `gpu.<team>.preemptible` at quota + borrowing, both over every product
    (see the package docstring for why per class and not per product). A 0 quota gives a 0-slot pool,
    so a task aimed at it waits visibly instead of landing in a missing pool."""
    pools = []
    for team in cfg.teams:
        for cls in cfg.team_tier_classes(team):
            pools.append(PoolState(
                name=pool_name(team.name, cls),
                slots=cfg.class_slots(team, cls),
                description=_description(cfg, team, cls),
                include_deferred=True,  # a deferred training task still holds its GPUs
                team_name=team.airflow_team_name if multi_team else None,
            ))
    return pools


def diff(desired: list[PoolState], current: list[PoolState]) -> Plan:
    """Creates first, then updates, retirements and deletes: a sync applied one request at a time
    (REST) and interrupted leaves old and new pools, never neither."""
    plan = Plan()
    existing = {p.name: p for p in current}
    wanted = {p.name for p in desired}
    by_team: dict[str, list[str]] = {}
    for new in desired:
        by_team.setdefault(_team_of(new.name), []).append(new.name)
        old = existing.get(new.name)
        if old is None:
            plan.changes.append(Change("create", new.name, None, new))
        elif not old.managed:
            plan.conflicts.append(
                f"pool {new.name!r} exists but is not managed by airflow-gpu (its description does not start "
                f"with {constants.POOL_DESCRIPTION_MARKER!r}); rename or delete it, or add the marker to adopt it")
        elif old != new:
            plan.changes.append(Change("update", new.name, old, new))
        else:
            plan.unchanged.append(new.name)
    for old in current:
        if not old.managed or old.name in wanted:
            continue
        successors = by_team.get(_team_of(old.name), [])
        note = f"replaced by {', '.join(successors)}" if successors else ""
        if old.in_use > 0:
            retired = PoolState(old.name, old.slots, _retired_description(old, successors), old.include_deferred,
                                old.team_name)
            if old.retired and old.description == retired.description:
                plan.unchanged.append(old.name)
                plan.notes.append(f"note: retired pool {old.name} still has {old.in_use} slot(s) in use; "
                                  "a sync after those tasks finish deletes it")
            else:
                plan.changes.append(Change("retire", old.name, old, retired, note))
        else:
            plan.changes.append(Change("delete", old.name, old, None, note))
    return plan


def _team_of(name: str) -> str:
    """gpu.<team>.<anything>: team names are DNS labels, so the first dot ends them."""
    return name[len(POOL_PREFIX):].partition(".")[0] if name.startswith(POOL_PREFIX) else ""


def _retired_description(old: PoolState, successors: list[str]) -> str:
    where = f"; use {', '.join(successors)}" if successors else ""
    return f"{RETIRED_MARKER}: no longer in the quota config{where}; deleted by `pools sync` once no task uses it"


def _description(cfg: QuotaConfig, team, cls: str) -> str:
    tiers = [t.name for t in cfg.tiers if team.allows_tier(t.name) and cfg.tier_class(t.name) == cls]
    parts = []
    for product in team.products():
        gpus = team.quota_gpus(product)
        text = f"{product} {gpus} GPU"
        if cls != TIER_CLASS_GUARANTEED and team.borrowing_gpus(product):
            text += f" + borrowing {team.borrowing_gpus(product)}"
        for profile, count in team.mig_quota.get(product, {}).items():
            text += f", {count} x {profile}"
        parts.append(text)
    size = "quota" if cls == TIER_CLASS_GUARANTEED else "quota + borrowing"
    return (f"{constants.POOL_DESCRIPTION_MARKER} team={team.name} class={cls} ({size}) tiers={','.join(tiers)}: "
            f"{'; '.join(parts)}; 1 slot = 1/{SLOTS_PER_GPU} GPU")

"""Desired pools from a quota config, the pools Airflow has, and the diff between them. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_gpu import constants
from airflow_gpu.config import SLOTS_PER_GPU, QuotaConfig, format_gpus


def pool_name(team: str, product: str) -> str:
    """Airflow pool of a team's GPUs of one product. Dots never occur in team or product names."""
    return f"gpu.{team}.{product}"


def is_managed(description: str | None) -> bool:
    return bool(description) and description.startswith(constants.POOL_DESCRIPTION_MARKER)


@dataclass(frozen=True)
class PoolState:
    """A pool as Airflow stores it (the fields the pool manager owns)."""

    name: str
    slots: int
    description: str | None
    include_deferred: bool
    team_name: str | None = None

    @property
    def managed(self) -> bool:
        return is_managed(self.description)


@dataclass(frozen=True)
class Change:
    action: str  # "create" | "update" | "delete"
    name: str
    old: PoolState | None
    new: PoolState | None

    def describe(self) -> str:
        if self.action == "create":
            return f"create {self.name}: slots {self.new.slots} ({format_gpus(self.new.slots)} GPU)"
        if self.action == "delete":
            return f"delete {self.name}: slots {self.old.slots} -> (deleted)"
        fields = []
        if self.old.slots != self.new.slots:
            fields.append(f"slots {self.old.slots} -> {self.new.slots} ({format_gpus(self.new.slots)} GPU)")
        if self.old.include_deferred != self.new.include_deferred:
            fields.append(f"include_deferred {self.old.include_deferred} -> {self.new.include_deferred}")
        if self.old.team_name != self.new.team_name:
            fields.append(f"team_name {self.old.team_name} -> {self.new.team_name}")
        if self.old.description != self.new.description:
            fields.append("description")
        return f"update {self.name}: {', '.join(fields)}"


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # unmanaged pools in the way of a desired pool
    notes: list[str] = field(default_factory=list)

    def of(self, action: str) -> list[Change]:
        return [c for c in self.changes if c.action == action]

    def summary(self) -> str:
        return (f"{len(self.of('create'))} to create, {len(self.of('update'))} to update, "
                f"{len(self.of('delete'))} to delete, {len(self.unchanged)} unchanged")


def desired_pools(cfg: QuotaConfig, multi_team: bool) -> list[PoolState]:
    """One pool per team and product the team has a quota entry for (a 0 quota gives a 0-slot pool,
    so a task aimed at it waits visibly instead of landing in a missing pool)."""
    pools = []
    for team in cfg.teams:
        for product in team.products():
            slots = cfg.team_slots(team, product)
            pools.append(PoolState(
                name=pool_name(team.name, product),
                slots=slots,
                description=_description(cfg, team, product),
                include_deferred=True,  # a deferred training task still holds its GPUs
                team_name=team.airflow_team_name if multi_team else None,
            ))
    return pools


def diff(desired: list[PoolState], current: list[PoolState]) -> Plan:
    plan = Plan()
    existing = {p.name: p for p in current}
    wanted = {p.name for p in desired}
    for new in desired:
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
        if old.managed and old.name not in wanted:
            plan.changes.append(Change("delete", old.name, old, None))
    return plan


def _description(cfg: QuotaConfig, team, product: str) -> str:
    parts = [f"quota {team.quota_gpus(product)} GPU"]
    if team.borrowing_gpus(product):
        parts.append(f"borrowing {team.borrowing_gpus(product)} GPU")
    for profile, count in team.mig_quota.get(product, {}).items():
        parts.append(f"{count} x {profile}")
    return (f"{constants.POOL_DESCRIPTION_MARKER} team={team.name} product={product}: "
            f"{', '.join(parts)}; 1 slot = 1/{SLOTS_PER_GPU} GPU")


"""`pools sync`: make the managed Airflow pools match the quota config, through one backend."""

from __future__ import annotations

from airflow_gpu.config import QuotaConfig
from airflow_gpu.pools.backends import DatabaseNotInitialised, PoolBackend
from airflow_gpu.pools.plan import Plan, desired_pools, diff


class PoolConflict(ValueError):
    """The config cannot be applied without touching something the pool manager does not own."""


def plan_sync(cfg: QuotaConfig, backend: PoolBackend, dry_run: bool = False) -> Plan:
    multi_team = backend.multi_team()
    desired = desired_pools(cfg, multi_team)
    not_initialised = None
    try:
        current = backend.list_pools()
    except DatabaseNotInitialised as exc:
        if not dry_run:
            raise
        not_initialised, current = str(exc), []  # a dry run on a fresh AIRFLOW_HOME: every pool is new
    plan = diff(desired, current)
    if not_initialised:
        plan.notes.append(f"note: {not_initialised}; a sync after that would make the creates above")
    problems = list(plan.conflicts)
    if multi_team and not not_initialised:
        known = backend.team_names()
        if known is not None:
            for team in cfg.teams:
                if team.airflow_team_name not in known:
                    problems.append(
                        f"team {team.name!r}: Airflow team {team.airflow_team_name!r} does not exist "
                        f"(multi_team is on); create it with `airflow teams create {team.airflow_team_name}` "
                        "or set airflow_team to an existing team")
    if problems:
        raise PoolConflict("\n".join(problems))
    return plan


def sync_pools(cfg: QuotaConfig, backend: PoolBackend, dry_run: bool = False) -> Plan:
    """Plan, then apply unless `dry_run`. Raises PoolConflict (nothing written) on a conflict."""
    plan = plan_sync(cfg, backend, dry_run)
    if plan.changes and not dry_run:
        backend.apply(plan.changes)
    return plan


def format_plan(plan: Plan, dry_run: bool) -> str:
    lines = [f"  {change.describe()}" for change in plan.changes]
    if not plan.changes:
        lines.append(f"no changes: {len(plan.unchanged)} managed pool(s) already match the config")
    elif dry_run:
        lines.append(f"dry run, nothing written: {plan.summary()}")
    else:
        lines.append(f"applied: {plan.summary()}")
    lines += plan.notes
    return "\n".join(lines)

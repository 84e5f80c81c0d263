"""Cluster policy for `airflow_local_settings.py`: a GPU task may use only its own team's pools.

    # $AIRFLOW_HOME/config/airflow_local_settings.py (or anywhere on the dag processor's sys.path)
    from airflow_gpu.policy import task_policy  # noqa: F401

A task "names a team pool" when its pool is `gpu.<team>.<tier class>` (pools/plan.py). Its own team
is the GpuTrainingOperator's `team`, else the team whose namespace the task runs in (`namespace`,
as on KubernetesPodOperator), read from the quota config (`[airflow_gpu] config_file`). A task in a
team pool whose team cannot be told, or is another team, is refused with
AirflowClusterPolicyViolation: the DAG file shows an import error naming the task and the pool.
"""

from __future__ import annotations

from airflow_gpu.pools.plan import parse_pool_name


def task_team(task, config_file: str | None = None) -> str | None:
    """The team a task belongs to: its `team` argument, else its namespace's team in the config."""
    team = getattr(task, "team", None)
    if isinstance(team, str) and team:
        return team
    namespace = getattr(task, "namespace", None)
    if not isinstance(namespace, str) or not namespace:
        return None
    from airflow_gpu.config import ConfigError, load_config_cached
    from airflow_gpu.operators.gpu_training import resolve_config_file

    path = resolve_config_file(config_file)
    if not path:
        return None
    try:
        cfg = load_config_cached(path)
    except ConfigError:
        return None
    return next((t.name for t in cfg.teams if t.namespace == namespace), None)


def pool_violation(task, config_file: str | None = None) -> str | None:
    """Why the task may not use its pool, or None."""
    parts = parse_pool_name(getattr(task, "pool", None) or "")
    if parts is None:
        return None
    owner = parts[0]
    team = task_team(task, config_file)
    if team == owner:
        return None
    who = f"team {team!r}" if team else "a task of no known team"
    return (f"task {task.task_id!r} is {who} but names pool {task.pool!r} of team {owner!r}: GPU pools are per "
            f"team; use GpuTrainingOperator(team=...) (it derives its pool) or the team's namespace")


def task_policy(task) -> None:
    """Airflow cluster policy hook (task_policy): refuse a GPU task that names another team's pool."""
    problem = pool_violation(task)
    if problem:
        from airflow.exceptions import AirflowClusterPolicyViolation

        raise AirflowClusterPolicyViolation(problem)

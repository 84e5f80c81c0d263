"""Airflow cluster policies of airflow-gpu: a team's DAGs use only that team's GPUs.

Registered through the `airflow.policy` entry point, so every Airflow process that has the package
runs them when it parses a DAG file; a violation is an import error of the DAG file naming the task
(nothing runs). (Importing `task_policy` / `dag_policy` into `airflow_local_settings.py`, as earlier
versions asked, still works.)
- `task_policy`: a task may use only its own team's pools. A task "names a team pool" when its pool
  is `gpu.<team>.<tier class>` (pools/plan.py); its team is the GpuTrainingOperator's `team`, else the
  team whose namespace the task runs in (`namespace`, as on KubernetesPodOperator), from the quota
  config (`[airflow_gpu] config_file`).
- `dag_policy`: a DAG belongs to a team. With `[core] multi_team` on, its bundle's `team_name`
  (`[dag_processor] dag_bundle_config_list`) must be the Airflow team (`airflow_team`, default the
  name) of every GpuTrainingOperator's `team=`; otherwise `[airflow_gpu] dag_teams`
  (airflow_gpu/config/dag_teams.py) when set; otherwise nothing is enforced, and `ownership()` gives
  the warning that `airflow-gpu queue` and the queue page show.
Importing this module is cheap (every Airflow process loads it); the rest is imported when a DAG
with a GPU task is parsed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from airflow.policies import hookimpl

from airflow_gpu.config.dag_teams import DagTeamsError, parse_dag_teams, team_of_dag_file

SECTION, OPTION = "airflow_gpu", "dag_teams"
OFF_WARNING = ("DAG ownership is not enforced: any DAG may name any team in GpuTrainingOperator(team=...) and "
               "spend its quota. Turn on [core] multi_team with a team_name per DAG bundle, or set "
               "[airflow_gpu] dag_teams (README: 'A DAG belongs to a team').")


@dataclass(frozen=True)
class Ownership:
    mode: str  # "multi_team" | "dag_teams" | "off"
    warning: str | None


def ownership() -> Ownership:
    """How this Airflow deployment ties DAGs to teams, with the warning to show when it does not."""
    from airflow.configuration import conf

    if conf.getboolean("core", "multi_team", fallback=False):
        return Ownership("multi_team", None)
    if _dag_teams_text():
        return Ownership("dag_teams", None)
    return Ownership("off", OFF_WARNING)


def _dag_teams_text() -> str | None:
    env = os.environ.get(f"AIRFLOW__{SECTION.upper()}__{OPTION.upper()}")
    if env is not None:
        return env
    from airflow.configuration import conf

    return conf.get(SECTION, OPTION, fallback=None)


@hookimpl
def dag_policy(dag) -> None:
    """Refuse the DAG when one of its GPU tasks names a team the DAG does not belong to."""
    gpu_tasks = list(_gpu_tasks(dag))
    if not gpu_tasks:
        return
    from airflow.exceptions import AirflowClusterPolicyViolation

    problem = ownership_problem(dag, gpu_tasks)
    if problem:
        raise AirflowClusterPolicyViolation(problem)


def _gpu_tasks(dag):
    """(task_id, team, config_file) of the DAG's GpuTrainingOperator tasks, mapped ones included. No
    such task exists unless its module was imported, so other DAGs cost a dict look-up."""
    module = sys.modules.get("airflow_gpu.operators.gpu_training")
    if module is None:
        return
    cls = module.GpuTrainingOperator
    for task in dag.tasks:
        if isinstance(task, cls):
            yield task.task_id, task.team, task.config_file
        elif isinstance(getattr(task, "operator_class", None), type) and issubclass(task.operator_class, cls):
            yield task.task_id, _argument(task, "team"), module.resolve_config_file(_argument(task, "config_file"))


def _argument(task, name: str):
    """An operator argument, also of a mapped task (partial() holds the arguments that decide teams)."""
    if hasattr(task, "partial_kwargs"):
        return (task.partial_kwargs or {}).get(name)
    return getattr(task, name, None)


def ownership_problem(dag, gpu_tasks) -> str | None:
    """Why the DAG may not run these tasks, or None. `gpu_tasks`: (task_id, team, config_file)."""
    from airflow.configuration import conf

    where = f"DAG {dag.dag_id!r} ({dag.relative_fileloc or dag.fileloc})"
    if conf.getboolean("core", "multi_team", fallback=False):
        bundle = _bundle_being_parsed()
        dag_team = _bundle_team(bundle)
        for task_id, team, config_file in gpu_tasks:
            airflow_team = _airflow_team(team, config_file)
            if dag_team is None:
                return (f"{where}, task {task_id!r}: team={team!r}, but the DAG's bundle {bundle!r} has no "
                        f"team_name ([dag_processor] dag_bundle_config_list) and with [core] multi_team the GPU "
                        f"pools belong to teams; give the bundle team_name {airflow_team!r}")
            if airflow_team != dag_team:
                return (f"{where}, task {task_id!r}: team={team!r} (Airflow team {airflow_team!r}), but the DAG "
                        f"belongs to team {dag_team!r} (its bundle {bundle!r}); a DAG may only use its own "
                        f"team's GPUs: set team= to the team of Airflow team {dag_team!r}, or move the DAG "
                        f"to a bundle of team {airflow_team!r}")
        return None
    try:
        rules = parse_dag_teams(_dag_teams_text())
    except DagTeamsError as exc:
        return str(exc)
    if not rules:
        return None
    relative = dag.relative_fileloc or _relative_to_dags_folder(dag.fileloc)
    bundle = _bundle_being_parsed()
    dag_team = team_of_dag_file(rules, bundle, relative)
    for task_id, team, _ in gpu_tasks:
        if dag_team is None:
            return (f"{where}, task {task_id!r}: team={team!r}, but no entry of [{SECTION}] {OPTION} matches "
                    f"this DAG file (path {relative!r}, bundle {bundle!r}); add 'PATTERN = {team}' for it")
        if team != dag_team:
            return (f"{where}, task {task_id!r}: team={team!r}, but [{SECTION}] {OPTION} gives this DAG file "
                    f"to team {dag_team!r}; a DAG may only use its own team's GPUs: set team={dag_team!r}")
    return None


def _airflow_team(team: str | None, config_file: str | None) -> str | None:
    """The Airflow team of a quota-file team (its `airflow_team`, default its name)."""
    from airflow_gpu.config import ConfigError, load_config_cached

    try:
        return load_config_cached(config_file).team(team).airflow_team_name
    except (ConfigError, KeyError, TypeError, OSError):
        return team  # the operator already refused a bad team or config at parse time


def _bundle_team(bundle: str | None) -> str | None:
    from airflow.configuration import conf

    for entry in conf.getjson("dag_processor", "dag_bundle_config_list", fallback=None) or []:
        if isinstance(entry, dict) and entry.get("name") == bundle:
            return entry.get("team_name") or None
    return None


def _bundle_being_parsed() -> str | None:
    """The bundle of the DagBag that is bagging this DAG. Airflow hands cluster policies only the DAG,
    and the DAG does not carry its bundle's name: the DagBag on the call stack does."""
    from airflow.dag_processing.dagbag import DagBag

    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, DagBag):
            return owner.bundle_name
        frame = frame.f_back
    return None


def _relative_to_dags_folder(fileloc: str | None) -> str | None:
    if not fileloc:
        return None
    from airflow.configuration import conf

    folder = conf.get("core", "dags_folder", fallback=None)
    if folder and os.path.abspath(fileloc).startswith(os.path.abspath(folder) + os.sep):
        return os.path.relpath(fileloc, folder)
    return fileloc


def task_team(task, config_file: str | None = None) -> str | None:
    """The team a task belongs to: its `team` argument, else its namespace's team in the config."""
    team = _argument(task, "team")
    if isinstance(team, str) and team:
        return team
    namespace = _argument(task, "namespace")
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
    from airflow_gpu.pools.plan import parse_pool_name

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


@hookimpl
def task_policy(task) -> None:
    """Airflow cluster policy hook (task_policy): refuse a GPU task that names another team's pool."""
    problem = pool_violation(task)
    if problem:
        from airflow.exceptions import AirflowClusterPolicyViolation

        raise AirflowClusterPolicyViolation(problem)

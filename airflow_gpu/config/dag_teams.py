"""Which team a DAG belongs to, when Airflow's multi_team does not say: `[airflow_gpu] dag_teams`.

Why: a GpuTrainingOperator's `team=` spends that team's pool, namespace, quota and bill. Without a rule
tying DAGs to teams, any DAG author may name any team. With `[core] multi_team` on, Airflow's bundles
carry the team (`dag_bundle_config_list[].team_name`); without it, the platform maps DAG files to
teams here. The rule is enforced when the DAG file is parsed (airflow_gpu/dag_policy.py).

The value is a list of `PATTERN = TEAM` entries, one per line or separated by commas; the first
entry that matches wins:
- `bundle:NAME = TEAM`: every DAG of the bundle NAME (as in `dag_bundle_config_list`);
- any other PATTERN is a glob on the DAG file's path relative to its bundle's root (`fnmatch`, where
  `*` also crosses folders): `nlp/* = nlp`, `research/sweeps/*.py = research`.
A DAG file no entry matches may not use any team's GPUs once the mapping is set.
Pure: no Airflow import; the policy hands in the bundle name and the relative path.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

BUNDLE_PREFIX = "bundle:"
_SPLIT = re.compile(r"[\n,]")


class DagTeamsError(ValueError):
    """`[airflow_gpu] dag_teams` cannot be read."""


@dataclass(frozen=True)
class DagTeamRule:
    pattern: str  # `bundle:NAME` or a glob on the path relative to the bundle root
    team: str

    def matches(self, bundle: str | None, relative_path: str | None) -> bool:
        if self.pattern.startswith(BUNDLE_PREFIX):
            return bundle is not None and bundle == self.pattern[len(BUNDLE_PREFIX):]
        return relative_path is not None and fnmatch.fnmatchcase(relative_path.lstrip("/"), self.pattern.lstrip("/"))


def parse_dag_teams(text: str | None, option: str = "[airflow_gpu] dag_teams") -> tuple[DagTeamRule, ...]:
    """The rules of the option's value, in order; () when unset. Errors name the option and the entry."""
    rules = []
    for raw in _SPLIT.split(text or ""):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        pattern, sep, team = entry.partition("=")
        pattern, team = pattern.strip(), team.strip()
        if not sep or not pattern or not team:
            raise DagTeamsError(f"{option}: entry {entry!r} must be 'PATTERN = TEAM' (e.g. 'nlp/* = nlp' or "
                                f"'bundle:nlp-dags = nlp')")
        if pattern.startswith(BUNDLE_PREFIX) and not pattern[len(BUNDLE_PREFIX):].strip():
            raise DagTeamsError(f"{option}: entry {entry!r} names no bundle after {BUNDLE_PREFIX!r}")
        rules.append(DagTeamRule(pattern, team))
    return tuple(rules)


def team_of_dag_file(rules: tuple[DagTeamRule, ...], bundle: str | None, relative_path: str | None) -> str | None:
    """The team the first matching rule gives the DAG file, or None when none matches."""
    for rule in rules:
        if rule.matches(bundle, relative_path):
            return rule.team
    return None


def unknown_teams(rules: tuple[DagTeamRule, ...], teams: set[str]) -> list[str]:
    """Teams the mapping names that the quota file does not have (a typo would lock a folder out)."""
    return sorted({rule.team for rule in rules} - teams)

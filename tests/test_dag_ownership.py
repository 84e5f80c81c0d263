"""A DAG belongs to a team (issue: trust boundaries): a GpuTrainingOperator naming another team is an
import error of the DAG file, with Airflow's multi_team (the bundle's team) and with the
`[airflow_gpu] dag_teams` mapping; without either, nothing is enforced and the queue says so.

Each case parses real DAG files with Airflow's own BundleDagBag (what the dag-processor runs) in a
fresh interpreter, so the policy comes in through the package's `airflow.policy` entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_gpu.config.dag_teams import DagTeamsError, parse_dag_teams, team_of_dag_file

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"

DAG = '''
import pendulum
from airflow.sdk import dag
from airflow_gpu.operators import GpuTrainingOperator

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1))
def build():
    {task}

build()
'''
PLAIN = ('GpuTrainingOperator(task_id="fit", team="{team}", tier="best-effort-training", image="i", '
         'gpus_per_worker=1)')
MAPPED = ('GpuTrainingOperator.partial(task_id="fit", team="{team}", tier="best-effort-training", image="i", '
          'gpus_per_worker=1).expand(arguments=[["a"], ["b"]])')


def parse(bundle_root: Path, bundle: str, env: dict[str, str]) -> dict:
    """dag ids and import errors of every file under bundle_root, parsed as the dag-processor does."""
    script = textwrap.dedent(f"""
        import json
        from pathlib import Path
        from airflow.dag_processing.dagbag import BundleDagBag
        dags, errors = [], {{}}
        for path in sorted(Path({str(bundle_root)!r}).rglob("*.py")):
            bag = BundleDagBag(dag_folder=str(path), bundle_path=Path({str(bundle_root)!r}),
                               bundle_name={bundle!r})
            dags += sorted(bag.dags)
            errors.update(bag.import_errors)
        print(json.dumps({{"dags": dags, "errors": errors}}))
    """)
    full_env = {**os.environ, "AIRFLOW__AIRFLOW_GPU__CONFIG_FILE": str(SEED), **env}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=full_env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def write(root: Path, relative: str, dag_id: str, task: str, team: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DAG.format(dag_id=dag_id, task=task.format(team=team)))


def error_of(result: dict, name: str) -> str:
    (error,) = [e for path, e in result["errors"].items() if path.endswith(name)]
    return error


def test_multi_team_refuses_a_team_other_than_the_bundles(tmp_path):
    write(tmp_path, "own.py", "own", PLAIN, "nlp")
    write(tmp_path, "other.py", "other", PLAIN, "research")
    write(tmp_path, "other_mapped.py", "other_mapped", MAPPED, "research")
    bundles = [{"name": "nlp-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(tmp_path)}, "team_name": "nlp"}]
    result = parse(tmp_path, "nlp-dags", {"AIRFLOW__CORE__MULTI_TEAM": "True",
                                          "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles)})
    assert result["dags"] == ["own"]
    for name in ("other.py", "other_mapped.py"):
        error = error_of(result, name)
        assert "AirflowClusterPolicyViolation" in error, error
        assert "team='research'" in error and "belongs to team 'nlp'" in error and "'nlp-dags'" in error, error


def test_multi_team_bundle_without_team_is_refused(tmp_path):
    write(tmp_path, "own.py", "own", PLAIN, "nlp")
    bundles = [{"name": "shared", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(tmp_path)}}]
    result = parse(tmp_path, "shared", {"AIRFLOW__CORE__MULTI_TEAM": "True",
                                        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles)})
    assert result["dags"] == []
    assert "has no team_name" in error_of(result, "own.py")


def test_dag_teams_mapping_refuses_another_team_and_unmapped_files(tmp_path):
    write(tmp_path, "nlp/own.py", "own", PLAIN, "nlp")
    write(tmp_path, "nlp/other.py", "other", PLAIN, "research")
    write(tmp_path, "nlp/other_mapped.py", "other_mapped", MAPPED, "vision")
    write(tmp_path, "research/sweep.py", "sweep", MAPPED, "research")
    write(tmp_path, "elsewhere/lost.py", "lost", PLAIN, "nlp")
    result = parse(tmp_path, "dags-folder", {"AIRFLOW__AIRFLOW_GPU__DAG_TEAMS": "nlp/* = nlp, research/*=research"})
    assert sorted(result["dags"]) == ["own", "sweep"]
    assert "gives this DAG file to team 'nlp'" in error_of(result, "nlp/other.py")
    assert "team='vision'" in error_of(result, "nlp/other_mapped.py")
    assert "no entry of [airflow_gpu] dag_teams matches" in error_of(result, "elsewhere/lost.py")


def test_dag_teams_by_bundle_name(tmp_path):
    write(tmp_path, "a.py", "a", PLAIN, "nlp")
    write(tmp_path, "b.py", "b", PLAIN, "vision")
    result = parse(tmp_path, "nlp-dags", {"AIRFLOW__AIRFLOW_GPU__DAG_TEAMS": "bundle:nlp-dags = nlp"})
    assert result["dags"] == ["a"]
    assert "gives this DAG file to team 'nlp'" in error_of(result, "b.py")


def test_without_a_rule_nothing_is_enforced_and_ownership_warns(tmp_path):
    write(tmp_path, "any.py", "any", PLAIN, "research")
    result = parse(tmp_path, "dags-folder", {})
    assert result["dags"] == ["any"] and not result["errors"]

    from airflow_gpu.policy import OFF_WARNING, ownership

    assert ownership().mode == "off" and ownership().warning == OFF_WARNING


def test_mapping_syntax_errors_name_the_option_and_entry():
    with pytest.raises(DagTeamsError, match=r"\[airflow_gpu\] dag_teams: entry 'nlp' must be 'PATTERN = TEAM'"):
        parse_dag_teams("nlp/* = nlp, nlp")
    with pytest.raises(DagTeamsError, match="names no bundle"):
        parse_dag_teams("bundle: = nlp")
    rules = parse_dag_teams("# comment\nbundle:b1 = vision\nteams/nlp/* = nlp\n")
    assert team_of_dag_file(rules, "b1", "teams/nlp/x.py") == "vision"  # the first match wins
    assert team_of_dag_file(rules, "b2", "teams/nlp/deep/x.py") == "nlp"
    assert team_of_dag_file(rules, "b2", "teams/research/x.py") is None


def test_queue_table_prints_the_ownership_warning(monkeypatch, capsys):
    from airflow_gpu.cli.queue import print_queue
    from airflow_gpu.policy import OFF_WARNING
    from airflow_gpu.ui.service import _deployment_warnings

    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "False")
    monkeypatch.delenv("AIRFLOW__AIRFLOW_GPU__DAG_TEAMS", raising=False)
    assert _deployment_warnings() == [OFF_WARNING]
    monkeypatch.setenv("AIRFLOW__AIRFLOW_GPU__DAG_TEAMS", "nlp/* = nlp")
    assert _deployment_warnings() == []
    print_queue({"warnings": [OFF_WARNING], "teams": [], "waiting": [], "running": [],
                 "cluster": {"gpus_total": 0, "nodes": [], "allocation_ratio": 0.0, "fragmentation": 0.0}})
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: DAG ownership is not enforced" in out

"""GpuTrainingOperator arguments are checked when the DAG file is parsed (DagBag, the dag-processor's
parse path): each bad argument is an import error naming it; good arguments derive pool, pool_slots,
priority_weight / weight_rule from the quota config. The cluster policy helper refuses a task that
names another team's pool (a real airflow_local_settings in a separate interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_gpu.config import load_config

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"

DAG = '''
import datetime as dt
import pendulum
from airflow.sdk import dag
from airflow_gpu.operators import GpuTrainingOperator

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), default_args={default_args})
def build():
    GpuTrainingOperator(task_id="fit", image="python:3.11", {args})

build()
'''

GOOD = 'team="nlp", tier="production-training", workers=2, gpus_per_worker=4, config_file=CONFIG'

# case -> (operator arguments, the argument the error must name, a fragment of the fix)
BAD = {
    "gpus_zero": ('team="nlp", tier="production-training", gpus_per_worker=0', "gpus_per_worker", ">= 1"),
    "gpus_negative": ('team="nlp", tier="production-training", gpus_per_worker=-2', "gpus_per_worker", ">= 1"),
    "gpus_fraction": ('team="nlp", tier="production-training", gpus_per_worker=0.5', "gpus_per_worker", "whole number"),
    "both": ('team="serving", tier="inference", gpus_per_worker=1, mig_profile="1g.10gb"', "gpus_per_worker",
             "not both"),
    "neither": ('team="nlp", tier="production-training"', "gpus_per_worker", "exactly one of"),
    "unknown_team": ('team="nlpp", tier="production-training", gpus_per_worker=1', "team",
                     "teams in the quota config: nlp, vision"),
    "unknown_tier": ('team="nlp", tier="gold", gpus_per_worker=1', "tier", "tiers: interactive"),
    "unknown_product": ('team="nlp", tier="production-training", gpus_per_worker=1, gpu_products=["b200"]',
                        "gpu_products", "products: a100-80gb"),
    "unknown_profile": ('team="serving", tier="inference", mig_profile="5g.50gb"', "mig_profile",
                        "unknown MIG profile '5g.50gb'"),
    "tier_not_allowed": ('team="research", tier="production-training", gpus_per_worker=1', "tier",
                         "may not use tier 'production-training'"),
    "gang_over_guarantee": ('team="nlp", tier="production-training", workers=3, gpus_per_worker=4', "workers",
                            "needs 12 GPUs"),
    "gang_over_borrowing": ('team="research", tier="best-effort-training", workers=5, gpus_per_worker=4,'
                            ' checkpoint="s3://ckpt/x", retries=2', "workers", "quota + borrowing_limit"),
    "mig_over_quota": ('team="serving", tier="inference", workers=23, mig_profile="1g.10gb"', "workers",
                       "22 at tier 'inference'"),
    "always_without_checkpoint": ('team="research", tier="best-effort-training", gpus_per_worker=4, spot="always",'
                                  ' retries=2', "spot", "needs checkpoint="),
    "always_without_retries": ('team="research", tier="best-effort-training", gpus_per_worker=4, spot="always",'
                               ' checkpoint="s3://ckpt/x", retries=0', "retries", "retries >= 1"),
    "spot_typo": ('team="nlp", tier="production-training", gpus_per_worker=1, spot="sometimes"', "spot", "'auto'"),
    "checkpoint_gs": ('team="nlp", tier="production-training", gpus_per_worker=1, checkpoint="gs://b/p"',
                      "checkpoint", "use s3:// or file://"),
    "checkpoint_path": ('team="nlp", tier="production-training", gpus_per_worker=1, checkpoint="/tmp/ckpt"',
                        "checkpoint", "s3://bucket/prefix"),
    "pool_given": ('team="nlp", tier="production-training", gpus_per_worker=1, pool="gpu.nlp.preemptible"', "pool",
                   "derived from team and tier"),
    "priority_given": ('team="nlp", tier="production-training", gpus_per_worker=1, priority_weight=5',
                       "priority_weight", "derived"),
    "max_interruptions": ('team="nlp", tier="production-training", gpus_per_worker=1, max_interruptions=-1',
                          "max_interruptions", ">= 0"),
    "deadline_naive": ('team="nlp", tier="production-training", gpus_per_worker=1, deadline=dt.datetime(2027, 1, 1)',
                       "deadline", "timezone-aware"),
    "topology": ('team="nlp", tier="production-training", gpus_per_worker=1, topology="planet"', "topology",
                 "node, clique, rack, zone"),
    "backend": ('team="nlp", tier="production-training", gpus_per_worker=1, gang_backend="slurm"', "gang_backend",
                "airflow-gpu, coscheduling, volcano, kueue"),
    "gpu_in_resources": ('team="nlp", tier="production-training", gpus_per_worker=1,'
                         ' container_resources={"limits": {"nvidia.com/gpu": "2"}}', "container_resources",
                         "GPUs come from gpus_per_worker"),
    "own_label_prefix": ('team="nlp", tier="production-training", gpus_per_worker=1,'
                         ' labels={"airflow-gpu.io/team": "vision"}', "labels", "prefix is reserved for airflow-gpu"),
    "other_namespace": ('team="nlp", tier="production-training", gpus_per_worker=1, namespace="team-vision"',
                        "namespace", "runs in namespace 'team-nlp'"),
    "no_config": ('team="nlp", tier="production-training", gpus_per_worker=1, config_file="/nonexistent/q.yaml"',
                  "config_file", "cannot read the file"),
}


def write_dag(folder: Path, dag_id: str, args: str, default_args: str = "{}") -> Path:
    path = folder / f"{dag_id}.py"
    args = args.replace("CONFIG", repr(str(SEED)))
    if "config_file" not in args:
        args += f", config_file={str(SEED)!r}"
    path.write_text(DAG.format(dag_id=dag_id, args=args, default_args=default_args))
    return path


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    from airflow.dag_processing.dagbag import DagBag

    folder = tmp_path_factory.mktemp("dags")
    write_dag(folder, "good", GOOD, default_args='{"retries": 2}')
    write_dag(folder, "good_mig", 'team="serving", tier="inference", workers=2, mig_profile="3g.40gb", retries=1')
    write_dag(folder, "good_sweep", 'team="research", tier="best-effort-training", workers=4, gpus_per_worker=4, '
                                    'checkpoint="s3://ckpt/sweeps", spot="always", retries=3, '
                                    'deadline=dt.timedelta(hours=6)')
    for case, (args, _, _) in BAD.items():
        write_dag(folder, case, args)
    return folder, DagBag(str(folder))


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_argument_is_an_import_error_naming_it(parsed, case):
    folder, bag = parsed
    args, argument, fix = BAD[case]
    error = bag.import_errors.get(str(folder / f"{case}.py"))
    assert error, f"{case}: the DAG parsed although {args}"
    assert "GpuTaskArgumentError: " in error, error
    message = error[error.rindex("GpuTaskArgumentError: "):]  # the raised error, after the traceback
    assert message.startswith(f"GpuTaskArgumentError: GpuTrainingOperator(task_id='fit') argument {argument!r}: "), message
    assert fix in message, message
    assert case not in bag.dags


def test_good_arguments_derive_pool_slots_and_priority(parsed):
    folder, bag = parsed
    assert not {k: v for k, v in bag.import_errors.items() if "good" in k}
    cfg = load_config(SEED)
    fit = bag.dags["good"].get_task("fit")
    assert (fit.pool, fit.pool_slots) == ("gpu.nlp.guaranteed", cfg.pool_slots("a100-80gb", gpus=8))
    assert (fit.priority_weight, fit.weight_rule) == (cfg.tier("production-training").priority, "absolute")
    assert fit.retries == 2 and fit.namespace == "team-nlp" and fit.priority_class == "airflow-gpu-production-training"
    assert fit.gpu_products == ["a100-80gb"] and fit.deferrable
    assert fit.capacity_for().capacity_type == "on-demand"  # production is not spot-eligible with spot="auto"

    mig = bag.dags["good_mig"].get_task("fit")
    assert (mig.pool, mig.pool_slots) == ("gpu.serving.guaranteed", 2 * 3)

    sweep = bag.dags["good_sweep"].get_task("fit")
    assert (sweep.pool, sweep.pool_slots) == ("gpu.research.preemptible", 16 * 7)
    assert sweep.capacity_for().capacity_type == "spot"
    assert sweep.capacity_for(interruptions=3).capacity_type == "on-demand"  # max_interruptions (3) reached
    assert sweep.capacity_for(seconds_to_deadline=100, seconds_run=200).capacity_type == "on-demand"


def test_config_file_from_airflow_option(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW__AIRFLOW_GPU__CONFIG_FILE", str(SEED))
    (tmp_path / "envcfg.py").write_text(DAG.format(dag_id="envcfg", default_args="{}",
                                                   args='team="vision", tier="inference", gpus_per_worker=1'))
    bag = DagBag(str(tmp_path))
    assert not bag.import_errors
    assert bag.dags["envcfg"].get_task("fit").pool == "gpu.vision.guaranteed"
    monkeypatch.delenv("AIRFLOW__AIRFLOW_GPU__CONFIG_FILE")
    bag = DagBag(str(tmp_path))
    (error,) = bag.import_errors.values()
    assert "argument 'config_file': no quota configuration" in error and "AIRFLOW__AIRFLOW_GPU__CONFIG_FILE" in error


POLICY_DAG = '''
import pendulum
from airflow.sdk import dag
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow_gpu.operators import GpuTrainingOperator

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1))
def build():
    {task}

build()
'''


def test_task_policy_refuses_another_teams_pool(tmp_path):
    """airflow_local_settings.task_policy = airflow_gpu.policy.task_policy, in a fresh interpreter."""
    settings_dir, dags = tmp_path / "settings", tmp_path / "dags"
    settings_dir.mkdir()
    dags.mkdir()
    (settings_dir / "airflow_local_settings.py").write_text("from airflow_gpu.policy import task_policy  # noqa\n")
    tasks = {
        "own_pool": f'GpuTrainingOperator(task_id="t", team="nlp", tier="inference", image="i", gpus_per_worker=1, '
                    f'config_file={str(SEED)!r})',
        "other_team": 'EmptyOperator(task_id="t", pool="gpu.vision.guaranteed", pool_slots=7)',
        "plain_pool": 'EmptyOperator(task_id="t", pool="default_pool")',
    }
    for dag_id, task in tasks.items():
        (dags / f"{dag_id}.py").write_text(POLICY_DAG.format(dag_id=dag_id, task=task))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(settings_dir), os.environ.get("PYTHONPATH", "")]),
           "AIRFLOW__AIRFLOW_GPU__CONFIG_FILE": str(SEED)}
    script = textwrap.dedent(f"""
        import json
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag({str(dags)!r})
        print(json.dumps({{"dags": sorted(bag.dags), "errors": bag.import_errors}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["dags"] == ["own_pool", "plain_pool"]
    (path, error), = result["errors"].items()
    assert path.endswith("other_team.py")
    assert "AirflowClusterPolicyViolation" in error and "names pool 'gpu.vision.guaranteed' of team 'vision'" in error


def test_registered_in_provider_info():
    import importlib

    from airflow_gpu.provider import get_provider_info

    (entry,) = get_provider_info()["operators"]
    (module,) = entry["python-modules"]
    assert importlib.import_module(module).GpuTrainingOperator.__module__ == module


def test_a_retry_reports_the_step_it_resumes_from():
    """Issue 32 (minor): a retry that resumes from a checkpoint said resumed_from_step null in its XCom."""
    from airflow_gpu.operators.gpu_training import new_run

    assert new_run(2, resumed_from_step=7)["resumed_from_step"] == 7
    assert new_run(1)["resumed_from_step"] is None

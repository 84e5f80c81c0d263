"""Issue 27: GpuTrainingOperator takes KubernetesPodOperator's argument types, one pod template as the
escape hatch (the gang's own fields win; a template contradicting one is a parse error naming it),
errors at parse time where they can be, never retried at run time; and no credential in a pod spec,
by value: a rendered value Airflow's secrets masker would redact is refused before anything is
created, without the secret in the error, the task log, the API server's store or the XCom.

The parse-time cases build the operator in-process (what the DAG processor does); the credential
cases run `dag.test()` against the local cluster (tests/test_operator_run.py's harness)."""

from __future__ import annotations

from pathlib import Path

import pendulum
import pytest

from airflow_gpu import constants as C
from airflow_gpu.operators import GpuTrainingOperator
from airflow_gpu.operators.gpu_training import GpuTaskArgumentError, new_run
from tests.test_operator_run import S3_SECRET, platform  # noqa: F401 - fixture: quotas, namespaces, the GPU scheduler

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"
BASE = dict(team="nlp", tier="production-training", gpus_per_worker=1, image="python:3.11", config_file=str(SEED))


def _pods(**kwargs):
    from airflow.sdk import DAG

    from airflow_gpu.kube.manifests import build
    from airflow_gpu.kube.names import TaskInstanceRef

    with DAG("kpo", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        op = GpuTrainingOperator(task_id="t", **{**BASE, **kwargs})
    return build(op.workload_spec(TaskInstanceRef("kpo", "t", "r"), new_run(1), C.CAPACITY_ON_DEMAND)).pods


def _error(**kwargs) -> GpuTaskArgumentError:
    from airflow.sdk import DAG

    with DAG("kpo", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        with pytest.raises(GpuTaskArgumentError) as info:
            GpuTrainingOperator(task_id="t", **{**BASE, **kwargs})
    return info.value


def test_kpo_types_reach_every_member():
    from airflow.providers.cncf.kubernetes.secret import Secret
    from kubernetes.client import models as k8s

    pods = _pods(
        workers=2,
        env_vars=[k8s.V1EnvVar(name="A", value="1"),
                  k8s.V1EnvVar(name="POD", value_from=k8s.V1EnvVarSource(
                      field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.name")))],
        container_resources=k8s.V1ResourceRequirements(requests={"cpu": "2"}, limits={"memory": "4Gi"}),
        secrets=[Secret("env", "HF", "hf", "token"), Secret("env", None, "s3-creds"),
                 Secret("volume", "/etc/certs", "certs")],
        image_pull_secrets="regcred", image_pull_policy="Always",
        affinity=k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(node_selector_terms=[
                k8s.V1NodeSelectorTerm(match_expressions=[k8s.V1NodeSelectorRequirement(
                    key="topology.kubernetes.io/zone", operator="In", values=["a"])])]))),
        security_context={"runAsUser": 1000}, container_security_context=k8s.V1SecurityContext(run_as_non_root=True),
        init_containers=[k8s.V1Container(name="init", image="busybox")], startup_timeout_seconds=300,
        pod_template_dict={"spec": {"containers": [{"name": "base", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]},
                                                   {"name": "metrics", "image": "prom/statsd-exporter"}],
                                    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]}})
    assert len(pods) == 2
    for rank, pod in enumerate(pods):
        spec = pod["spec"]
        base, sidecar = spec["containers"]
        env = {e["name"]: e for e in base["env"]}
        assert env["A"]["value"] == "1" and env["RANK"]["value"] == str(rank)
        assert env["POD"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["HF"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
        assert {"secretRef": {"name": "s3-creds"}} in base["envFrom"]
        assert base["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi", C.RESOURCE_GPU: "1"}}
        assert base["imagePullPolicy"] == "Always" and base["securityContext"] == {"runAsNonRoot": True}
        assert {m["mountPath"] for m in base["volumeMounts"]} == {"/dev/shm", "/etc/certs"}
        assert sidecar["name"] == "metrics"
        assert {v["name"] for v in spec["volumes"]} == {"shm", "secret-certs"}
        assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["securityContext"] == {"runAsUser": 1000}
        assert spec["initContainers"][0]["name"] == "init"
        assert spec["affinity"]["nodeAffinity"] and spec["schedulerName"] == C.DEFAULT_SCHEDULER_NAME
        assert spec["nodeSelector"] == {C.NODE_CAPACITY_TYPE_KARPENTER: C.CAPACITY_ON_DEMAND}


@pytest.mark.parametrize("kwargs, argument, fragment", [
    ({"pod_template_dict": {"spec": {"schedulerName": "default-scheduler"}}}, "pod_template_dict",
     "spec.schedulerName"),
    ({"pod_template_dict": {"spec": {"priorityClassName": "high"}}}, "pod_template_dict", "spec.priorityClassName"),
    ({"pod_template_dict": {"spec": {"containers": [{"name": "base", "resources": {"limits": {C.RESOURCE_GPU: "8"}}}]}}},
     "pod_template_dict", "resources.limits['nvidia.com/gpu']"),
    ({"pod_template_dict": {"metadata": {"labels": {C.LABEL_TEAM: "vision"}}}}, "pod_template_dict",
     f"metadata.labels['{C.LABEL_TEAM}']"),
    ({"pod_template_dict": {"spec": {"containers": [{"name": "base", "env": [{"name": "RANK", "value": "3"}]}]}}},
     "pod_template_dict", "env['RANK']"),
    ({"pod_template_dict": {"spec": {"nodeSelector": {C.NODE_CAPACITY_TYPE_KARPENTER: C.CAPACITY_SPOT}}}},
     "pod_template_dict", "nodeSelector"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": C.NODE_CAPACITY_TYPE_KARPENTER, "operator": "In", "values": ["spot"]}]}]}}}},
     "affinity", "no nodeSelectorTerm can match"),
    ({"pod_template_dict": {"spec": {}}, "full_pod_spec": {"spec": {}}}, "full_pod_spec", "give one of"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}]}}}},
     "affinity", "operator In with one value"),
    ({"deferrable": False}, "deferrable", "always defers"),
    ({"skip_on_exit_code": "3"}, "skip_on_exit_code", "list of exit codes"),
    ({"gang_backend": "kueue"}, "gang_backend", "not supported"),
    ({"pool": "gpu.nlp.guaranteed"}, "pool", "derived from team and tier"),  # equal to the derived pool: still refused
    ({"config_file": "/nonexistent/quotas.yaml"}, "config_file", "the cluster comes from kubernetes_conn_id"),
])
def test_parse_errors_name_the_argument(kwargs, argument, fragment):
    error = _error(**kwargs)
    assert error.argument == argument and fragment in str(error), str(error)


def test_pod_template_file(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text("spec:\n  containers:\n  - name: base\n    securityContext: {readOnlyRootFilesystem: true}\n"
                    "  - name: sidecar\n    image: busybox\n")
    (pod,) = _pods(pod_template_file=str(path))
    assert [c["name"] for c in pod["spec"]["containers"]] == ["base", "sidecar"]
    assert pod["spec"]["containers"][0]["securityContext"] == {"readOnlyRootFilesystem": True}
    path.write_text("spec:\n  restartPolicy: Always\n")
    assert "spec.restartPolicy" in str(_error(pod_template_file=str(path)))


@pytest.mark.parametrize("expanded", [{"gpus_per_worker": [1, 2]}, {"workers": [1, 2]}, {"team": ["nlp", "vision"]}])
def test_expand_over_a_pool_argument_names_partial(expanded):
    from airflow.sdk import DAG

    with DAG("kpo_mapped", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        with pytest.raises(GpuTaskArgumentError) as info:
            GpuTrainingOperator.partial(task_id="m", **{k: v for k, v in BASE.items() if k not in expanded}
                                        ).expand(**expanded)
    assert "partial()" in str(info.value) and info.value.argument in expanded, str(info.value)


def test_expand_over_other_arguments_keeps_the_derived_pool():
    from airflow.sdk import DAG

    with DAG("kpo_mapped_ok", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        mapped = GpuTrainingOperator.partial(task_id="m", **BASE).expand(cmds=[["a"], ["b"]])
    assert mapped.partial_kwargs["pool"] == "gpu.nlp.guaranteed"


def test_credential_by_value_never_echoes_the_secret():
    from airflow.sdk.log import mask_secret

    from airflow_gpu.operators.arguments import credential_by_value

    secret = "pa55-w0rd-kpo-args-27"
    mask_secret(secret)
    problem = credential_by_value({"env_vars": {"X": "ok"}, "arguments": ["--token", f"x{secret}y"]})
    assert problem is not None and problem.argument == "arguments" and "arguments[1]" in str(problem)
    assert secret not in str(problem) and "secrets=" in str(problem)
    assert credential_by_value({"env_vars": {"X": "harmless"}}) is None


# -- the credential refused before anything is created (dag.test() on the local cluster) -----------

SECRET = "hunter2-s3cr3t-27-VALUE"


@pytest.mark.slow
@pytest.mark.parametrize("dag_id, value, env", [
    ("cred_conn", "{{ conn.c.password }}",
     {"AIRFLOW_CONN_C": '{"conn_type": "generic", "host": "h", "password": "%s"}' % SECRET}),
    ("cred_var", "{{ var.value.hf_api_key }}", {"AIRFLOW_VAR_HF_API_KEY": SECRET}),
])
def test_credential_by_value_fails_before_creation_without_retry(sqlite_airflow_db, kube_cluster, seaweedfs, dag_id,
                                                                 value, env):
    from tests.test_operator_run import run_dag

    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, dag_id, (
        f'team="nlp", tier="production-training", gpus_per_worker=1, retries=2, image="python:3.11", '
        f'env_vars={{"X": "{value}"}}'), timeout=240, extra_env=env)
    ti = result["tis"]["train"]
    assert (ti["state"], ti["try_number"]) == ("failed", 1), log[-6000:]  # no retry spent
    assert ti.get("xcom") is None
    assert "env_vars['X'] holds a value that Airflow masks as a secret" in log, log[-6000:]
    assert SECRET not in log
    store = (kube_cluster.state_dir / "store.log").read_bytes()
    assert SECRET.encode() not in store
    assert f'"{dag_id}"'.encode() not in store  # no object of this DAG was ever created


@pytest.mark.slow
def test_templated_argument_error_fails_try_1_without_retry(sqlite_airflow_db, kube_cluster, seaweedfs):
    from tests.test_operator_run import run_dag

    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "tmpl_bad", (
        'team="nlp", tier="production-training", gpus_per_worker=1, retries=2, image="python:3.11", '
        'labels={"note": "{{ \'not a label value!\' }}"}'), timeout=240)
    ti = result["tis"]["train"]
    assert (ti["state"], ti["try_number"]) == ("failed", 1), log[-6000:]
    assert "argument 'labels'" in log and "without spending a retry" in log, log[-6000:]
    assert b'"tmpl_bad"' not in (kube_cluster.state_dir / "store.log").read_bytes()


@pytest.mark.slow
def test_kpo_habits_run_on_the_local_cluster(platform, sqlite_airflow_db, kube_cluster, seaweedfs):
    import json
    import sys

    from tests.test_operator_run import run_dag

    seen: dict = {}

    def read_pod():
        # a watch from the listing's version: the pod may live well under a second (the base container
        # ends at once and the operator deletes it), too short to be caught by polling on a busy machine
        from kubernetes import watch

        core, selector = kube_cluster.core(), f"{C.LABEL_DAG_ID}=kpo_run"
        listing = core.list_namespaced_pod("team-nlp", label_selector=selector)
        pod = listing.items[0] if listing.items else None
        if pod is None:
            for event in watch.Watch().stream(core.list_namespaced_pod, "team-nlp", label_selector=selector,
                                              resource_version=listing.metadata.resource_version, timeout_seconds=240):
                if event["type"] == "ADDED":
                    pod = event["object"]
                    break
        assert pod is not None, "no pod of kpo_run created within 240 s"
        seen["pod"] = kube_cluster.api_client().sanitize_for_serialization(pod)

    # the base container writes to the /dev/shm volume; a metrics sidecar, listed first, logs and never
    # ends: the gang ends with the base container and the task log is the base container's
    # KPO Secrets from the team's S3 Secret: one key as env, the whole Secret as files (never printed)
    cmd = [sys.executable, "-c", "import os; open('/dev/shm/x', 'w').write('1'); print('A=' + os.environ['A']); "
           "print('S3_ID set:', bool(os.environ.get('S3_ID')), 'file:', os.path.isfile('/etc/s3/AWS_ACCESS_KEY_ID'))"]
    sidecar = [sys.executable, "-c", "import time; print('SIDECAR-LINE', flush=True); time.sleep(600)"]
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "kpo_run", (
        'team="nlp", tier="production-training", gpus_per_worker=1, image="python:3.11", '
        f'cmds={cmd!r}, env_vars=[__import__("kubernetes").client.V1EnvVar(name="A", value="{{{{ 1 + 1 }}}}")], '
        'container_resources=__import__("kubernetes").client.V1ResourceRequirements(requests={"cpu": "1"}), '
        'image_pull_secrets="regcred", image_pull_policy="IfNotPresent", '
        'affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ['
        '{"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}, '
        'secrets=[__import__("airflow.providers.cncf.kubernetes.secret", fromlist=["Secret"]).Secret('
        f'"env", "S3_ID", "{S3_SECRET}", "AWS_ACCESS_KEY_ID"), __import__("airflow.providers.cncf.kubernetes.secret", '
        f'fromlist=["Secret"]).Secret("volume", "/etc/s3", "{S3_SECRET}")], '
        f'pod_template_dict={{"spec": {{"containers": [{{"name": "metrics", "image": "python:3.11", "command": {sidecar!r}}}, '
        '{"name": "base", "volumeMounts": [{"name": "shm", '
        '"mountPath": "/dev/shm"}]}], "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}'),
        timeout=300, during=read_pod)
    ti = result["tis"]["train"]
    assert (result["state"], ti["state"]) == ("success", "success"), log[-6000:]
    spec = seen["pod"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["metrics", "base"]  # found by name, not position
    assert seen["pod"]["metadata"]["annotations"][C.ANNOTATION_DEFAULT_CONTAINER] == "base"
    base = spec["containers"][1]
    assert {e["name"]: e.get("value") for e in base["env"]}["A"] == "2" and "A=2" in log  # templated, as in KPO
    assert "SIDECAR-LINE" not in log and "exit code 0 (" in log, log[-6000:]
    assert "S3_ID set: True file: True" in log
    env = {e["name"]: e for e in base["env"]}
    assert env["S3_ID"]["valueFrom"] == {"secretKeyRef": {"name": S3_SECRET, "key": "AWS_ACCESS_KEY_ID"}}
    volume = next(v for v in spec["volumes"] if "secret" in v)
    assert volume["secret"]["secretName"] == S3_SECRET
    assert {"name": volume["name"], "mountPath": "/etc/s3", "readOnly": True} in base["volumeMounts"]
    assert base["resources"]["requests"]["cpu"] == "1" and base["imagePullPolicy"] == "IfNotPresent"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["affinity"]["nodeAffinity"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in spec["volumes"], json.dumps(spec)
    assert {"name": "shm", "mountPath": "/dev/shm"} in base["volumeMounts"]


@pytest.mark.slow
def test_skip_on_exit_code(platform, sqlite_airflow_db, kube_cluster, seaweedfs):
    import sys

    from tests.test_operator_run import run_dag

    # a sidecar listed first exits 5: the exit code that counts is the base container's (3)
    cmd = [sys.executable, "-c", "import sys; print('BASE-LINE'); sys.exit(3)"]
    sidecar = [sys.executable, "-c", "import sys; print('SIDECAR-LINE'); sys.exit(5)"]
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "kpo_skip", (
        f'team="nlp", tier="production-training", gpus_per_worker=1, image="python:3.11", retries=1, '
        f'cmds={cmd!r}, skip_on_exit_code=[3, 4], base_container_name="train", '
        f'pod_template_dict={{"spec": {{"containers": [{{"name": "metrics", "image": "python:3.11", '
        f'"command": {sidecar!r}}}]}}}}'), timeout=300)
    ti = result["tis"]["train"]
    assert (ti["state"], ti["try_number"]) == ("skipped", 1), log[-6000:]
    assert "exited with [3] (skip_on_exit_code): skipped" in log
    assert "BASE-LINE" in log and "SIDECAR-LINE" not in log, log[-6000:]


def test_expand_checks_partial_with_each_literal_value_at_parse():
    from airflow.sdk import DAG

    with DAG("kpo_mapped_bad", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        with pytest.raises(GpuTaskArgumentError) as info:
            GpuTrainingOperator.partial(task_id="m", **BASE, labels={"note": "not a label!"}).expand(cmds=[["a"]])
        assert info.value.argument == "labels" and "item 0" in str(info.value)
        with pytest.raises(GpuTaskArgumentError) as info:
            GpuTrainingOperator.partial(task_id="n", **BASE).expand(env_vars=[{"A": "1"}, {"RANK": "1"}])
        assert info.value.argument == "env_vars" and "expand(env_vars=[...]) item 1" in str(info.value)
        mapped = GpuTrainingOperator.partial(task_id="o", **BASE).expand(env_vars=[{"A": "1"}, {"A": "2"}])
    assert mapped.partial_kwargs["pool"] == "gpu.nlp.guaranteed"
    # at run time the task is unmapped with partial()'s derived values: accepted (an author's are not)
    task = mapped.unmap({"env_vars": {"A": "2"}})
    assert (task.pool, task.env_vars) == ("gpu.nlp.guaranteed", {"A": "2"})


# -- file:// checkpoints: only on a volume that outlives the pods ------------------------------------

PVC = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "shared-ckpt"}}


@pytest.mark.parametrize("kwargs, fragment", [
    ({}, "/ckpt/runs/kpo/t/parse is on no volume of the pods"),
    ({"volumes": [{"name": "ckpt", "emptyDir": {}}], "volume_mounts": [{"name": "ckpt", "mountPath": "/ckpt"}]},
     "a emptyDir that ends with its pod"),
    ({"volumes": [PVC], "volume_mounts": [{"name": "ckpt", "mountPath": "/ckpt", "readOnly": True}]}, "readOnly"),
    ({"volumes": [PVC], "volume_mounts": [{"name": "ckpt", "mountPath": "/ckpt-other"}]}, "on no volume"),
])
def test_a_file_checkpoint_off_a_shared_volume_is_refused_at_parse(kwargs, fragment):
    error = _error(checkpoint="file:///ckpt/runs", retries=1, **kwargs)
    assert error.argument == "checkpoint" and fragment in str(error) and "s3://" in str(error), str(error)


def test_a_file_checkpoint_on_a_shared_volume_reaches_every_rank():
    pods = _pods(workers=2, checkpoint="file:///ckpt/runs", retries=1, pod_template_dict={"spec": {
        "volumes": [PVC], "containers": [{"name": "base", "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}]}})
    for rank, pod in enumerate(pods):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env[C.ENV_CHECKPOINT_URI] == f"file:///ckpt/runs/kpo/t/r/rank-{rank}"


def test_a_templated_file_checkpoint_is_refused_before_creation_without_retry():
    from airflow.sdk.exceptions import AirflowFailException

    from airflow.sdk import DAG

    with DAG("kpo", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        op = GpuTrainingOperator(task_id="t", **BASE, checkpoint="file:///{{ params.dir }}", retries=1)
    op.checkpoint = "file:///ckpt"  # as rendered
    with pytest.raises(AirflowFailException, match="argument 'checkpoint'.*on no volume.*without spending a retry"):
        op.check_before_create()


# -- mapped tasks whose expand() values come from XCom -------------------------------------------------

def test_expand_over_a_pool_argument_from_xcom_names_partial():
    from airflow.sdk import DAG, task

    with DAG("kpo_mapped_xcom", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        @task
        def sizes():
            return [1, 2]

        with pytest.raises(GpuTaskArgumentError) as info:
            GpuTrainingOperator.partial(task_id="m", **{k: v for k, v in BASE.items() if k != "gpus_per_worker"}
                                        ).expand(gpus_per_worker=sizes())
        assert info.value.argument == "gpus_per_worker" and "partial()" in str(info.value)
        with pytest.raises(GpuTaskArgumentError) as info:
            GpuTrainingOperator.partial(task_id="k", **BASE).expand_kwargs([{"cmds": ["a"]}, {"workers": 2}])
        assert info.value.argument == "workers" and "item 1" in str(info.value) and "partial()" in str(info.value)


def test_partial_is_checked_at_parse_when_expand_takes_an_independent_argument_from_xcom():
    from airflow.sdk import DAG, task

    with DAG("kpo_mapped_partial", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        @task
        def commands():
            return [["a"], ["b"]]

        with pytest.raises(GpuTaskArgumentError) as info:
            GpuTrainingOperator.partial(task_id="m", **BASE, labels={"note": "not a label!"}).expand(cmds=commands())
        assert info.value.argument == "labels" and "partial()" in str(info.value), str(info.value)
        # the checkpoint from XCom: spot='always' holds only with it, so the rest waits for run time
        GpuTrainingOperator.partial(task_id="n", **BASE, spot="always", retries=2).expand(checkpoint=commands())


def test_an_argument_error_when_unmapped_at_run_time_is_not_retried():
    """The task built from XCom values at run time (MappedOperator.unmap): the error is Airflow's
    non-retryable failure, still a GpuTaskArgumentError naming the argument."""
    from airflow.sdk import DAG, task
    from airflow.sdk.exceptions import AirflowFailException

    with DAG("kpo_mapped_unmap", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        @task
        def notes():
            return [{"note": "not a label!"}]

        mapped = GpuTrainingOperator.partial(task_id="m", **BASE, retries=2).expand(labels=notes())
    with pytest.raises(AirflowFailException) as info:
        mapped.unmap({"labels": {"note": "not a label!"}})
    assert isinstance(info.value, GpuTaskArgumentError) and info.value.argument == "labels"
    assert "without spending a retry" in str(info.value)
    assert mapped.unmap({"labels": {"note": "fine"}}).labels == {"note": "fine"}


MAPPED_DAG = '''
import datetime as dt
import pendulum
from airflow.sdk import dag, task
from airflow_gpu.operators import GpuTrainingOperator

@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False,
     default_args={{"retry_delay": dt.timedelta(seconds=1)}})
def build():
    @task
    def notes():
        return [{{"note": "not a label!"}}]

    GpuTrainingOperator.partial(task_id="train", poll_interval=1, team="nlp", tier="production-training",
                                gpus_per_worker=1, image="python:3.11", retries=2).expand(labels=notes())

build()
'''


@pytest.mark.slow
def test_mapped_over_xcom_argument_error_fails_try_1_without_retry(sqlite_airflow_db, kube_cluster, seaweedfs):
    from tests.test_operator_run import run_dag

    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "mapped_bad", "", timeout=240,
                          source=MAPPED_DAG.format(dag_id="mapped_bad"))
    ti = result["tis"]["train"]
    assert (ti["state"], ti["try_number"]) == ("failed", 1), log[-6000:]
    assert "argument 'labels'" in log and "without spending a retry" in log, log[-6000:]
    assert b'"mapped_bad"' not in (kube_cluster.state_dir / "store.log").read_bytes()

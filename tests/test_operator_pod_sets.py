"""GpuTrainingOperator(pod_sets=[...]): a launcher and its workers from a DAG (issue 29 item 5).

- the Kubernetes shape (kube.manifests): per-set containers, rank env per set, the launcher's
  address, every set's host list, the gang's minMember and minResources over all sets;
- parse-time errors naming the field (pod_sets[1].replicas...) and the exclusivity with workers;
- the local cluster's kubelet-managed hosts file (localcluster/kubelet/clusterdns.py): the headless
  Service's records;
- end to end: dags/launcher_workers.py (a CPU-only launcher + 2 x 8-GPU workers) runs to success
  through dag.test() on the local cluster with the GPU scheduler, the launcher reaching both workers
  by their Service names (the XCom result is what the workers answered over TCP).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pendulum
import pytest

from airflow_gpu import constants as C
from airflow_gpu.devtools.dag_test import DAG_TEST_SCRIPT
from airflow_gpu.kube.manifests import build
from airflow_gpu.kube.spec import WorkloadSpec, WorkloadSpecError
from airflow_gpu.localcluster.kubelet.clusterdns import hosts_text, service_records

REPO = Path(__file__).resolve().parent.parent
SEED = REPO / "examples" / "seed-quotas.yaml"
H100 = "NVIDIA-H100-80GB-HBM3"
LAUNCHER = {"name": "launcher", "cmds": ["python", "-c", "print(1)"]}
WORKER = {"name": "worker", "replicas": 2, "gpus": 8}


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_pod_sets_manifests_carry_each_sets_container_and_rank_env():
    spec = WorkloadSpec(team="recsys", namespace="team-recsys", tier="production-training", image="python:3.11",
                        name="job", gpu_products=("h100-80gb",), env_vars={"SHARED": "1"},
                        pod_sets=[{**LAUNCHER, "container_resources": {"requests": {"cpu": "1"}}},
                                  {**WORKER, "image": "trainer:2", "env_vars": {"SHARED": "2", "OWN": "x"}}])
    m = build(spec)
    assert spec.workers == 3 and m.group["spec"]["minMember"] == 3
    cosched = build(dataclasses.replace(spec, gang_backend=C.GANG_BACKEND_COSCHEDULING))
    assert cosched.group["spec"]["minResources"] == {C.RESOURCE_GPU: "16"}  # every set's GPUs
    launcher, w0, w1 = m.pods
    assert [p["metadata"]["name"] for p in m.pods] == ["job-0", "job-1", "job-2"]
    assert [p["metadata"]["labels"][C.LABEL_POD_SET] for p in m.pods] == ["launcher", "worker", "worker"]
    lc, wc = launcher["spec"]["containers"][0], w1["spec"]["containers"][0]
    assert (lc["image"], lc["command"], lc["resources"]) == ("python:3.11", LAUNCHER["cmds"], {"requests": {"cpu": "1"}})
    assert (wc["image"], "command" in wc, wc["resources"]) == ("trainer:2", False, {"limits": {C.RESOURCE_GPU: "8"}})
    hosts = "job-1.job.team-recsys.svc,job-2.job.team-recsys.svc"
    for pod, rank, world, local in ((launcher, 0, 1, 1), (w0, 0, 2, 8), (w1, 1, 2, 8)):
        env = _env(pod)
        assert env[C.ENV_MASTER_ADDR] == "job-0.job.team-recsys.svc"  # the launcher
        assert (env[C.ENV_RANK], env[C.ENV_WORLD_SIZE], env[C.ENV_LOCAL_WORLD_SIZE]) == (str(rank), str(world), str(local))
        assert env[C.ENV_HOSTS_PREFIX + "WORKER"] == hosts
        assert env[C.ENV_HOSTS_PREFIX + "LAUNCHER"] == "job-0.job.team-recsys.svc"
    assert (_env(launcher)["SHARED"], _env(w0)["SHARED"], _env(w0)["OWN"]) == ("1", "2", "x")  # the set's env wins
    assert _env(launcher)[C.ENV_POD_SET] == "launcher" and _env(w1)[C.ENV_POD_SET] == "worker"


@pytest.mark.parametrize("pod_sets,error", [
    ([LAUNCHER, {**WORKER, "replicas": 0}], "pod_sets[1].replicas=0: must be an integer >= 1"),
    ([LAUNCHER, {**WORKER, "typo": 1}], "pod_sets[1].typo: unknown field"),
    ([LAUNCHER, LAUNCHER], "pod_sets[1].name='launcher': two pod sets have this name"),
    ([LAUNCHER], "pod_sets: no set asks for GPUs"),
    ([LAUNCHER, {**WORKER, "env_vars": {"RANK": "3"}}], "pod_sets[1].env_vars['RANK']: set by airflow-gpu"),
])
def test_workload_spec_names_the_pod_set_field(pod_sets, error):
    with pytest.raises(WorkloadSpecError) as exc:
        WorkloadSpec(team="recsys", namespace="team-recsys", tier="production-training", image="python:3.11",
                     name="job", pod_sets=pod_sets)
    assert error in str(exc.value)


@pytest.mark.parametrize("kwargs,argument,words", [
    ({"pod_sets": [LAUNCHER, {**WORKER, "replicas": 3}]}, "pod_sets[1].replicas", "needs 24 GPUs"),
    ({"pod_sets": [LAUNCHER, WORKER, {"name": "extra", "gpus": 1}]}, "pod_sets[1].replicas",
     "the pod sets together: the gang needs 17 GPUs"),
    ({"pod_sets": [LAUNCHER, {**WORKER, "replicas": 1, "gpus": 17}]}, "pod_sets[1].gpus", "needs 17 GPUs"),
    ({"pod_sets": [LAUNCHER, {**WORKER, "mig_profile": "1g.10gb"}]}, "pod_sets[1].mig_profile", "not both"),
    ({"pod_sets": [LAUNCHER, WORKER], "workers": 2}, "pod_sets", "not both (got workers)"),
    ({"pod_sets": [LAUNCHER, WORKER], "gpus_per_worker": 8}, "pod_sets", "not both (got gpus_per_worker)"),
    ({"pod_sets": {"name": "worker"}}, "pod_sets", "non-empty list"),
])
def test_operator_refuses_bad_pod_sets_at_parse_time(kwargs, argument, words):
    from airflow.sdk import DAG

    from airflow_gpu.operators import GpuTrainingOperator
    from airflow_gpu.operators.gpu_training import GpuTaskArgumentError

    with DAG("pod_sets_args", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        with pytest.raises(GpuTaskArgumentError) as exc:
            GpuTrainingOperator(task_id="t", team="recsys", tier="production-training", image="python:3.11",
                                config_file=str(SEED), **kwargs)
    assert exc.value.argument == argument and words in str(exc.value), str(exc.value)


def test_operator_derives_pool_slots_from_every_pod_set():
    from airflow.sdk import DAG

    from airflow_gpu.operators import GpuTrainingOperator

    with DAG("pod_sets_ok", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):
        op = GpuTrainingOperator(task_id="t", team="recsys", tier="production-training", image="python:3.11",
                                 config_file=str(SEED), pod_sets=[LAUNCHER, WORKER])
    # 16 GPUs x 7 slots; only H100 has quota for both 8-GPU workers at once (A100: 8)
    assert (op.pool, op.pool_slots, op.workers, op.gpu_products) == ("gpu.recsys.guaranteed", 112, 3, ["h100-80gb"])


def test_cluster_dns_lists_the_headless_services_pods():
    svc = {"metadata": {"name": "job"}, "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                                                 "selector": {C.LABEL_GANG: "job"}}}
    other = {"metadata": {"name": "web"}, "spec": {"clusterIP": "10.96.0.9", "selector": {"app": "web"}}}

    def pod(name, ip, phase="Running"):
        return {"metadata": {"name": name, "namespace": "ns", "labels": {C.LABEL_GANG: "job"}},
                "spec": {"hostname": name, "subdomain": "job"}, "status": {"podIP": ip, "phase": phase}}

    pods = [pod("job-0", "127.100.1.2"), pod("job-1", "127.100.2.2"), pod("job-2", None),
            pod("job-3", "127.100.3.2", "Succeeded")]
    records = service_records("ns", [svc, other], pods)
    assert ("127.100.2.2", "job-1.job.ns.svc.cluster.local job-1.job.ns.svc job-1.job") in records
    assert ("127.100.1.2", "job.ns.svc.cluster.local job.ns.svc job") in records
    assert not [r for r in records if "job-2" in r[1] or "job-3" in r[1] or "web" in r[1]]  # no IP / ended / not headless
    text = hosts_text(pods[0], records)
    assert "127.100.1.2\tjob-0.job.ns.svc.cluster.local job-0\n" in text and text.startswith("# Kubernetes-managed")
    assert "localhost" in text


# -- end to end ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "pod-sets", "podGCSeconds": 2, "pools": [
        {"name": "h100", "count": 2, "cliques": ["c1"], "gpu": {"product": H100, "count": 8}, "cpu": "32",
         "memory": "256Gi"},
        {"name": "cpu", "count": 1, "gpu": {"count": 0}, "cpu": "8", "memory": "32Gi"}]}


@pytest.mark.slow
def test_launcher_reaches_two_8_gpu_workers_by_service_name(kube_cluster, sqlite_airflow_db, tmp_path):
    from airflow_gpu.devtools.gangs import scheduler_process

    rendered = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(SEED)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    kube_cluster.kubectl("apply", "-f", "-", input=rendered)
    scheduler = scheduler_process(kube_cluster.kubeconfig, tmp_path / "scheduler.log", config_path=SEED,
                                  identity="pod-sets").start()
    try:
        folder = sqlite_airflow_db.home / "dags"
        shutil.copy(REPO / "dags" / "launcher_workers.py", folder)
        conn = json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kube_cluster.kubeconfig)}})
        env = sqlite_airflow_db.env(AIRFLOW_CONN_KUBERNETES_DEFAULT=conn, AIRFLOW__AIRFLOW_GPU__CONFIG_FILE=str(SEED),
                                    AIRFLOW__AIRFLOW_GPU__DEFERRAL_SETTLE_SECONDS="0")
        proc = subprocess.run([sys.executable, "-c", DAG_TEST_SCRIPT, str(folder), "launcher_workers"], env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        scheduler.stop()
    out = proc.stdout + proc.stderr
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, out[-6000:]
    result = json.loads(line[len("RESULT "):])
    ti = result["tis"]["mpi_job"]
    assert (result["state"], ti["state"]) == ("success", "success"), out[-6000:]
    xcom = ti["xcom"] if isinstance(ti["xcom"], dict) else json.loads(ti["xcom"])
    workers = xcom["result"]["workers"]
    # the launcher connected to each worker by its Service name and got its rank env back
    assert [w["name"].split(".", 1)[1] for w in workers] == [f"{xcom_gang(workers)}.team-recsys.svc"] * 2
    assert [(w["rank"], w["world_size"], w["gpus"]) for w in workers] == [(0, 2, 8), (1, 2, 8)]
    assert xcom["gpu_product"] == "h100-80gb"


def xcom_gang(workers: list[dict]) -> str:
    """The gang of the first worker's DNS name <pod>.<gang>.<namespace>.svc."""
    return workers[0]["name"].split(".")[1]


def test_the_product_the_scheduler_bound_on_reaches_the_outcome():
    """The scheduler annotates the group object with the product it bound the gang's GPU pods on; the
    trigger's outcome carries it to the operator (XCom gpu_product, the chargeback's product)."""
    from airflow_gpu.kube.outcome import outcome_of
    from airflow_gpu.kube.state import gang_state

    spec = WorkloadSpec(team="recsys", namespace="team-recsys", tier="production-training", image="python:3.11",
                        name="job", gpu_products=("h100-80gb", "a100-80gb"), pod_sets=[LAUNCHER, WORKER])
    m = build(spec)
    pods = [{**p, "spec": {**p["spec"], "nodeName": "n"}, "status": {"phase": "Succeeded"}} for p in m.pods]
    group = {**m.group, "metadata": {**m.group["metadata"], "annotations": {C.ANNOTATION_GPU_PRODUCT: "a100-80gb"}}}
    assert outcome_of(gang_state(pods, group), "team-recsys", "job", 1, 0.0).gpu_product == "a100-80gb"
    assert outcome_of(gang_state(pods, m.group), "team-recsys", "job", 1, 0.0).gpu_product == ""


def test_mig_pod_sets_count_slices_per_profile_against_the_mig_quota():
    from airflow_gpu.config import load_config
    from airflow_gpu.config.workload import WorkloadError, plan_pod_set_task
    from airflow_gpu.kube.spec import PodSetSpec

    cfg = load_config(SEED)
    sets = [PodSetSpec("router"), PodSetSpec("shard", replicas=4, mig_profile="1g.10gb"),
            PodSetSpec("big", mig_profile="3g.40gb")]
    plan = plan_pod_set_task(cfg, team="serving", tier="inference", pod_sets=sets)
    assert (plan.workers, plan.pool_slots, plan.products) == (6, 4 * 1 + 3, ("a100-80gb",))
    with pytest.raises(WorkloadError) as exc:  # serving's mig_quota has 22 x 1g.10gb
        plan_pod_set_task(cfg, team="serving", tier="inference",
                          pod_sets=[PodSetSpec("shard", replicas=12, mig_profile="1g.10gb"),
                                    PodSetSpec("more", replicas=11, mig_profile="1g.10gb")])
    assert exc.value.argument == "pod_sets[0].replicas" and "the pod sets together: the gang needs 23 x 1g.10gb" \
        in str(exc.value) and "fewer replicas" in str(exc.value)

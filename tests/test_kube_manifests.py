"""airflow_gpu.kube: WorkloadSpec -> objects -> gang state.

Each backend's group object is validated against its upstream CRD schema (../shared/crds), pods and
Services with kubernetes-validate 1.37; names stay within Kubernetes' limits; no credential is ever a
literal in a pod; and a round trip through the local cluster and the real scheduler reads back every
outcome (succeeded, application failure with exit codes, disruption with its reason, partial loss).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.devtools import gangs as G
from airflow_gpu.kube import SecretEnv, TaskInstanceRef, WorkloadSpec, WorkloadSpecError, build, gang_state
from airflow_gpu.kube import state as S

CRDS = Path(__file__).resolve().parents[1].parent / "shared" / "crds"
K8S_VERSION = "1.37.0"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
CREDENTIAL = re.compile(r"SECRET|PASSWORD|TOKEN|CREDENTIAL|ACCESS_KEY", re.I)

TI = TaskInstanceRef("fine_tune_pipeline", "fine_tune", "scheduled__2026-12-03T07:00:00+00:00", -1, 1)


def spec(**kw) -> WorkloadSpec:
    base = dict(team="nlp", namespace="team-nlp", tier=C.TIER_BEST_EFFORT_TRAINING, image="python:3.11",
                workers=2, gpus_per_worker=4, task_instance=TI, attempt=1001, checkpoint_uri="s3://ck/nlp/ft",
                s3_secret="s3-credentials", capacity_type=C.CAPACITY_SPOT, topology="clique",
                gpu_products=("a100-80gb", "h100-80gb"),
                secrets=(SecretEnv(secret="wandb", key="api-key", env="WANDB_API_KEY"), SecretEnv(secret="hf")),
                env_vars={"LR": "0.001"}, container_resources={"requests": {"cpu": "4", "memory": "16Gi"}},
                volumes=({"name": "data", "emptyDir": {}},), volume_mounts=({"name": "data", "mountPath": "/data"},),
                tolerations=({"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},),
                node_selector={"node.kubernetes.io/instance-type": "p4d.24xlarge"}, service_account_name="trainer",
                termination_grace_period=60, labels={"project": "llm"}, annotations={"owner": "nlp-team"})
    base.update(kw)
    return WorkloadSpec(**base)


def crd_schema(filename: str, version: str) -> dict:
    crd = yaml.safe_load((CRDS / filename).read_text())
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    return served[version]["schema"]["openAPIV3Schema"]


def validate_core(obj: dict) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# --- shapes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend, crd, version", [
    (C.GANG_BACKEND_AIRFLOW_GPU, "scheduling.x-k8s.io_podgroups.yaml", C.PODGROUP_VERSION),
    (C.GANG_BACKEND_COSCHEDULING, "scheduling.x-k8s.io_podgroups.yaml", C.PODGROUP_VERSION),
    (C.GANG_BACKEND_VOLCANO, "scheduling.volcano.sh_podgroups.yaml", C.VOLCANO_PODGROUP_VERSION),
])
def test_group_object_matches_the_backends_crd(backend, crd, version):
    m = build(spec(gang_backend=backend, queue="research" if backend == C.GANG_BACKEND_VOLCANO else None,
                   schedule_timeout_seconds=600 if backend != C.GANG_BACKEND_VOLCANO else None))
    schema = crd_schema(crd, version)
    jsonschema.Draft7Validator(schema).validate(m.group)
    # the schema is not vacuous: a broken object is refused
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate({**m.group, "spec": {"minMember": "two"}})
    assert m.group["apiVersion"] == m.group_resource.api_version and m.group["kind"] == "PodGroup"
    assert m.group["spec"]["minMember"] == 2
    for obj in [m.service, *m.pods]:
        validate_core(obj)
    pod = m.pods[0]
    if backend == C.GANG_BACKEND_VOLCANO:
        assert pod["metadata"]["annotations"][C.ANNOTATION_VOLCANO_GROUP_NAME] == m.name
        assert pod["spec"]["schedulerName"] == C.VOLCANO_SCHEDULER_NAME
        assert m.group["spec"]["queue"] == "research"
        assert m.group["spec"]["priorityClassName"] == "airflow-gpu-best-effort-training"
        assert m.group["spec"]["minResources"] == {C.RESOURCE_GPU: "8"}
    else:
        assert pod["metadata"]["labels"][C.LABEL_COSCHEDULING_POD_GROUP] == m.name
        assert m.group["spec"]["scheduleTimeoutSeconds"] == 600
        assert pod["spec"]["schedulerName"] == (C.DEFAULT_SCHEDULER_NAME if backend == C.GANG_BACKEND_AIRFLOW_GPU
                                                else C.COSCHEDULING_SCHEDULER_NAME)


def test_kueue_gang_is_plain_pods_with_kueue_labels():
    m = build(spec(gang_backend=C.GANG_BACKEND_KUEUE, queue="team-nlp-queue"))
    assert m.group is None and m.group_resource is None
    for pod in m.pods:
        validate_core(pod)
        meta = pod["metadata"]
        assert meta["labels"][C.LABEL_KUEUE_POD_GROUP_NAME] == m.name
        assert meta["labels"][C.LABEL_KUEUE_QUEUE_NAME] == "team-nlp-queue"
        assert meta["annotations"][C.ANNOTATION_KUEUE_POD_GROUP_TOTAL] == "2"
        assert C.LABEL_COSCHEDULING_POD_GROUP not in meta["labels"]
        assert pod["spec"]["schedulerName"] == C.KUBE_DEFAULT_SCHEDULER_NAME
    validate_core(m.service)
    with pytest.raises(WorkloadSpecError, match="queue"):
        spec(gang_backend=C.GANG_BACKEND_KUEUE)


def test_pods_carry_rank_checkpoint_env_and_scheduling_hints():
    s = spec()
    m = build(s)
    assert [o["kind"] for o in m.objects()] == ["PodGroup", "Service", "Pod", "Pod"]
    assert m.service["spec"]["clusterIP"] == "None" and m.service["spec"]["publishNotReadyAddresses"]
    assert m.service["spec"]["selector"] == {C.LABEL_GANG: m.name}
    for rank, pod in enumerate(m.pods):
        assert pod["metadata"]["name"] == f"{m.name}-{rank}"
        assert pod["spec"]["hostname"] == pod["metadata"]["name"] and pod["spec"]["subdomain"] == m.name
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env[C.ENV_MASTER_ADDR] == f"{m.name}-0.{m.name}.team-nlp.svc"
        assert (env[C.ENV_RANK], env[C.ENV_WORLD_SIZE], env[C.ENV_LOCAL_WORLD_SIZE]) == (str(rank), "2", "4")
        assert env[C.ENV_MASTER_PORT] == str(C.DEFAULT_MASTER_PORT)
        assert env[C.ENV_ATTEMPT] == "1001" and env[C.ENV_INTERRUPTIONS] == "0"
        assert env[C.ENV_CHECKPOINT_URI] == "s3://ck/nlp/ft" and env["LR"] == "0.001"
        ann = pod["metadata"]["annotations"]
        assert ann[C.ANNOTATION_CHECKPOINTABLE] == "true"
        assert ann[C.ANNOTATION_GPU_PRODUCTS] == "a100-80gb,h100-80gb"
        assert ann[C.ANNOTATION_TOPOLOGY] == "clique:soft"
        assert json.loads(ann[C.ANNOTATION_TASK_INSTANCE])["run_id"] == TI.run_id
        assert (ann[C.ANNOTATION_INTERRUPTIONS], ann[C.ANNOTATION_PREEMPTIONS]) == ("0", "0")
        podspec = pod["spec"]
        assert podspec["priorityClassName"] == "airflow-gpu-best-effort-training"
        assert podspec["nodeSelector"] == {"node.kubernetes.io/instance-type": "p4d.24xlarge",
                                           C.NODE_CAPACITY_TYPE_KARPENTER: C.CAPACITY_SPOT}
        assert {"key": C.TAINT_SPOT, "operator": "Exists", "effect": "NoSchedule"} in podspec["tolerations"]
        assert podspec["containers"][0]["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"},
                                                         "limits": {C.RESOURCE_GPU: "4"}}
    # the scheduler reads the same gang from these objects (kube/convert.py)
    from airflow_gpu.kube.convert import ConversionContext, gang_from_k8s, gang_key_of_pod

    assert {gang_key_of_pod(p) for p in m.pods} == {f"team-nlp/{m.name}"}
    # the namespace decides the team (the quota file maps team-nlp to nlp), the PriorityClass the tier
    gang = gang_from_k8s(f"team-nlp/{m.name}", m.group, list(m.pods), ConversionContext({"team-nlp": "nlp"}))
    assert gang.team == "nlp" and gang.tier == C.TIER_BEST_EFFORT_TRAINING and gang.checkpointable
    assert [r.gpus for r in gang.members] == [4, 4]


def test_relaunch_counters_apart_in_annotations_summed_in_env():
    pod = build(spec(attempt=1003, interruptions=1, preemptions=2)).pods[0]
    ann = pod["metadata"]["annotations"]
    assert (ann[C.ANNOTATION_INTERRUPTIONS], ann[C.ANNOTATION_PREEMPTIONS]) == ("1", "2")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[C.ENV_INTERRUPTIONS] == "3"


@pytest.mark.parametrize("cloud, selector, toleration", [
    ("eks", {C.NODE_CAPACITY_TYPE_EKS: "SPOT"}, C.TAINT_SPOT),
    ("gke", {C.NODE_GKE_SPOT: "true"}, C.TAINT_GKE_SPOT),
])
def test_spot_selectors_per_cloud(cloud, selector, toleration):
    pod = build(spec(capacity_labels=cloud, node_selector={})).pods[0]
    assert pod["spec"]["nodeSelector"] == selector
    assert toleration in {t["key"] for t in pod["spec"]["tolerations"]}
    on_demand = build(spec(capacity_labels=cloud, node_selector={}, capacity_type=C.CAPACITY_ON_DEMAND)).pods[0]
    assert on_demand["spec"].get("nodeSelector", {}) == ({C.NODE_CAPACITY_TYPE_EKS: "ON_DEMAND"} if cloud == "eks" else {})


def test_lone_inference_pod_has_no_gang_labels():
    m = build(spec(gang=False, workers=1, gpus_per_worker=None, mig_profile="1g.10gb", tier=C.TIER_INFERENCE,
                   checkpoint_uri=None, capacity_type=None, name="score-0", task_instance=None))
    assert m.group is None and m.service is None and len(m.pods) == 1
    pod = m.pods[0]
    validate_core(pod)
    assert pod["metadata"]["name"] == "score-0"
    gang_keys = {C.LABEL_GANG, C.LABEL_GANG_RANK, C.LABEL_COSCHEDULING_POD_GROUP, C.LABEL_KUEUE_POD_GROUP_NAME}
    assert not gang_keys & set(pod["metadata"]["labels"])
    assert "subdomain" not in pod["spec"]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {f"{C.RESOURCE_MIG_PREFIX}1g.10gb": "1"}
    names = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert not names & {C.ENV_RANK, C.ENV_MASTER_ADDR, C.ENV_WORLD_SIZE}
    from airflow_gpu.kube.convert import gang_key_of_pod

    assert gang_key_of_pod(pod) is None


def test_no_credential_is_a_literal():
    m = build(spec())
    for pod in m.pods:
        container = pod["spec"]["containers"][0]
        for env in container["env"]:
            if CREDENTIAL.search(env["name"]):
                assert "value" not in env and env["valueFrom"]["secretKeyRef"], env
        assert {"secretRef": {"name": "s3-credentials"}} in container["envFrom"]
        assert {"secretRef": {"name": "hf"}} in container["envFrom"]
        wandb = next(e for e in container["env"] if e["name"] == "WANDB_API_KEY")
        assert wandb["valueFrom"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
        assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(pod)
    for literal in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "HF_TOKEN", "DB_PASSWORD"):
        with pytest.raises(WorkloadSpecError, match=rf"env_vars\['{literal}'\].*Secret"):
            spec(env_vars={literal: "x"})


@pytest.mark.parametrize("kw, field", [
    (dict(gpus_per_worker=0), "gpus_per_worker"),
    (dict(gpus_per_worker=-1), "gpus_per_worker"),
    (dict(mig_profile="1g.10gb"), "gpus_per_worker / mig_profile"),
    (dict(gpus_per_worker=None), "gpus_per_worker / mig_profile"),
    (dict(gpus_per_worker=None, mig_profile="big"), "mig_profile"),
    (dict(workers=0), "workers"),
    (dict(checkpoint_uri=None), "capacity_type='spot' needs checkpoint_uri"),
    (dict(checkpoint_uri="gs://b/p"), "checkpoint_uri"),
    (dict(checkpoint_uri="s3://"), "checkpoint_uri"),
    (dict(gang_backend="slurm"), "gang_backend"),
    (dict(capacity_type="preemptible"), "capacity_type"),
    (dict(topology="galaxy"), "topology"),
    (dict(topology=None, topology_required=True), "topology_required"),
    (dict(env_vars={C.ENV_RANK: "3"}), "env_vars"),
    (dict(labels={C.LABEL_TEAM: "other"}), "labels"),
    (dict(labels={"x": "not a label value"}), "labels"),
    (dict(container_resources={"limits": {C.RESOURCE_GPU: "8"}}), "container_resources"),
    (dict(namespace="Team_NLP"), "namespace"),
    (dict(task_instance=None), "name"),
    (dict(name="x" * 60), "name"),
    (dict(gang=False), "gang=False"),
    (dict(node_selector={C.NODE_CAPACITY_TYPE_KARPENTER: C.CAPACITY_ON_DEMAND}), "node_selector"),
    (dict(secrets=({"secret": "s", "key": "k"},)), "secrets"),
])
def test_bad_specs_name_the_field(kw, field):
    with pytest.raises(WorkloadSpecError) as err:
        build(spec(**kw))
    assert field in str(err.value), str(err.value)


ids = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=250)


@settings(max_examples=200, deadline=None)
@given(dag=ids, task=ids, run=ids, map_index=st.integers(-1, 100000), attempt=st.integers(0, 10**9),
       workers=st.integers(1, 64))
def test_names_and_labels_are_bounded_and_deterministic(dag, task, run, map_index, attempt, workers):
    ti = TaskInstanceRef(dag, task, run, map_index, 3)
    s = WorkloadSpec(team="nlp", namespace="team-nlp", tier="inference", image="i", workers=workers,
                     gpus_per_worker=1, task_instance=ti, attempt=attempt)
    m = build(s)
    assert DNS_LABEL.match(m.name) and len(m.name) <= 57  # a Service name: RFC 1035
    for pod in m.pods:
        assert DNS_LABEL.match(pod["metadata"]["name"]) and len(pod["metadata"]["name"]) <= 63
        for key, value in pod["metadata"]["labels"].items():
            assert len(value) <= 63 and LABEL_VALUE.match(value), (key, value)
    assert build(s).objects() == m.objects()
    other = TaskInstanceRef(dag, task, run, map_index + 1, 3)
    assert WorkloadSpec(**{**s.__dict__, "task_instance": other}).gang_name != m.name
    assert WorkloadSpec(**{**s.__dict__, "attempt": attempt + 1}).gang_name != m.name


def test_long_run_ids_keep_distinct_labels():
    a = TaskInstanceRef("d", "t", "manual__2026-12-03T07:00:00.123456+00:00" + "x" * 80)
    b = TaskInstanceRef("d", "t", "manual__2026-12-03T07:00:00.123456+00:00" + "x" * 79 + "y")
    assert a.labels()[C.LABEL_RUN_ID] != b.labels()[C.LABEL_RUN_ID]
    assert a.selector() != b.selector() and C.LABEL_TRY_NUMBER not in a.selector()


# --- state from synthetic objects ---------------------------------------------------------------


def pod(name, rank, phase="Running", node="n1", exit_code=None, disruption=None, reason=None, deleting=False):
    status: dict = {"phase": phase, "conditions": []}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "base", "state": {"terminated": {"exitCode": exit_code}}}]
    if disruption:
        status["conditions"].append({"type": C.CONDITION_DISRUPTION_TARGET, "status": "True", "reason": disruption,
                                     "message": "spot reclaim"})
    if reason:
        status["reason"] = reason
    meta = {"name": name, "labels": {C.LABEL_GANG_RANK: str(rank)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T07:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


def test_state_classification():
    names = ["g-0", "g-1"]
    pg = {"metadata": {"annotations": {C.ANNOTATION_WAIT_REASON: "team quota: 8 of 8 GPUs in use"}},
          "spec": {"minMember": 2}}
    pending = gang_state([pod("g-0", 0, "Pending", None), pod("g-1", 1, "Pending", None)], pg)
    assert (pending.phase, pending.wait_reason) == (S.PENDING, "team quota: 8 of 8 GPUs in use")
    assert gang_state([pod("g-0", 0, "Pending"), pod("g-1", 1, "Running")], pg).phase == S.ADMITTED
    assert gang_state([pod("g-0", 0), pod("g-1", 1)], pg).phase == S.RUNNING
    ok = gang_state([pod("g-0", 0, "Succeeded", exit_code=0), pod("g-1", 1, "Succeeded", exit_code=0)], pg)
    assert ok.phase == S.SUCCEEDED and ok.exit_codes == {"g-0": 0, "g-1": 0}
    failed = gang_state([pod("g-0", 0, "Failed", exit_code=1), pod("g-1", 1)], pg)
    assert failed.phase == S.FAILED and failed.failed_pods == ("g-0",) and failed.exit_codes == {"g-0": 1}
    # exit 143 after a DisruptionTarget is a disruption, not the application's failure
    spot = gang_state([pod("g-0", 0, "Failed", exit_code=143, disruption=C.REASON_EVICTION_BY_EVICTION_API),
                       pod("g-1", 1, "Failed", exit_code=143)], pg)
    assert spot.phase == S.DISRUPTED and spot.reason.startswith(C.REASON_EVICTION_BY_EVICTION_API)
    assert spot.disrupted_pods == ("g-0",)
    lost = gang_state([pod("g-0", 0, reason=C.POD_REASON_NODE_LOST), pod("g-1", 1)], pg)
    assert lost.phase == S.DISRUPTED and lost.reason.startswith(C.POD_REASON_NODE_LOST)
    vanished = gang_state([pod("g-0", 0, node="gone"), pod("g-1", 1)], pg, live_nodes={"n1"})
    assert vanished.phase == S.DISRUPTED and "gone" in vanished.reason
    partial = gang_state([pod("g-1", 1)], pg, expected_names=names)
    assert partial.phase == S.DISRUPTED and partial.missing == ("g-0",) and S.REASON_PARTIAL_LOSS in partial.reason
    assert gang_state([pod("g-0", 0), pod("g-1", 1, deleting=True)], pg).phase == S.DISRUPTED
    assert gang_state([], pg).reason.startswith(S.REASON_ALL_LOST)


# --- round trip through the local cluster and the scheduler -----------------------------------


@pytest.fixture(scope="module")
def api(kube_api):
    G.ensure_namespace(kube_api, "team-nlp")
    return kube_api


def read_state(api, m, ti: TaskInstanceRef):
    """Everything of the task instance found by its label selector, classified."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    selector = ti.selector()
    pods = core.list_namespaced_pod("team-nlp", label_selector=selector).items
    groups = custom.list_namespaced_custom_object(C.PODGROUP_GROUP, C.PODGROUP_VERSION, "team-nlp", C.PODGROUP_PLURAL,
                                                  label_selector=selector)["items"]
    nodes = {n.metadata.name for n in core.list_node().items}
    return gang_state(pods, groups[0] if groups else None, expected_names=[p["metadata"]["name"] for p in m.pods],
                      live_nodes=nodes)


def round_trip_spec(task: str, **kw):
    ti = TaskInstanceRef("kube_round_trip", task, "manual__2026-12-03T07:00:00+00:00", -1, 1)
    s = WorkloadSpec(team="nlp", namespace="team-nlp", tier=C.TIER_PRODUCTION_TRAINING, image="python:3.11",
                     workers=2, gpus_per_worker=4, task_instance=ti, attempt=1000,
                     capacity_type=C.CAPACITY_ON_DEMAND, termination_grace_period=1, **kw)
    return ti, build(s)


def wait_phase(api, m, ti, phases, timeout=60.0):
    return G.wait_until(lambda: (st := read_state(api, m, ti)).phase in phases and st, timeout,
                        what=lambda: f"{phases}: {read_state(api, m, ti).describe()}")


def cleanup(api, ti) -> None:
    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod("team-nlp", label_selector=ti.selector(), grace_period_seconds=0)
    G.wait_until(lambda: not core.list_namespaced_pod("team-nlp", label_selector=ti.selector()).items, 30,
                 what="pods deleted")


def test_round_trip_success_and_selector(api, gpu_scheduler):
    ti, m = round_trip_spec("ok", annotations={C.ANNOTATION_SIM_DURATION: "2"})
    G.submit_gang(api, m)
    assert wait_phase(api, m, ti, (S.ADMITTED, S.RUNNING, S.SUCCEEDED)).expected == 2
    done = wait_phase(api, m, ti, (S.SUCCEEDED, S.FAILED, S.DISRUPTED))
    assert done.phase == S.SUCCEEDED, done.describe()
    assert done.exit_codes == {p["metadata"]["name"]: 0 for p in m.pods}
    core = client.CoreV1Api(api)
    services = core.list_namespaced_service("team-nlp", label_selector=ti.selector()).items
    assert [s.metadata.name for s in services] == [m.name]
    assert services[0].spec.cluster_ip == "None"
    bound = core.list_namespaced_pod("team-nlp", label_selector=ti.selector()).items
    assert all(p.spec.node_name and p.spec.node_name.startswith("gpu-od") for p in bound)
    cleanup(api, ti)


def test_round_trip_application_failure(api, gpu_scheduler):
    ti, m = round_trip_spec("exit1", annotations={C.ANNOTATION_SIM_DURATION: "1", C.ANNOTATION_SIM_EXIT_CODE: "1"})
    G.submit_gang(api, m)
    done = wait_phase(api, m, ti, (S.SUCCEEDED, S.FAILED, S.DISRUPTED))
    assert done.phase == S.FAILED, done.describe()
    assert set(done.exit_codes.values()) == {1} and "exit 1" in done.reason and not done.disrupted_pods
    cleanup(api, ti)


def test_round_trip_interruption_and_partial_loss(api, gpu_scheduler, kube_cluster):
    ti, m = round_trip_spec("spot", annotations={C.ANNOTATION_SIM_DURATION: "120"})
    G.submit_gang(api, m)
    running = wait_phase(api, m, ti, (S.RUNNING,))
    node = running.members[0].node
    kube_cluster.interrupt(node, notice=3.0, replace_after=2.0)  # the DisruptionTarget comes first, then eviction
    disrupted = wait_phase(api, m, ti, (S.DISRUPTED,), 30)
    assert disrupted.reason.startswith(C.REASON_EVICTION_BY_EVICTION_API), disrupted.describe()
    assert disrupted.disrupted_pods == tuple(mm.name for mm in running.members if mm.node == node)
    cleanup(api, ti)

    ti, m = round_trip_spec("partial", annotations={C.ANNOTATION_SIM_DURATION: "120"})
    G.submit_gang(api, m)
    wait_phase(api, m, ti, (S.RUNNING,))
    client.CoreV1Api(api).delete_namespaced_pod(m.pods[1]["metadata"]["name"], "team-nlp", grace_period_seconds=0)
    partial = G.wait_until(lambda: (st := read_state(api, m, ti)).missing and st, 30, what="a member gone")
    assert partial.phase == S.DISRUPTED and S.REASON_PARTIAL_LOSS in partial.reason, partial.describe()
    assert partial.missing == (m.pods[1]["metadata"]["name"],)
    cleanup(api, ti)

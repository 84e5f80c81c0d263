"""deploy/: built-in kinds validate strictly against Kubernetes 1.37, PodGroups the scheduler writes
validate against the CRD's openAPIV3Schema, and RBAC grants exactly what the scheduler uses. The
kustomize base and every cloud overlay render with `kubectl kustomize` and validate the same way."""

from __future__ import annotations

from pathlib import Path

import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.scheduler.access import REQUIRED, access_of
from airflow_gpu.scheduler.loop import desired_podgroup_status
from airflow_gpu.scheduler.state import Unit

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
OVERLAYS = ("karpenter", "eks", "gke")


def _docs():
    for path in sorted(BASE.glob("*.yaml")):
        if path.name in ("kustomization.yaml", "quotas.yaml"):  # quotas.yaml: the ConfigMap's content
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def test_every_builtin_manifest_validates_strictly_against_1_37():
    kinds = set()
    for name, doc in _docs():
        kinds.add(doc["kind"])
        kubernetes_validate.validate(doc, "1.37.0", strict=True)  # raises on unknown or wrong fields
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "PriorityClass", "CustomResourceDefinition", "Namespace"} <= kinds


def test_strict_validation_catches_a_typo():
    deployment = next(d for _, d in _docs() if d["kind"] == "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.37.0", strict=True)


def test_crd_is_the_shared_upstream_podgroup_crd(shared_dir):
    ours = yaml.safe_load((BASE / "podgroup-crd.yaml").read_text())
    upstream = yaml.safe_load((shared_dir / "crds" / "scheduling.x-k8s.io_podgroups.yaml").read_text())
    assert ours == upstream


def test_priority_classes_match_the_seed_tiers():
    cfg = load_config(REPO / "examples" / "seed-quotas.yaml")
    classes = {d["metadata"]["name"]: d for _, d in _docs() if d["kind"] == "PriorityClass"}
    for tier in cfg.tiers:
        pc = classes[tier.priority_class_name]
        assert pc["value"] == tier.priority
        assert pc.get("preemptionPolicy", "PreemptLowerPriority") == tier.preemption_policy


def _granted(name: str = "airflow-gpu-scheduler") -> set[tuple[str, str, str]]:
    """What the roles of component `name` (label app.kubernetes.io/name) grant."""
    out = set()
    for _, doc in _docs():
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["labels"]["app.kubernetes.io/name"] == name:
            for rule in doc["rules"]:
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        for v in rule["verbs"]:
                            assert "*" not in (g, r, v), f"wildcard in {doc['metadata']['name']}: {rule}"
                            out.add((g, r, v))
    return out


def test_the_airflow_side_may_only_get_the_published_queue():
    from airflow_gpu.kube.queue_status import configmap_name

    assert _granted("airflow-gpu-ui") == {("", "configmaps", "get")}
    (role,) = [d for _, d in _docs() if d["kind"] == "Role" and d["metadata"]["name"] == "airflow-gpu-queue-reader"]
    assert role["rules"][0]["resourceNames"] == [configmap_name(C.DEFAULT_SCHEDULER_NAME)]
    assert role["metadata"]["namespace"] == "airflow-gpu-system"


def test_the_workers_may_only_get_the_preemption_record():
    from airflow_gpu.kube.preemptions import record_name

    assert _granted("airflow-gpu-operator") == {("", "configmaps", "get")}
    (role,) = [d for _, d in _docs() if d["kind"] == "Role" and d["metadata"]["name"] == "airflow-gpu-preemptions-reader"]
    assert role["rules"][0]["resourceNames"] == [record_name(C.DEFAULT_SCHEDULER_NAME)]
    assert role["metadata"]["namespace"] == C.DEFAULT_SCHEDULER_NAMESPACE


def test_rbac_grants_exactly_what_the_scheduler_uses():
    granted = _granted()
    assert granted == set(REQUIRED), (
        f"missing: {sorted(set(REQUIRED) - granted)}; not used: {sorted(granted - set(REQUIRED))}"
    )


def test_deployment_runs_the_scheduler_with_its_service_account():
    dep = next(d for _, d in _docs() if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "airflow-gpu-scheduler"
    args = pod["containers"][0]["args"]
    assert any(a.startswith("--config=") for a in args) and "--scheduler-name=airflow-gpu" in args
    assert dep["spec"]["replicas"] >= 2  # leader election makes the second one a warm standby


@pytest.mark.parametrize(
    "method,url,expected",
    [
        ("GET", "/api/v1/pods?watch=true&resourceVersion=5", ("", "pods", "watch")),
        ("GET", "/api/v1/nodes", ("", "nodes", "list")),
        ("POST", "/api/v1/namespaces/a/pods/p/binding", ("", "pods/binding", "create")),
        ("PATCH", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/a/podgroups/g/status",
         ("scheduling.x-k8s.io", "podgroups/status", "patch")),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/s/leases/l", ("coordination.k8s.io", "leases", "update")),
    ],
)
def test_access_of_maps_requests_to_rbac_terms(method, url, expected):
    assert access_of(method, url) == expected


def _crd_schema(shared_dir):
    crd = yaml.safe_load((shared_dir / "crds" / "scheduling.x-k8s.io_podgroups.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_podgroups_the_scheduler_writes_validate_against_the_crd(shared_dir):
    schema = _crd_schema(shared_dir)
    pg = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "team-nlp", "labels": {C.LABEL_TEAM: "nlp"}},
        "spec": {"minMember": 2},
    }
    pods = [
        {"metadata": {"name": f"train-{i}", "namespace": "team-nlp",
                      "labels": {C.LABEL_COSCHEDULING_POD_GROUP: "train"}},
         "spec": {"schedulerName": "airflow-gpu", "nodeName": "n1"}, "status": {"phase": "Running"}}
        for i in range(2)
    ]
    for has_plan in (True, False):
        status = desired_podgroup_status(Unit("team-nlp/train", pg, pods), has_plan, {})
        # a real API server prunes fields the schema does not declare: write none of them
        assert set(status) <= set(schema["properties"]["status"]["properties"])
        obj = {**pg, "status": status, "metadata": {**pg["metadata"], "annotations": {
            C.ANNOTATION_WAIT_REASON: "needs 16 GPUs",
            C.ANNOTATION_SCHEDULED: "2/2"}}}
        jsonschema.validate(obj, schema)
    assert desired_podgroup_status(Unit("team-nlp/train", pg, pods), False, {})["phase"] == "Running"
    # a pending group past spec.scheduleTimeoutSeconds: phase TimedOut, still schema-valid
    waiting = [{**p, "spec": {"schedulerName": "airflow-gpu"}, "status": {"phase": "Pending"}} for p in pods]
    status = desired_podgroup_status(Unit("team-nlp/train", pg, waiting), False, {}, timed_out=True)
    assert status["phase"] == C.PODGROUP_PHASE_TIMED_OUT
    jsonschema.validate({**pg, "spec": {"minMember": 2, "scheduleTimeoutSeconds": 60}, "status": status}, schema)
    assert desired_podgroup_status(Unit("team-nlp/train", pg, pods), False, {}, timed_out=True)["phase"] == "Running"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**pg, "spec": {"minMember": 0}}, schema)


def test_example_gang_manifest_validates_and_converts(shared_dir):
    """examples/scheduler-gang.yaml: Pods strict against 1.37, the PodGroup against the CRD, and the
    scheduler reads it as one 2-member gang of 4 GPUs each."""
    from airflow_gpu.kube.convert import ConversionContext, gang_from_k8s

    docs = list(yaml.safe_load_all((REPO / "examples" / "scheduler-gang.yaml").read_text()))
    pg = next(d for d in docs if d["kind"] == "PodGroup")
    pods = [d for d in docs if d["kind"] == "Pod"]
    jsonschema.validate(pg, _crd_schema(shared_dir))
    for pod in pods:
        kubernetes_validate.validate(pod, "1.37.0", strict=True)
    cfg = load_config(REPO / "examples" / "seed-quotas.yaml")
    gang = gang_from_k8s("team-nlp/finetune", pg, pods, ConversionContext.from_config(cfg))
    assert (gang.team, gang.tier, len(gang.members), gang.members[0].gpus) == ("nlp", "production-training", 2, 4)
    # checkpointable production: on-demand first, spot when on-demand is full (spot_fallback)
    assert gang.members[0].capacity_types == ("on-demand", "spot") and pg["spec"]["minMember"] == len(pods)


def _render(path: Path) -> list[dict]:
    result = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def _scheduler_pod(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize("target", ["", *(f"overlays/{c}" for c in OVERLAYS)])
def test_kustomize_renders_and_every_object_validates(target, shared_dir):
    docs = _render(DEPLOY / target)
    crd_schemas = {}
    for path in (shared_dir / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for v in crd["spec"]["versions"]:
            crd_schemas[(f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in crd_schemas:
            jsonschema.validate(doc, crd_schemas[key])
        else:
            kubernetes_validate.validate(doc, "1.37.0", strict=True)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "CustomResourceDefinition", "PriorityClass", "ServiceAccount", "ClusterRole", "Role",
            "ConfigMap", "Deployment"} <= kinds
    # the generated quota ConfigMap is the one the scheduler mounts, and it is a valid quota config
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    volumes = {v["name"]: v for v in _scheduler_pod(docs)["volumes"]}
    assert volumes["quotas"]["configMap"]["name"] == cm["metadata"]["name"]
    assert cm["metadata"]["name"].startswith("airflow-gpu-quotas-")  # content hash: a change rolls the pods
    from airflow_gpu.config.load import parse_config

    cfg = parse_config(yaml.safe_load(cm["data"]["quotas.yaml"]), "quotas.yaml")
    classes = {d["metadata"]["name"]: d["value"] for d in docs if d["kind"] == "PriorityClass"}
    assert all(classes[t.priority_class_name] == t.priority for t in cfg.tiers)


@pytest.mark.parametrize("cloud", OVERLAYS)
def test_overlays_keep_the_scheduler_off_spot_and_agree_with_the_operators_labels(cloud, monkeypatch):
    """The overlay's on-demand rule for the scheduler uses the label the operator's pods select by when
    Airflow has `[airflow_gpu] capacity_labels = <cloud>`; spot pods also tolerate the spot taint."""
    from airflow_gpu.kube.manifests import capacity_placement
    from airflow_gpu.kube.spec import WorkloadSpec
    from airflow_gpu.operators.gpu_training import capacity_labels_setting

    pod = _scheduler_pod(_render(DEPLOY / "overlays" / cloud))
    assert "nodeSelector" not in _scheduler_pod(_render(DEPLOY))  # the plain base stays cloud-neutral
    monkeypatch.setenv("AIRFLOW__AIRFLOW_GPU__CAPACITY_LABELS", cloud)
    assert capacity_labels_setting() == cloud
    spec = lambda capacity: WorkloadSpec(team="nlp", namespace="team-nlp", tier=C.TIER_BEST_EFFORT_TRAINING,  # noqa: E731
                                         image="python:3.11", name="g", gpus_per_worker=1, capacity_type=capacity,
                                         checkpoint_uri="s3://ckpt/g",
                                         capacity_labels=capacity_labels_setting())
    spot_selector, spot_tolerations = capacity_placement(spec(C.CAPACITY_SPOT))
    od_selector, _ = capacity_placement(spec(C.CAPACITY_ON_DEMAND))
    assert any(t["key"] == C.TAINT_SPOT for t in spot_tolerations)
    if cloud == "gke":  # GKE labels spot nodes only: "on-demand" is the label's absence
        (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchExpressions"] == [{"key": C.NODE_GKE_SPOT, "operator": "DoesNotExist"}]
        assert spot_selector == {C.NODE_GKE_SPOT: "true"} and od_selector == {}
    else:
        assert pod["nodeSelector"] == od_selector
        assert set(spot_selector) == set(od_selector) and spot_selector != od_selector

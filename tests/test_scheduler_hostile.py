"""A hostile or careless user against the real scheduler on the local cluster (issue 10, items 1-2):
malformed objects are reported on themselves and skipped while every other gang is scheduled, and
state a user can write (annotations) never makes the scheduler evict or bind."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu import constants as C
from airflow_gpu.core.model import Placement
from airflow_gpu.devtools import gangs as G
from airflow_gpu.scheduler.actions import Api
from airflow_gpu.scheduler.loop import Scheduler, Settings
from airflow_gpu.scheduler.state import PLAN_BINDING, PLAN_NOMINATED, Plan, plan_store_name

PRODUCT = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "hostile", "pools": [
        {"name": "od", "count": 3, "capacityType": "on-demand", "gpu": {"product": PRODUCT, "count": 8}},
        {"name": "spot", "count": 1, "capacityType": "spot", "gpu": {"product": PRODUCT, "count": 8}},
    ]}


def _run(scheduler: Scheduler) -> threading.Thread:
    t = threading.Thread(target=scheduler.run, daemon=True)
    t.start()
    return t


def _reasons(api, ns: str) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for e in G.events_for(api, ns):
        out.setdefault(e["involvedObject"]["name"], []).append((e["reason"], e["message"]))
    return out


def test_malformed_objects_are_reported_and_skipped_while_healthy_gangs_bind(kube_cluster, caplog):
    api = G.api_client(kube_cluster.kubeconfig)
    core = client.CoreV1Api(api)
    ns = "malformed"
    G.ensure_namespace(api, ns)
    sched_api = Api(api, "test", "someone")
    # 1. a running pod whose last-checkpoint hint is not a time
    core.create_namespaced_pod(ns, G.pod_manifest("ckpt", ns, 1, annotations={
        C.ANNOTATION_LAST_CHECKPOINT_TIME: "yesterday", C.ANNOTATION_CHECKPOINTABLE: "true"}), _preload_content=False)
    sched_api.bind(f"{ns}/ckpt", "od-0")
    # 2. a pending lone pod carrying a placement annotation that is not a plan
    core.create_namespaced_pod(ns, G.pod_manifest("listplan", ns, 1, annotations={C.ANNOTATION_PLACEMENT: "[]"}),
                               _preload_content=False)
    # 3. a PodGroup whose status.scheduleStartTime is not a time (1 of 2 members: it waits, timeout applies)
    G.create_podgroup(api, ns, "badstart", 2)
    custom = client.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", "badstart", {"spec": {"scheduleTimeoutSeconds": 1}})
    try:
        sched_api.patch_podgroup_status(f"{ns}/badstart", {"scheduleStartTime": "not-a-time"})
        bad_start_stored = True
    except ApiException as exc:  # a server validating format: date-time refuses it at the door: fine too
        assert exc.status in (400, 422), exc
        bad_start_stored = False
    core.create_namespaced_pod(ns, G.pod_manifest("badstart-0", ns, 1, group="badstart"), _preload_content=False)
    # 4. gangs whose expected duration hint is nan / negative: wait with the field named
    G.create_gang(api, ns, "nan", 2, 1, pg_annotations={C.ANNOTATION_EXPECTED_DURATION: "nan"})
    G.create_gang(api, ns, "negative", 2, 1, pg_annotations={C.ANNOTATION_EXPECTED_DURATION: "-1e12"})
    healthy = [f"ok{i}" for i in range(3)]
    for name in healthy:
        G.create_gang(api, ns, name, 2, 2)

    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(interval=0.5), identity="malformed")
    runner = _run(scheduler)
    try:
        def healthy_bound():
            state = G.gang_binding_state(G.list_pods(api, ns))
            return all(state.get(f"{ns}/{n}") == (2, 2) for n in healthy)

        G.wait_until(healthy_bound, 30, what="healthy gangs bound next to the malformed objects")
        G.wait_until(lambda: {"nan", "negative", "ckpt"} <= set(_reasons(api, ns)), 15, what="events on bad objects")
        events = _reasons(api, ns)
        nan_msgs = [m for r, m in events["nan"] if r == "FailedScheduling"]
        assert nan_msgs and C.ANNOTATION_EXPECTED_DURATION in nan_msgs[0] and "'nan'" in nan_msgs[0], events["nan"]
        assert any(C.ANNOTATION_EXPECTED_DURATION in m for r, m in events["negative"] if r == "FailedScheduling")
        for name in ("nan", "negative"):
            pg = G.get_podgroup(api, ns, name)
            assert C.ANNOTATION_EXPECTED_DURATION in pg["metadata"]["annotations"].get(C.ANNOTATION_WAIT_REASON, "")
        # the running pod keeps running and counting; its hint is ignored with a warning Event
        hint = [m for r, m in events["ckpt"] if r == "InvalidHint"]
        assert hint and "yesterday" in hint[0] and C.ANNOTATION_LAST_CHECKPOINT_TIME in hint[0], events["ckpt"]
        if bad_start_stored:
            G.wait_until(lambda: any("scheduleStartTime" in m for _, m in _reasons(api, ns).get("badstart", [])),
                         15, what="badstart reported")
        pods = {p["metadata"]["name"]: p for p in G.list_pods(api, ns)}
        assert pods["ckpt"]["spec"]["nodeName"] == "od-0"
        assert not pods["nan-0"]["spec"].get("nodeName") and not pods["negative-0"]["spec"].get("nodeName")
        # no cycle failed as a whole, however many ran
        cycles = scheduler.cycles
        G.wait_until(lambda: scheduler.cycles >= cycles + 2, 15, what="more cycles")
        assert not [r for r in caplog.records if "scheduling cycle failed" in r.getMessage()]
        assert bad_start_stored  # the local cluster stores it, as a server that does not check formats would
        assert scheduler.metrics.registry.get_sample_value("airflow_gpu_bindings_total") >= 6
        # the old plan annotation is no scheduler state: the lone pod carrying "[]" is scheduled as any other
        G.wait_until(lambda: core.read_namespaced_pod("listplan", ns).spec.node_name, 10, what="listplan bound")
    finally:
        scheduler.stop()
        runner.join(10)
        _cleanup(api, ns)


@pytest.mark.parametrize("text", ["nan", "inf", "-1e12", "0", "1e30", "abc", "1" * 5000])
def test_expected_duration_hint_is_bounded(text):
    from airflow_gpu.kube.convert import ConversionError, expected_duration

    with pytest.raises(ConversionError, match=C.ANNOTATION_EXPECTED_DURATION):
        expected_duration(text, "gang a/b")
    assert expected_duration("3600", "gang a/b") == 3600.0


def test_an_unreadable_checkpoint_hint_is_ignored_on_a_running_gang():
    from airflow_gpu.core.model import Placement
    from airflow_gpu.kube.convert import ConversionContext, running_gang_from_k8s

    def pod(ckpt):
        return {"metadata": {"name": "p", "namespace": "a", "annotations": {
                    C.ANNOTATION_CHECKPOINTABLE: "true", C.ANNOTATION_LAST_CHECKPOINT_TIME: ckpt},
                    "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "startTime": "2026-01-01T10:00:00Z"}}

    placement = (Placement("a/p", "n", ((0, 1000),)),)
    for bad in ("yesterday", "nan", "1e999", "-5", "10000-01-01T00:00:00Z"):
        problems: list[str] = []
        rg = running_gang_from_k8s("a/p", None, [pod(bad)], ConversionContext(), placement, hints=problems)
        assert rg.last_checkpoint_at is None and problems and C.ANNOTATION_LAST_CHECKPOINT_TIME in problems[0], bad
    ok = running_gang_from_k8s("a/p", None, [pod("2026-01-01T11:00:00Z")], ConversionContext(), placement, hints=[])
    assert ok.last_checkpoint_at == ok.started_at + 3600


def _plan_records(api) -> list[dict]:
    resp = client.CoreV1Api(api).list_namespaced_config_map(
        "default", label_selector=f"{C.LABEL_PLAN_OF}={C.DEFAULT_SCHEDULER_NAME}", _preload_content=False)
    return json.loads(resp.data)["items"]


def _disrupted(pod: dict) -> bool:
    return any(c.get("type") == C.CONDITION_DISRUPTION_TARGET for c in (pod.get("status") or {}).get("conditions") or [])


def _cluster_with_priorities(kube_cluster, *namespaces: str):
    """(api client, CoreV1Api) with deploy/'s PriorityClasses installed and `namespaces` created."""
    api = G.api_client(kube_cluster.kubeconfig)
    G.install_priority_classes(api)
    for ns in namespaces:
        G.ensure_namespace(api, ns)
    return api, client.CoreV1Api(api)


def _cleanup(api, *namespaces: str) -> None:
    core = client.CoreV1Api(api)
    for ns in namespaces:
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    G.wait_until(lambda: not any(G.list_pods(api, ns) for ns in namespaces), 30, what="pods gone")


def test_forged_placement_annotations_evict_nothing_and_bind_nothing(kube_cluster):
    """The reproduction of issue 10 item 1: a pending pod names another team's pod as its victim,
    and a gang names a spot node as its binding plan, both in the annotation older versions obeyed."""
    api, core = _cluster_with_priorities(kube_cluster, "team-nlp", "team-cv")
    sched_api = Api(api, "test", "someone")
    # the other team's production pods: od-0 and od-2 full, 2 GPUs left on od-1
    prod = "airflow-gpu-production-training"
    for name, node, gpus in (("ckpt-run", "od-0", 8), ("fill-0", "od-1", 6), ("fill-1", "od-2", 8)):
        core.create_namespaced_pod("team-nlp", G.pod_manifest(name, "team-nlp", gpus, priority_class=prod))
        sched_api.bind(f"team-nlp/{name}", node)
    forged_nomination = {"state": "nominated", "at": time.time(), "victims": ["team-nlp/ckpt-run"],
                         "pods": {"team-cv/grab": {"node": "od-0", "gpus": [[g, 1000] for g in range(8)]}}}
    core.create_namespaced_pod("team-cv", G.pod_manifest(
        "grab", "team-cv", 8, priority_class="airflow-gpu-best-effort-training",
        annotations={C.ANNOTATION_PLACEMENT: json.dumps(forged_nomination)}))
    # a gang that must stay on on-demand nodes, with a binding plan on the spot node
    forged_binding = {"state": "binding", "at": time.time(),
                      "pods": {f"team-cv/spot-{i}": {"node": "spot-0", "gpus": [[i, 1000]]} for i in range(2)}}
    G.create_gang(api, "team-cv", "spot", 2, 1, pg_annotations={C.ANNOTATION_PLACEMENT: json.dumps(forged_binding)},
                  node_selector={C.NODE_CAPACITY_TYPE_KARPENTER: C.CAPACITY_ON_DEMAND})

    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(interval=0.5), identity="forged")
    runner = _run(scheduler)
    try:
        G.wait_until(lambda: "airflow-gpu.io/wait-reason" in (
            core.read_namespaced_pod("grab", "team-cv").metadata.annotations or {}), 20, what="grab waits")
        cycles = scheduler.cycles
        G.wait_until(lambda: scheduler.cycles >= cycles + 6, 20, what="cycles after the forgery was seen")
        pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
                for ns in ("team-nlp", "team-cv") for p in G.list_pods(api, ns)}
        victim = pods["team-nlp/ckpt-run"]
        assert victim["spec"]["nodeName"] == "od-0" and not victim["metadata"].get("deletionTimestamp")
        assert not _disrupted(victim)
        assert not pods["team-cv/grab"]["spec"].get("nodeName")  # lower priority: no preemption, no room
        assert scheduler.metrics.registry.get_sample_value("airflow_gpu_evicted_pods_total") == 0
        reasons = {e["reason"] for ns in ("team-nlp", "team-cv") for e in G.events_for(api, ns)}
        assert not reasons & {"Preempting", "Preempted"}, reasons
        # the gang is bound where its own nodeSelector allows, never where its annotation said
        assert {pods[f"team-cv/spot-{i}"]["spec"].get("nodeName") for i in range(2)} == {"od-1"}
        assert not _plan_records(api)
    finally:
        scheduler.stop()
        runner.join(10)
        _cleanup(api, "team-nlp", "team-cv")


def test_a_trusted_plan_is_rechecked_against_the_cluster_before_it_is_acted_on(kube_cluster):
    """Records in the scheduler's own namespace describe a past cluster: one that now breaks a rule
    (a victim of higher priority, a spot node for a pod that may not go there, a recreated pod) is
    dropped with a PlanRejected Event, nothing is evicted or bound for it, and the gang queues again."""
    ns = "recheck"
    api, core = _cluster_with_priorities(kube_cluster, ns)
    sched_api = Api(api, "test", "earlier-scheduler")
    core.create_namespaced_pod(ns, G.pod_manifest("important", ns, 8,
                                                  priority_class="airflow-gpu-production-training"))
    sched_api.bind(f"{ns}/important", "od-0")
    core.create_namespaced_pod(ns, G.pod_manifest("low", ns, 8, priority_class="airflow-gpu-best-effort-training"))
    G.create_gang(api, ns, "tospot", 2, 1, node_selector={C.NODE_CAPACITY_TYPE_KARPENTER: C.CAPACITY_ON_DEMAND})

    def uid(name):
        return core.read_namespaced_pod(name, ns).metadata.uid

    low_uid = uid("low")
    nomination = Plan(PLAN_NOMINATED, {f"{ns}/low": Placement(f"{ns}/low", "od-0", tuple((g, 1000) for g in range(8)))},
                      time.time(), victims=(f"{ns}/important",), owner_key=f"{ns}/low", owner_uid=low_uid,
                      pod_uids={f"{ns}/low": low_uid}, victim_uids={f"{ns}/important": uid("important")})
    sched_api.write_plan("default", plan_store_name(low_uid), C.DEFAULT_SCHEDULER_NAME, nomination.to_json())
    pg_uid = G.get_podgroup(api, ns, "tospot")["metadata"]["uid"]
    binding = Plan(PLAN_BINDING, {f"{ns}/tospot-{i}": Placement(f"{ns}/tospot-{i}", "spot-0", ((i, 1000),))
                                  for i in range(2)}, time.time(), owner_key=f"{ns}/tospot", owner_uid=pg_uid,
                   pod_uids={f"{ns}/tospot-{i}": uid(f"tospot-{i}") for i in range(2)})
    sched_api.write_plan("default", plan_store_name(pg_uid), C.DEFAULT_SCHEDULER_NAME, binding.to_json())
    # a record whose owner is gone (recreated under the same name) is deleted, not applied
    orphan = Plan(PLAN_BINDING, {f"{ns}/ghost": Placement(f"{ns}/ghost", "od-1", ((0, 1000),))}, time.time(),
                  owner_key=f"{ns}/ghost", owner_uid="0000-gone", pod_uids={f"{ns}/ghost": "0000-gone"})
    sched_api.write_plan("default", plan_store_name("0000-gone"), C.DEFAULT_SCHEDULER_NAME, orphan.to_json())

    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(interval=0.5), identity="recheck")
    runner = _run(scheduler)
    try:
        G.wait_until(lambda: G.gang_binding_state(G.list_pods(api, ns)).get(f"{ns}/tospot") == (2, 2), 30,
                     what="gang bound after its stale plan was rejected")
        pods = {p["metadata"]["name"]: p for p in G.list_pods(api, ns)}
        assert {pods[f"tospot-{i}"]["spec"]["nodeName"] for i in range(2)} <= {"od-1", "od-2"}
        assert pods["important"]["spec"]["nodeName"] == "od-0" and not _disrupted(pods["important"])
        assert not pods["important"]["metadata"].get("deletionTimestamp")
        rejected = {e["involvedObject"]["name"]: e["message"] for e in G.events_for(api, ns)
                    if e["reason"] == "PlanRejected"}
        assert "may not preempt" in rejected.get("low", ""), rejected
        assert "spot-0" in rejected.get("tospot", "") and "node selector" in rejected["tospot"], rejected
        # the lower-priority pod then goes where there is room, through the normal cycle
        G.wait_until(lambda: (core.read_namespaced_pod("low", ns).spec.node_name or "") in ("od-1", "od-2"), 20,
                     what="low bound where there is room")
        G.wait_until(lambda: not _plan_records(api), 10, what="every plan record closed or deleted")
        assert scheduler.metrics.registry.get_sample_value("airflow_gpu_evicted_pods_total") == 0
    finally:
        scheduler.stop()
        runner.join(10)
        _cleanup(api, ns)


def test_podgroup_status_is_a_subresource_the_main_resource_cannot_write(kube_cluster):
    """What the scheduler keeps in PodGroup status (phase, counts) cannot be set through the main
    resource (which is what tenants may write), and /status cannot change the spec."""
    api = G.api_client(kube_cluster.kubeconfig)
    custom = client.CustomObjectsApi(api)
    ns = "subresource"
    G.ensure_namespace(api, ns)
    G.create_podgroup(api, ns, "pg", 2)
    args = ("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", "pg")
    custom.patch_namespaced_custom_object_status(*args, {"status": {"phase": "Pending", "running": 0}})
    custom.patch_namespaced_custom_object(*args, {"status": {"phase": "Running", "running": 2}, "spec": {"minMember": 3}})
    pg = G.get_podgroup(api, ns, "pg")
    assert pg["status"] == {"phase": "Pending", "running": 0} and pg["spec"]["minMember"] == 3
    whole = {**pg, "status": {"phase": "Finished"}}
    whole["spec"] = {"minMember": 4}
    pg = custom.replace_namespaced_custom_object(*args, whole)
    assert pg["status"] == {"phase": "Pending", "running": 0} and pg["spec"]["minMember"] == 4
    custom.patch_namespaced_custom_object_status(*args, {"spec": {"minMember": 9}, "status": {"phase": "Scheduled"}})
    pg = G.get_podgroup(api, ns, "pg")
    assert pg["spec"]["minMember"] == 4 and pg["status"]["phase"] == "Scheduled"
    pg = custom.replace_namespaced_custom_object_status(*args, {**pg, "spec": {"minMember": 7}})
    assert pg["spec"]["minMember"] == 4


def test_a_restarted_scheduler_carries_out_a_valid_nomination_from_its_record(kube_cluster):
    """The other side of the re-check: a nomination a scheduler wrote before dying (victims of lower
    priority, still running) is carried out by the next one - victims evicted, the gang bound where
    the record says - without being planned again."""
    ns = "nominated"
    api, core = _cluster_with_priorities(kube_cluster, ns)
    dead = Api(api, "test", "dead-scheduler")
    for name, node in (("be-0", "od-0"), ("be-1", "od-1"), ("be-2", "od-2")):
        core.create_namespaced_pod(ns, G.pod_manifest(name, ns, 8, priority_class="airflow-gpu-best-effort-training",
                                                      grace=0))
        dead.bind(f"{ns}/{name}", node)
    core.create_namespaced_pod(ns, G.pod_manifest("prod", ns, 8, priority_class="airflow-gpu-production-training"))
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in G.list_pods(api, ns)}
    nomination = Plan(PLAN_NOMINATED, {f"{ns}/prod": Placement(f"{ns}/prod", "od-1", tuple((g, 1000) for g in range(8)))},
                      time.time(), victims=(f"{ns}/be-1",), owner_key=f"{ns}/prod", owner_uid=uid["prod"],
                      pod_uids={f"{ns}/prod": uid["prod"]}, victim_uids={f"{ns}/be-1": uid["be-1"]})
    dead.write_plan("default", plan_store_name(uid["prod"]), C.DEFAULT_SCHEDULER_NAME, nomination.to_json())

    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(interval=0.5), identity="next")
    runner = _run(scheduler)
    try:
        G.wait_until(lambda: core.read_namespaced_pod("prod", ns).spec.node_name, 30, what="prod bound")
        pods = {p["metadata"]["name"]: p for p in G.list_pods(api, ns)}
        assert pods["prod"]["spec"]["nodeName"] == "od-1"  # where the record said
        assert "be-1" not in pods or pods["be-1"]["metadata"].get("deletionTimestamp")
        for other in ("be-0", "be-2"):  # only the recorded victim was stopped
            assert other in pods and not pods[other]["metadata"].get("deletionTimestamp")
        assert not [e for e in G.events_for(api, ns) if e["reason"] in ("PlanRejected", "Preempting")]
        G.wait_until(lambda: not _plan_records(api), 10, what="nomination record closed")
    finally:
        scheduler.stop()
        runner.join(10)
        _cleanup(api, ns)

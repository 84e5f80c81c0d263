"""A hostile or careless user against the real scheduler on the local cluster (issue 10, items 1-2):
malformed objects are reported on themselves and skipped while every other gang is scheduled, and
state a user can write (annotations) never makes the scheduler evict or bind."""

from __future__ import annotations

import threading

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu import constants as C
from airflow_gpu.devtools import gangs as G
from airflow_gpu.scheduler.actions import Api
from airflow_gpu.scheduler.loop import Scheduler, Settings

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
    finally:
        scheduler.stop()
        runner.join(10)
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)


@pytest.mark.parametrize("text", ["nan", "inf", "-1e12", "0", "1e30", "abc", "1" * 5000])
def test_expected_duration_hint_is_bounded(text):
    from airflow_gpu.scheduler.convert import ConversionError, expected_duration

    with pytest.raises(ConversionError, match=C.ANNOTATION_EXPECTED_DURATION):
        expected_duration(text, "gang a/b")
    assert expected_duration("3600", "gang a/b") == 3600.0


def test_checkpoint_hint_cannot_buy_protection_from_preemption():
    """A forged old (or unreadable) last-checkpoint time does not make a gang look costlier to stop."""
    from airflow_gpu.core.model import Placement
    from airflow_gpu.scheduler.convert import ConversionContext, running_gang_from_k8s

    def pod(ckpt):
        return {"metadata": {"name": "p", "namespace": "a", "annotations": {
                    C.ANNOTATION_CHECKPOINTABLE: "true", C.ANNOTATION_LAST_CHECKPOINT_TIME: ckpt},
                    "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "startTime": "2026-01-01T10:00:00Z"}}

    placement = (Placement("a/p", "n", ((0, 1000),)),)
    problems: list[str] = []
    forged = running_gang_from_k8s("a/p", None, [pod("1970-01-01T00:00:01Z")], ConversionContext(), placement,
                                   hints=problems)
    assert forged.last_checkpoint_at == forged.started_at  # clamped to this run's start
    bad = running_gang_from_k8s("a/p", None, [pod("yesterday")], ConversionContext(), placement, hints=problems)
    assert bad.last_checkpoint_at is None and any("yesterday" in p for p in problems)

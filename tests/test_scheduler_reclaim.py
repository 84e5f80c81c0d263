"""The scheduler against the local cluster: a team reclaims its lent quota from a borrower of the
same tier (SIGTERM + grace period, then the owner binds), also from one whose tier label claims
more than its PriorityClass; a team label moves neither quota nor billing; and a PodGroup past its
spec.scheduleTimeoutSeconds is reported as timed out while its pods stay pending."""

from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import closing, contextmanager

import pytest
from kubernetes import client
from test_scheduler_gangs import PRODUCT, SIGTERM_SCRIPT, Marker, _quota_config

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.devtools import gangs as G
from airflow_gpu.constants import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION
from airflow_gpu.scheduler.loop import Scheduler, Settings
from airflow_gpu.ui.service import usage_records

BE_CLASS = "airflow-gpu-best-effort-training"
PROD_CLASS = "airflow-gpu-production-training"


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "sched-reclaim", "pools": [{"name": "h100", "count": 1, "cliques": ["c1"],
                                                "gpu": {"product": PRODUCT, "count": 8}}]}


@pytest.fixture(scope="module")
def api(kube_cluster):
    api = G.api_client(kube_cluster.kubeconfig)
    G.install_priority_classes(api)  # the tiers' PriorityClasses, as deploy/ installs them (best-effort: Never)
    return api


def run(scheduler: Scheduler) -> threading.Thread:
    t = threading.Thread(target=scheduler.run, daemon=True)
    t.start()
    return t


def bound(api, ns: str, name: str) -> int:
    return G.gang_binding_state(G.list_pods(api, ns)).get(f"{ns}/{name}", (0, 0))[0]


@contextmanager
def scheduling(kube_cluster, api, tmp_path, teams: list[dict], identity: str):
    """The teams' namespaces and quota config, and a scheduler running on them; afterwards the
    scheduler is stopped and the namespaces' pods are deleted."""
    namespaces = [t["namespace"] for t in teams]
    for ns in namespaces:
        G.ensure_namespace(api, ns)
    cfg = load_config(_quota_config(tmp_path, teams))
    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), cfg, Settings(), identity=identity)
    runner = run(scheduler)
    try:
        yield cfg, scheduler
    finally:
        scheduler.stop()
        runner.join(10)
        for ns in namespaces:
            client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        G.wait_until(lambda: not any(G.list_pods(api, ns) for ns in namespaces), 30, what="pods deleted")


def test_owner_reclaims_lent_quota_from_a_same_tier_borrower(kube_cluster, api, tmp_path):
    a, b = "reclaim-a", "reclaim-b"
    teams = [{"name": "a", "namespace": a, "quota": {"h100": 4}, "borrowing_limit": {"h100": 4}},
             {"name": "b", "namespace": b, "quota": {"h100": 4}}]
    marker = Marker()
    with scheduling(kube_cluster, api, tmp_path, teams, "reclaim-same-tier") as (_, scheduler), closing(marker):
        # team a runs its own 4 GPUs, then borrows team b's idle 4, all best-effort
        G.create_gang(api, a, "a-own", 1, 4, priority_class=BE_CLASS, sim_seconds=60)
        G.wait_until(lambda: bound(api, a, "a-own") == 1, 20, what="a-own bound")
        G.create_gang(api, a, "a-borrow", 1, 4, priority_class=BE_CLASS, grace=5,
                      command=[sys.executable, "-c", SIGTERM_SCRIPT], env={"MARKER": marker.address},
                      annotations={C.ANNOTATION_CHECKPOINTABLE: "true"})
        G.wait_until(lambda: bound(api, a, "a-borrow") == 1, 20, what="a-borrow bound")
        ann = G.get_podgroup(api, a, "a-borrow")["metadata"].get("annotations") or {}
        assert ann.get(C.ANNOTATION_BORROWED) == "true"
        G.wait_until(marker.started, 20, what="borrower running")

        # team b's gang of the SAME tier and priority wants its guaranteed 4 GPUs back
        G.create_gang(api, b, "b-job", 1, 4, priority_class=BE_CLASS, sim_seconds=30)
        G.wait_until(lambda: bound(api, b, "b-job") == 1, 30, what="team b's gang bound")

        lines = marker.lines()
        assert sum(x.startswith("sigterm") for x in lines) == 1, lines  # SIGTERM ...
        assert sum(x.startswith("saved") for x in lines) == 1, lines  # ... and the grace period to save
        pods = {p["metadata"]["name"]: p for p in G.list_pods(api, a)}
        assert "a-borrow-0" not in pods or pods["a-borrow-0"]["status"].get("phase") in ("Succeeded", "Failed")
        assert bound(api, a, "a-own") == 1  # within team a's guarantee: untouched
        events = G.events_for(api, a, "a-borrow")
        assert any(e["reason"] == "Preempted" and "quota is reclaimed" in e["message"] for e in events), events
        assert any(e["reason"] == "Preempting" and "borrowing" in e["message"] for e in G.events_for(api, b, "b-job"))
        value = scheduler.metrics.registry.get_sample_value(
            "airflow_gpu_preemptions_total", {"team": "a", "tier": "best-effort-training", "reason": "reclaim"})
        assert value == 1.0
        assert G.overcommitted_nodes(api) == {}


def ignored_label_events(api, ns: str, name: str, label: str) -> list[dict]:
    return [e for e in G.events_for(api, ns, name) if e["reason"] == "InvalidHint" and e["type"] == "Warning"
            and f"label {label}=" in e["message"]]


def test_a_tier_label_on_a_borrower_does_not_stop_reclaim(kube_cluster, api, tmp_path):
    """Issue 32, first reproduction: research's borrower, labelled tier=interactive at the best-effort
    PriorityClass, was never reclaimed (interactive is never preempted) and nlp's production gang,
    within its guarantee, waited ("reclaiming 8"). The PriorityClass is the tier: it is reclaimed."""
    a, b = "tierlabel-research", "tierlabel-nlp"
    teams = [{"name": "research", "namespace": a, "quota": {"h100": 4}, "borrowing_limit": {"h100": 4}},
             {"name": "nlp", "namespace": b, "quota": {"h100": 4}}]
    claim = {C.LABEL_TIER: C.TIER_INTERACTIVE}
    with scheduling(kube_cluster, api, tmp_path, teams, "reclaim-tier-label") as (_, scheduler):
        G.create_gang(api, a, "own", 1, 4, priority_class=BE_CLASS, sim_seconds=120, labels=claim)
        G.wait_until(lambda: bound(api, a, "own") == 1, 20, what="research's own gang bound")
        G.create_gang(api, a, "borrow", 1, 4, priority_class=BE_CLASS, sim_seconds=120, grace=1, labels=claim)
        G.wait_until(lambda: bound(api, a, "borrow") == 1, 20, what="research's borrower bound")
        assert (G.get_podgroup(api, a, "borrow")["metadata"].get("annotations") or {}).get(C.ANNOTATION_BORROWED) == "true"

        G.create_gang(api, b, "prod", 1, 4, priority_class=PROD_CLASS, sim_seconds=30)
        G.wait_until(lambda: bound(api, b, "prod") == 1, 30, what="nlp's production gang bound (reclaimed)")
        events = G.events_for(api, a, "borrow")
        assert any(e["reason"] == "Preempted" and "quota is reclaimed" in e["message"] for e in events), events
        assert bound(api, a, "own") == 1  # within research's guarantee: untouched
        (event,) = ignored_label_events(api, a, "borrow", C.LABEL_TIER)  # once, not every cycle
        assert f"'{C.TIER_INTERACTIVE}' contradicts PriorityClass '{BE_CLASS}'" in event["message"], event
        value = scheduler.metrics.registry.get_sample_value(
            "airflow_gpu_preemptions_total", {"team": "research", "tier": "best-effort-training", "reason": "reclaim"})
        assert value == 1.0
        assert G.overcommitted_nodes(api) == {}


def test_a_team_label_moves_neither_quota_nor_billing(kube_cluster, api, tmp_path):
    """Issue 32, second reproduction: a pod of team-vision labelled team=nlp was counted on nlp's
    quota and billed to nlp, and nlp's own production waited ("nlp uses N of N"). The namespace is the
    team: vision's quota is used, nlp's gang binds, the bill is vision's, and the pod gets a Warning
    Event (and, while it waits, its wait reason) naming the ignored label."""
    nlp, vision = "teamlabel-nlp", "teamlabel-vision"
    teams = [{"name": "nlp", "namespace": nlp, "quota": {"h100": 4}},
             {"name": "vision", "namespace": vision, "quota": {"h100": 4}}]
    core = client.CoreV1Api(api)
    claim = {C.LABEL_TEAM: "nlp"}
    with scheduling(kube_cluster, api, tmp_path, teams, "team-label") as (cfg, _):
        core.create_namespaced_pod(vision, G.pod_manifest("impostor", vision, 4, priority_class=PROD_CLASS,
                                                          sim_seconds=120, labels=claim), _preload_content=False)
        G.wait_until(lambda: any(p["spec"].get("nodeName") for p in G.list_pods(api, vision)), 20,
                     what="vision's pod bound")
        # a second one waits on vision's quota, not nlp's; nlp's own production gets nlp's quota
        core.create_namespaced_pod(vision, G.pod_manifest("impostor-2", vision, 4, priority_class=PROD_CLASS,
                                                          sim_seconds=120, labels=claim), _preload_content=False)
        core.create_namespaced_pod(nlp, G.pod_manifest("prod", nlp, 4, priority_class=PROD_CLASS, sim_seconds=120),
                                   _preload_content=False)
        G.wait_until(lambda: any(p["spec"].get("nodeName") for p in G.list_pods(api, nlp)), 20,
                     what="nlp's production pod bound (nlp's quota is its own)")

        def reason() -> str:
            pod = core.read_namespaced_pod("impostor-2", vision)
            return (pod.metadata.annotations or {}).get(C.ANNOTATION_WAIT_REASON, "")
        G.wait_until(lambda: "team quota" in reason(), 20, what="impostor-2's wait reason")
        assert reason().startswith("team quota: vision uses 4 of 4 h100"), reason()
        assert f"label {C.LABEL_TEAM}='nlp' contradicts namespace '{vision}'" in reason(), reason()
        assert not core.read_namespaced_pod("impostor-2", vision).spec.node_name
        assert G.overcommitted_nodes(api) == {}
        (event,) = ignored_label_events(api, vision, "impostor", C.LABEL_TEAM)
        assert f"label {C.LABEL_TEAM}='nlp' contradicts namespace '{vision}' (team 'vision')" in event["message"], event

        # chargeback reads the same pods: the impostor's GPU-hours are vision's
        pods = G.list_pods(api, vision) + G.list_pods(api, nlp)
        nodes = {n["metadata"]["name"]: n for n in json.loads(core.list_node(_preload_content=False).data)["items"]}
        billed = {r.ref: r.team for r in usage_records(cfg, pods, nodes, [], now=time.time())}
        assert billed == {f"{vision}/impostor": "vision", f"{nlp}/prod": "nlp"}, billed


def test_podgroup_past_its_schedule_timeout_is_reported_and_left_pending(kube_cluster, api, tmp_path):
    ns = "timeout"
    G.ensure_namespace(api, ns)
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": f"{PODGROUP_GROUP}/{PODGROUP_VERSION}", "kind": "PodGroup",
            "metadata": {"name": "huge", "namespace": ns}, "spec": {"minMember": 2, "scheduleTimeoutSeconds": 2}}
    custom.create_namespaced_custom_object(PODGROUP_GROUP, PODGROUP_VERSION, ns, PODGROUP_PLURAL, body)
    core = client.CoreV1Api(api)
    for i in range(2):  # 2 x 8 GPUs on one 8-GPU node: never fits
        core.create_namespaced_pod(ns, G.pod_manifest(f"huge-{i}", ns, 8, group="huge"))
    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(interval=0.5), identity="timeout")
    runner = run(scheduler)
    try:
        G.wait_until(lambda: (G.get_podgroup(api, ns, "huge").get("status") or {}).get("phase")
                     == C.PODGROUP_PHASE_TIMED_OUT, 20, what="PodGroup phase TimedOut")
        G.wait_until(lambda: [e for e in G.events_for(api, ns, "huge") if e["reason"] == C.REASON_SCHEDULE_TIMEOUT],
                     10, what="ScheduleTimeout event")
        pg = G.get_podgroup(api, ns, "huge")
        wait_reason = (pg["metadata"].get("annotations") or {}).get(C.ANNOTATION_WAIT_REASON, "")
        assert wait_reason, pg
        scheduler_runs = scheduler.cycles
        G.wait_until(lambda: scheduler.cycles >= scheduler_runs + 3, 10, what="more cycles")
        timeouts = [e for e in G.events_for(api, ns, "huge") if e["reason"] == C.REASON_SCHEDULE_TIMEOUT]
        assert len(timeouts) == 1, timeouts  # reported once, not every cycle
        message = timeouts[0]["message"]
        assert "scheduleTimeoutSeconds=2" in message and "last wait reason: " in message, message
        assert wait_reason.split(";")[0] in message  # the reason the user already saw
        pods = G.list_pods(api, ns)
        assert len(pods) == 2 and all(not p["spec"].get("nodeName") for p in pods)  # still there, pending
        assert (pg.get("status") or {}).get("phase") == C.PODGROUP_PHASE_TIMED_OUT
        # the gang backs off instead of being retried every cycle
        assert scheduler.queue.backoff.failures.get(f"{ns}/huge", 0) >= 1
    finally:
        scheduler.stop()
        runner.join(10)
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)

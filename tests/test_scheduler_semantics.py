"""The scheduler on the local cluster (issue 9): a held preemption plan counts against its team's
quota (a second 8-GPU gang of the team never binds beside it), and a launcher + 2 x 8-GPU workers
gang binds on two 8-GPU nodes."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from kubernetes import client
from test_scheduler_gangs import PRODUCT, _quota_config

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.devtools import gangs as G
from airflow_gpu.scheduler.loop import Scheduler, Settings

# A victim that takes its time to stop: the nomination stays held for a few seconds.
SLOW_STOP = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(4.0), sys.exit(0)))
while True:
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "sched-semantics", "pools": [{"name": "h100", "count": 2, "cliques": ["c1"],
                                                  "gpu": {"product": PRODUCT, "count": 8}}]}


@pytest.fixture(scope="module")
def api(kube_cluster):
    api = G.api_client(kube_cluster.kubeconfig)
    G.install_priority_classes(api)
    return api


def _run(scheduler: Scheduler) -> threading.Thread:
    t = threading.Thread(target=scheduler.run, daemon=True)
    t.start()
    return t


def _gpus_bound(pods: list[dict]) -> int:
    """GPUs of bound, live pods that are not being deleted (what the team holds for good)."""
    total = 0
    for p in pods:
        if not p["spec"].get("nodeName") or p["metadata"].get("deletionTimestamp"):
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in p["spec"]["containers"]:
            total += int(((c.get("resources") or {}).get("limits") or {}).get(C.RESOURCE_GPU, 0))
    return total


def test_a_held_plan_and_a_second_gang_never_exceed_the_teams_quota(kube_cluster, api, tmp_path):
    ns = "sem-quota"
    G.ensure_namespace(api, ns)
    cfg = load_config(_quota_config(tmp_path, [{"name": "a", "namespace": ns, "quota": {"h100": 8}}]))
    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), cfg, Settings(), identity="sem-quota")
    runner = _run(scheduler)
    try:
        G.create_gang(api, ns, "low", 1, 8, priority_class="airflow-gpu-best-effort-training", grace=10,
                      command=[sys.executable, "-c", SLOW_STOP])
        G.wait_until(lambda: _gpus_bound(G.list_pods(api, ns)) == 8, 20, what="low bound")
        G.create_gang(api, ns, "high1", 1, 8, priority_class="airflow-gpu-production-training", sim_seconds=60)
        G.wait_until(lambda: any(e["reason"] == "Preempting" for e in G.events_for(api, ns, "high1")), 20,
                     what="high1 nominated")
        # the plan for high1 is held while low stops; 8 GPUs are free on the other node
        G.create_gang(api, ns, "high2", 1, 8, priority_class="airflow-gpu-production-training", sim_seconds=60)
        deadline = time.time() + 12
        seen = 0
        while time.time() < deadline:
            pods = G.list_pods(api, ns)
            seen = max(seen, _gpus_bound(pods))
            assert seen <= 8, f"team a holds {seen} GPUs of its 8"
            state = G.gang_binding_state(pods)
            if state.get(f"{ns}/high1") == (1, 1) and time.time() > deadline - 6:
                break
            time.sleep(0.2)
        state = G.gang_binding_state(G.list_pods(api, ns))
        assert state.get(f"{ns}/high1") == (1, 1), state
        assert state.get(f"{ns}/high2") == (0, 1), state
        reason = (G.get_podgroup(api, ns, "high2")["metadata"].get("annotations") or {}).get(C.ANNOTATION_WAIT_REASON)
        assert reason and reason.startswith("team quota: a uses 8 of 8"), reason
    finally:
        scheduler.stop()
        runner.join(10)
        client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        G.wait_until(lambda: not G.list_pods(api, ns), 30, what="pods deleted")


def test_launcher_and_two_eight_gpu_workers_bind_on_two_nodes(kube_cluster, api, tmp_path):
    ns = "sem-launcher"
    G.ensure_namespace(api, ns)
    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(), identity="sem-launcher")
    runner = _run(scheduler)
    try:
        G.create_podgroup(api, ns, "mpi", 3)
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(ns, G.pod_manifest("mpi-launcher", ns, 0, group="mpi", cpu="500m", sim_seconds=60))
        for i in range(2):
            core.create_namespaced_pod(ns, G.pod_manifest(f"mpi-worker-{i}", ns, 8, group="mpi", sim_seconds=60))
        G.wait_until(lambda: G.gang_binding_state(G.list_pods(api, ns)).get(f"{ns}/mpi") == (3, 3), 20,
                     what="launcher and workers bound")
        nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in G.list_pods(api, ns)}
        assert nodes["mpi-worker-0"] != nodes["mpi-worker-1"], nodes
        assert G.overcommitted_nodes(api) == {}
    finally:
        scheduler.stop()
        runner.join(10)
        client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        G.wait_until(lambda: not G.list_pods(api, ns), 30, what="pods deleted")

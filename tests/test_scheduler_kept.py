"""Kept pods (on_finish_action="delete_succeeded_pod" / "keep_pod") go when their keep-until time has
passed, with no Airflow task running: the GPU scheduler sweeps them (kube/cleanup.py's rule) through the
Eviction API, which deletes an ended pod at once. Running pods, pods not ours, and kept pods whose time
has not come are left alone."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.devtools import gangs as G
from airflow_gpu.scheduler.loop import Scheduler, Settings

NS = "team-kept"


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "kept", "pools": [{"name": "cpu", "count": 1, "gpu": {"count": 0}, "cpu": "16", "memory": "64Gi"}]}


def _stamp(seconds: float) -> str:
    return (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_scheduler_deletes_kept_pods_when_their_time_has_passed(kube_cluster, kube_api):
    G.ensure_namespace(kube_api, NS)
    core = client.CoreV1Api(kube_api)
    ours = {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE}
    pods = {  # name: (labels, keep-until, seconds the container runs)
        "expires": (ours, _stamp(3), 0), "later": (ours, _stamp(3600), 0), "running": (ours, _stamp(-60), 600),
        "not-ours": ({}, _stamp(-60), 0), "unmarked": (ours, None, 0)}
    for name, (labels, until, seconds) in pods.items():
        body = G.pod_manifest(name, NS, gpus=0, labels=labels, sim_seconds=seconds,
                              annotations={C.ANNOTATION_KEEP_UNTIL: until} if until else {})
        body["spec"]["nodeName"] = "cpu-0"  # no scheduling needed: they run (and end) at once
        core.create_namespaced_pod(NS, body)

    def phases() -> dict[str, str]:
        return {p.metadata.name: p.status.phase for p in core.list_namespaced_pod(NS).items}
    G.wait_until(lambda: phases() == {"expires": "Succeeded", "later": "Succeeded", "running": "Running",
                                      "not-ours": "Succeeded", "unmarked": "Succeeded"}, 60, what=phases)

    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(kept_sweep_interval=0.5),
                          identity="kept-sweep")
    runner = threading.Thread(target=scheduler.run, daemon=True)
    runner.start()
    try:
        G.wait_until(lambda: "expires" not in phases(), 30, what=lambda: f"the expired kept pod deleted: {phases()}")
        assert set(phases()) == {"later", "running", "not-ours", "unmarked"}, phases()
    finally:
        scheduler.stop()
        runner.join(10)
        core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)


@pytest.mark.parametrize("flag,value", [("--kept-sweep-interval", "0"), ("--publish-interval", "-1"),
                                        ("--bind-workers", "0"), ("--switch-interval", "0")])
def test_a_bad_interval_flag_is_refused_before_any_connection(flag, value, tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "airflow_gpu", "scheduler", flag, value,
                           "--kubeconfig", str(tmp_path / "absent")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"scheduler: {flag} " in done.stderr and "must be" in done.stderr, done.stderr

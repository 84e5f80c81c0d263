"""The local cluster's scale mode (spec `mode: scale`, localcluster/kubelet/simkubelet.py): pods bind, run and
succeed without a process, working directory or log; nodes have no Leases; an over-committed node
rejects a pod as a kubelet does; a deleted pod is gone at once. In process: no HTTP, under a second."""

from __future__ import annotations

import asyncio

from airflow_gpu import constants as C
from airflow_gpu.localcluster.cluster import LocalCluster
from airflow_gpu.localcluster.spec import parse_spec

SPEC = {"name": "scale-test", "mode": "scale", "pools": [
    {"name": "h100", "count": 3, "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
     "racks": ["r0", "r1"], "cliques": ["c0", "c1", "c2"]}]}


def _pod(name: str, gpus: int, seconds: float | None = None, exit_code: int | None = None) -> dict:
    annotations = {}
    if seconds is not None:
        annotations[C.ANNOTATION_SIM_DURATION] = str(seconds)
    if exit_code is not None:
        annotations[C.ANNOTATION_SIM_EXIT_CODE] = str(exit_code)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"schedulerName": C.DEFAULT_SCHEDULER_NAME, "restartPolicy": "Never", "containers": [
                {"name": "main", "image": "python:3.11",
                 "resources": {"limits": {C.RESOURCE_GPU: str(gpus)}}}]}}


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_scale_mode_pods_bind_run_and_succeed_without_processes(tmp_path):
    async def scenario():
        cluster = LocalCluster(parse_spec(SPEC), tmp_path / "state", fresh=True)
        await cluster.start()
        try:
            objects, store = cluster.objects, cluster.store
            pods = objects.registry.by_key("/pods")
            phase = lambda name: (store.get("/pods", "default", name).get("status") or {}).get("phase")  # noqa: E731
            assert len(store.values("/nodes")) == 3
            assert store.get("/nodes", "", "h100-0")["metadata"]["labels"][C.NODE_RACK] == "r0"
            objects.create(pods, _pod("short", 4, seconds=0.2), "default")
            objects.create(pods, _pod("fails", 2, seconds=0.1, exit_code=3), "default")
            objects.create(pods, _pod("long", 2), "default")  # runs until deleted
            for name in ("short", "fails", "long"):
                objects.bind("default", name, "h100-0")
            await _until(lambda: phase("long") == "Running")
            running = store.get("/pods", "default", "long")
            assert running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
            assert running["status"]["podIP"].startswith("127.")
            # 4 + 2 + 2 of 8 GPUs are taken: one more GPU on that node is rejected as a kubelet does
            objects.create(pods, _pod("over", 1), "default")
            objects.bind("default", "over", "h100-0")
            await _until(lambda: phase("over") == "Failed")
            assert store.get("/pods", "default", "over")["status"]["reason"] == f"OutOf{C.RESOURCE_GPU}"
            await _until(lambda: phase("short") == "Succeeded" and phase("fails") == "Failed")
            done = store.get("/pods", "default", "short")["status"]["containerStatuses"][0]["state"]["terminated"]
            assert done["exitCode"] == 0 and done["reason"] == "Completed"
            assert store.get("/pods", "default", "fails")["status"]["containerStatuses"][0]["state"][
                "terminated"]["exitCode"] == 3
            # their GPUs are free again: a 4-GPU pod now fits beside "long"
            objects.create(pods, _pod("again", 4), "default")
            objects.bind("default", "again", "h100-0")
            await _until(lambda: phase("again") == "Running")
            # a graceful deletion ends at once: nothing runs that would need the grace period
            objects.delete(pods, "default", "long", grace=30)
            await _until(lambda: store.get("/pods", "default", "long") is None)
            assert phase("again") == "Running"
            assert not cluster.kubelet.runs, "no pod ran as a process"
            assert not (tmp_path / "state" / "pods").exists(), "no pod working directory"
            assert not store.values("coordination.k8s.io/leases", C.NODE_LEASE_NAMESPACE), "no node heartbeats"
        finally:
            await cluster.stop()

    asyncio.run(scenario())

"""The GPU queue built from the api-server's watch of the cluster (ui.watch) equals the queue built from
a fresh list of it: for a scripted state, and again after the state changed (the watch shows a change
within a bound), with the conversions of the earlier builds reused (the Memo)."""

from __future__ import annotations

import time

from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.devtools import gangs as G
from airflow_gpu.scheduler.convert import ConversionContext
from airflow_gpu.scheduler.state import Memo
from airflow_gpu.ui import queue, service, sources
from airflow_gpu.ui.watch import ClusterWatch

from test_ui_plugin import CONFIG, ti_labels

REFLECTED_WITHIN = 10.0  # seconds from a write to the watch-built queue showing it (generous: a loaded machine)
NOW = time.time()
POOLS = [queue.PoolRow("gpu.nlp.guaranteed", 56, 56, 0, 7, "nlp"), queue.PoolRow("gpu.vision.preemptible", 28, 0, 0, 0)]
TASKS = [queue.TaskRow("held_dag", "fit", "manual__1", 1, "gpu.nlp.guaranteed", "scheduled", NOW - 30, 5, 7)]


def script(api) -> None:
    """A running 2 x 4 gang (od and spot), a pending 3 x 4 gang with the scheduler's reason, a lone
    pending pod."""
    core = client.CoreV1Api(api)
    for ns in ("w-nlp", "w-vision"):
        G.ensure_namespace(api, ns)
    G.create_podgroup(api, "w-nlp", "run", 2)
    for i, node in enumerate(("gpu-od-0", "gpu-spot-0")):
        body = G.pod_manifest(f"run-{i}", "w-nlp", 4, group="run", sim_seconds=3600,
                              labels=ti_labels("finetune", "train", "nlp"),
                              annotations={C.ANNOTATION_INTERRUPTIONS: "1"})
        body["spec"]["nodeName"] = node
        body["spec"]["tolerations"] = [{"key": C.TAINT_SPOT, "operator": "Exists"}]
        core.create_namespaced_pod("w-nlp", body, _preload_content=False)
    G.create_gang(api, "w-nlp", "big", 3, 4, pg_annotations={C.ANNOTATION_WAIT_REASON: "largest free block is 8"},
                  labels=ti_labels("pretrain", "train", "nlp"))
    core.create_namespaced_pod("w-vision", G.pod_manifest("lone", "w-vision", 2, labels=ti_labels(
        "detector", "fit", "vision", C.TIER_BEST_EFFORT_TRAINING)), _preload_content=False)


def change(api) -> None:
    """The running gang ends, the pending gang gets another reason, a new lone pod arrives."""
    core = client.CoreV1Api(api)
    for i in range(2):
        core.delete_namespaced_pod(f"run-{i}", "w-nlp", grace_period_seconds=0)
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        C.PODGROUP_GROUP, C.PODGROUP_VERSION, "w-nlp", C.PODGROUP_PLURAL, "big",
        {"metadata": {"annotations": {C.ANNOTATION_WAIT_REASON: "team quota: nlp uses 8 of 8"}}})
    core.create_namespaced_pod("w-vision", G.pod_manifest("second", "w-vision", 1,
                                                          labels=ti_labels("detector", "eval", "vision")),
                               _preload_content=False)


def build(view, ctx, memo=None) -> bytes:
    return service.to_json(queue.build(queue.Inputs(POOLS, TASKS, view, ctx), now=NOW, memo=memo))


def test_watched_queue_equals_a_fresh_list_and_follows_changes(kube_cluster):
    kc = str(kube_cluster.kubeconfig)
    api = G.api_client(kc)
    script(api)
    ctx = ConversionContext.from_config(load_config(CONFIG))
    watch = ClusterWatch(kc, resync_seconds=2.0)
    memo = Memo()
    try:
        def equal() -> bool:
            listed = build(sources.read_view(kc), ctx)
            view = watch.view()
            memo.prune(view)
            return build(view, ctx, memo) == listed

        G.wait_until(equal, REFLECTED_WITHIN, 0.2, what="the watched queue equal to the listed one")
        before = queue.build(queue.Inputs(POOLS, TASKS, watch.view(), ctx), now=NOW, memo=memo)
        assert {w["dag_id"] for w in before["waiting"]} == {"pretrain", "detector", "held_dag"}
        assert [r["dag_id"] for r in before["running"]] == ["finetune"]

        t0 = time.monotonic()
        change(api)
        G.wait_until(lambda: "w-vision/second" in watch.view().pods and "w-nlp/run-0" not in watch.view().pods,
                     REFLECTED_WITHIN, 0.05, what="the watch showing the writes")
        print(f"the watch showed the writes {time.monotonic() - t0:.2f} s after them")
        G.wait_until(equal, REFLECTED_WITHIN, 0.2, what="the watched queue equal to the listed one after a change")
        after = queue.build(queue.Inputs(POOLS, TASKS, watch.view(), ctx), now=NOW, memo=memo)
        assert after["running"] == []
        reasons = {w["dag_id"]: w["reason"] for w in after["waiting"]}
        assert reasons["pretrain"] == "team quota: nlp uses 8 of 8"
        assert sum(w["dag_id"] == "detector" for w in after["waiting"]) == 2
        # resync: the watch relists on its own, however quiet the cluster is
        relisted = watch.cache.relists["pods"]
        G.wait_until(lambda: watch.cache.relists["pods"] > relisted, REFLECTED_WITHIN, 0.1, what="a resync relist")
    finally:
        watch.cache.stop()

"""The informer cache against the local cluster: list + watch, 410 Gone -> relist, API server restart."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client

from airflow_gpu.devtools import gangs as G
from airflow_gpu.scheduler.cache import ClusterCache, Gone


@pytest.fixture(scope="module")
def kube_spec():
    # a short watch history, so an old resourceVersion is gone (410) after a few writes
    return {"name": "sched-cache", "watchHistory": 10, "pools": [{"name": "n", "count": 1, "gpu": {"count": 8}}]}


def test_watch_relist_on_410_and_survive_an_api_server_restart(kube_cluster):
    api = G.api_client(kube_cluster.kubeconfig)
    G.ensure_namespace(api, "c")
    core = client.CoreV1Api(api)
    cache = ClusterCache(G.api_client(kube_cluster.kubeconfig)).start()
    try:
        assert cache.wait_synced(20)
        assert set(cache.view().nodes) == {"n-0"}
        for i in range(30):
            core.create_namespaced_pod("c", G.pod_manifest(f"p{i}", "c", 0), _preload_content=False)
        G.wait_until(lambda: len([k for k in cache.view().pods if k.startswith("c/")]) == 30, 10, 0.05,
                     what="watch events in the cache")
        # a watch from a version older than the server's history is answered 410 Gone ...
        with pytest.raises(Gone):
            cache._watch("pods", "1")
        # an API server restart cuts every watch; the informer reconnects and catches up
        kube_cluster.restart_apiserver()
        core.delete_namespaced_pod("p0", "c", grace_period_seconds=0)
        G.wait_until(lambda: "c/p0" not in cache.view().pods, 30, 0.1, what="cache caught up after the restart")
    finally:
        cache.stop()


def test_informer_relists_when_its_version_is_gone(kube_cluster, tmp_path):
    """A network cut long enough for the server's watch history to move on: the reconnecting watch
    gets 410 Gone, and the informer relists (deletions during the cut included)."""
    from airflow_gpu.devtools.tcpproxy import Proxy

    api = G.api_client(kube_cluster.kubeconfig)
    core = client.CoreV1Api(api)
    G.ensure_namespace(api, "gone")
    core.create_namespaced_pod("gone", G.pod_manifest("victim", "gone", 0), _preload_content=False)
    upstream = urlsplit(yaml.safe_load(kube_cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
    proxy = Proxy(upstream.port).start()
    cfg = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    cfg["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{proxy.port}"
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(cfg))
    cache = ClusterCache(G.api_client(tmp_path / "kubeconfig")).start()
    try:
        assert cache.wait_synced(20)
        G.wait_until(lambda: "gone/victim" in cache.view().pods, 10, 0.05, what="pod in the cache")
        before = cache.relists["pods"]
        proxy.cut()
        core.delete_namespaced_pod("victim", "gone", grace_period_seconds=0)
        for i in range(30):  # more writes than the server's watch history (10) keeps
            core.create_namespaced_pod("gone", G.pod_manifest(f"q{i}", "gone", 0), _preload_content=False)
        proxy.start()
        G.wait_until(lambda: {f"gone/q{i}" for i in range(30)} <= set(cache.view().pods)
                     and "gone/victim" not in cache.view().pods, 30, 0.1, what="cache relisted")
        assert cache.relists["pods"] > before
    finally:
        cache.stop()
        proxy.cut()


def test_each_view_tells_the_pods_changed_since_the_view_before(kube_cluster):
    """A View carries the keys of the pods and PodGroups stored, replaced or removed since the view
    before (state.Grouping looks at those alone), chained view to view; none after a relist, when
    anything may have changed."""
    api = G.api_client(kube_cluster.kubeconfig)
    G.ensure_namespace(api, "ch")
    core = client.CoreV1Api(api)
    cache = ClusterCache(G.api_client(kube_cluster.kubeconfig)).start()
    told: set[str] = set()
    chain: list = []

    def read():
        view = cache.view()
        chain.append(view.changes)
        if view.changes is not None:
            told.update(view.changes.pods)
        return view

    try:
        assert cache.wait_synced(20)
        assert read().changes is None  # the first view: everything was listed
        core.create_namespaced_pod("ch", G.pod_manifest("x", "ch", 0), _preload_content=False)
        G.wait_until(lambda: "ch/x" in read().pods, 10, 0.05, what="x in the cache")
        assert "ch/x" in told
        told.clear()
        core.patch_namespaced_pod("x", "ch", {"metadata": {"labels": {"a": "b"}}})
        G.wait_until(lambda: read() and "ch/x" in told, 10, 0.05, what="x replaced")
        told.clear()
        core.delete_namespaced_pod("x", "ch", grace_period_seconds=0)
        G.wait_until(lambda: "ch/x" not in read().pods, 10, 0.05, what="x gone")
        assert "ch/x" in told and "ch/other" not in told
        kept = [c for c in chain if c is not None]
        assert all(a.upto == b.since for a, b in zip(chain[1:], chain[2:]))  # each view follows the one before
        assert len(kept) == len(chain) - 1
        cache._relist("pods")  # what a 410 Gone leads to
        assert read().changes is None and read().changes is not None
    finally:
        cache.stop()

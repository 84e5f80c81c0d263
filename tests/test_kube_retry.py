"""kube.retry: the operator's Kubernetes calls wait out an API server restart and transient 5xx/429
instead of failing the task (which would spend an Airflow retry). Against the local cluster."""

from __future__ import annotations

import threading
import time

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from airflow_gpu.devtools import gangs as G
from airflow_gpu.kube.retry import RETRY_WINDOW_SECONDS, TRANSIENT_STATUS, transient_retry, with_retries
from airflow_gpu.operators.cluster import GangClient


class _Log:
    def __getattr__(self, _name):
        return lambda *a, **k: None


def _restart_soon(kube_cluster, down: float) -> threading.Thread:
    from airflow_gpu.localcluster import control

    thread = threading.Thread(target=control.restart_apiserver, args=(down,),
                              kwargs={"kubeconfig": kube_cluster.kubeconfig}, daemon=True)
    thread.start()
    time.sleep(0.3)  # the server is going down
    return thread


def test_calls_wait_out_an_api_server_restart(kube_cluster):
    G.ensure_namespace(G.api_client(kube_cluster.kubeconfig), "retry")
    gang = GangClient(with_retries(G.api_client(kube_cluster.kubeconfig)), _Log())
    restart = _restart_soon(kube_cluster, down=3.0)
    started = time.monotonic()
    assert gang.live_uids("retry", "app=none") == {}  # listed once the server is back
    assert gang.delete_all("retry", "app=none") == 0
    assert 1.0 < time.monotonic() - started < RETRY_WINDOW_SECONDS
    restart.join(30)


def test_without_the_policy_the_same_restart_fails_the_call(kube_cluster):
    gang = GangClient(G.api_client(kube_cluster.kubeconfig), _Log())
    restart = _restart_soon(kube_cluster, down=3.0)
    with pytest.raises((urllib3.exceptions.HTTPError, OSError, ApiException)):
        gang.live_uids("retry", "app=none")
    restart.join(30)
    kube_cluster.wait_ready(20)


def test_the_policy_covers_connection_errors_5xx_and_429_for_every_method():
    retry = transient_retry()
    assert retry.status_forcelist == TRANSIENT_STATUS and retry.allowed_methods is None
    assert retry.respect_retry_after_header and not retry.raise_on_status
    assert 60 <= RETRY_WINDOW_SECONDS <= 120  # restarts of 0.9-4.9 s fit; a dead server still fails in minutes

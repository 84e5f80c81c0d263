"""The cluster as the api-server's GPU queue reads it: one background list + watch of pods, nodes,
PodGroups and the scheduler's plan records per kubeconfig (the scheduler's informer cache,
scheduler.cache.ClusterCache), kept for the life of the process. A request reads the cache (a
shallow copy of its stores) instead of listing 1,000s of objects, and the conversions of unchanged
objects are kept between builds (service.SharedQueue's scheduler.state.Memo), so a build only
converts what changed.

The watch relists on 410 Gone, retries errors with back-off, and relists every RESYNC_SECONDS in
any case; a request made while the first list is not done waits for it up to SYNC_TIMEOUT."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from airflow_gpu import constants as C
from airflow_gpu.scheduler.cache import View

log = logging.getLogger(__name__)

REQUIRED_KINDS = ("pods", "nodes", "podgroups")
RESYNC_SECONDS = 300.0
SYNC_TIMEOUT = 60.0


class NotSynced(RuntimeError):
    """The first list of the cluster did not finish in time (API server unreachable or slow)."""


@dataclass
class ClusterWatch:
    kubeconfig: str
    resync_seconds: float = RESYNC_SECONDS

    def __post_init__(self) -> None:
        from airflow_gpu.devtools.gangs import api_client
        from airflow_gpu.scheduler.cache import ClusterCache

        self._api = api_client(self.kubeconfig, pool=8)
        kinds = REQUIRED_KINDS + (("plans",) if self._may_read_plans() else ())
        self.cache = ClusterCache(self._api, plan_selector=C.LABEL_PLAN_OF, kinds=kinds,
                                  resync_seconds=self.resync_seconds).start()

    def _may_read_plans(self) -> bool:
        """The plan records show the GPUs held by plans; without access the queue is shown without them
        (as the list-based read does), and the watch does not retry a 403 forever."""
        from kubernetes import client

        try:
            client.CoreV1Api(self._api).list_config_map_for_all_namespaces(
                label_selector=C.LABEL_PLAN_OF, limit=1, _preload_content=False, _request_timeout=30).release_conn()
            return True
        except client.ApiException as exc:
            if exc.status in (401, 403):
                log.warning("GPU queue: no access to the scheduler's plan records (%s); shown without held plans",
                            exc.status)
                return False
            raise NotSynced(f"the cluster of [airflow_gpu] kubeconfig {self.kubeconfig} answered "
                            f"{exc.status} {exc.reason}") from exc
        except Exception as exc:  # noqa: BLE001 - connection errors of every kind: say which cluster
            raise NotSynced(f"the cluster of [airflow_gpu] kubeconfig {self.kubeconfig} is not reachable: "
                            f"{type(exc).__name__}: {exc}") from exc

    def view(self, timeout: float = SYNC_TIMEOUT) -> View:
        if not self.cache.wait_synced(timeout, kinds=REQUIRED_KINDS):
            raise NotSynced(f"the cluster of [airflow_gpu] kubeconfig {self.kubeconfig} was not listed within "
                            f"{timeout:.0f} s; is its API server reachable?")
        view = self.cache.view()
        view.assumed = {}  # the scheduler's own overlay; a reader shows what the API server says
        return view


_WATCHES: dict[str, ClusterWatch] = {}
_LOCK = threading.Lock()


def cluster_watch(kubeconfig: str | Path) -> ClusterWatch:
    """The process's watch of the cluster of `kubeconfig`, started on first use."""
    key = str(kubeconfig)
    with _LOCK:
        watch = _WATCHES.get(key)
        if watch is None:
            watch = _WATCHES[key] = ClusterWatch(key)
        return watch

"""Kubelet heartbeats: each responsive node renews its Lease in kube-node-lease every renew interval
(as the kubelet's node lease controller) and reports its conditions' lastHeartbeatTime at the status
report interval. A node under the NotReady fault (kubelet.unresponsive) stops both, as on a real node."""

from __future__ import annotations

import asyncio
import datetime as dt

from airflow_gpu import constants as C
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.registry.objects import ObjectAPI, deep_copy
from airflow_gpu.localcluster.podutil import now_iso

NODE_KEY, LEASE_KEY = "/nodes", "coordination.k8s.io/leases"
LEASE_DURATION_SECONDS = 40  # the kubelet's default nodeLeaseDurationSeconds


def micro_time() -> str:
    """metav1.MicroTime as the API serialises it (RFC 3339 with microseconds)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeHeartbeats:
    def __init__(self, objects: ObjectAPI, unresponsive: set[str], renew_seconds: float = 10.0,
                 status_seconds: float = 60.0):
        self.objects, self.store = objects, objects.store
        self.unresponsive = unresponsive
        self.renew_seconds, self.status_seconds = renew_seconds, status_seconds
        self._task: asyncio.Task | None = None
        self._last_status: dict[str, float] = {}
        self.store.listeners.append(self._on_event)

    def start(self) -> None:
        self.beat()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _on_event(self, etype: str, key: str, obj: dict, old: dict | None) -> None:
        if key == NODE_KEY and etype == "ADDED":  # a joining kubelet creates its lease at once
            asyncio.get_running_loop().call_soon(self._renew, obj["metadata"]["name"])
            self._last_status[obj["metadata"]["name"]] = asyncio.get_running_loop().time()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.renew_seconds)
            self.beat()

    def beat(self) -> None:
        now = asyncio.get_running_loop().time()
        for node in self.store.values(NODE_KEY):
            name = node["metadata"]["name"]
            if name in self.unresponsive:
                continue
            self._renew(name)
            if now - self._last_status.setdefault(name, now) >= self.status_seconds:
                self._last_status[name] = now
                self._report_status(node)

    def _renew(self, name: str) -> None:
        node = self.store.get(NODE_KEY, "", name)
        if node is None or name in self.unresponsive:
            return
        lease = self.store.get(LEASE_KEY, C.NODE_LEASE_NAMESPACE, name)
        rt = self.objects.registry.by_key(LEASE_KEY)
        try:
            if lease is None:
                self.objects.create(rt, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": C.NODE_LEASE_NAMESPACE, "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]},
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                             "renewTime": micro_time()}}, C.NODE_LEASE_NAMESPACE, admit=False)
            else:
                new = deep_copy(lease)
                new["spec"]["renewTime"] = micro_time()
                new["spec"]["holderIdentity"] = name
                self.objects.update_status(LEASE_KEY, new)
        except errors.ApiError:
            pass  # kube-node-lease is being deleted: the next beat tries again

    def _report_status(self, node: dict) -> None:
        new = deep_copy(node)
        stamp = now_iso()
        for cond in (new.get("status") or {}).get("conditions") or []:
            cond["lastHeartbeatTime"] = stamp
        self.objects.update_status(NODE_KEY, new)

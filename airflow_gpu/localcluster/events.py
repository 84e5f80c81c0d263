"""core/v1 Events written by the in-process components (kubelet, scheduler, node controllers)."""

from __future__ import annotations

import itertools
import time

from airflow_gpu.localcluster.podutil import now_iso

EVENT_KEY = "/events"


class Recorder:
    def __init__(self, objects):
        self.objects = objects
        self._seq = itertools.count()

    def record(self, obj: dict, etype: str, reason: str, message: str, component: str, host: str | None = None,
               field_path: str | None = None) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        now = now_iso()
        involved = {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"), "name": meta["name"],
                    "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}
        if meta.get("namespace"):
            involved["namespace"] = meta["namespace"]
        if field_path:
            involved["fieldPath"] = field_path
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}{next(self._seq):x}", "namespace": namespace},
            "involvedObject": involved, "reason": reason, "message": message, "type": etype,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": component, "reportingInstance": host or "",
        }
        rt = self.objects.registry.by_key(EVENT_KEY)
        try:
            self.objects.create(rt, event, namespace, admit=False)
        except Exception:  # the namespace may be going away; an event is never worth failing for
            pass

    def pod(self, pod: dict, etype: str, reason: str, message: str, field_path: str | None = None,
            component: str = "kubelet") -> None:
        self.record(pod, etype, reason, message, component, pod.get("spec", {}).get("nodeName"), field_path)

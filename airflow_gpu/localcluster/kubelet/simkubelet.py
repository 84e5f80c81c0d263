"""Scale mode's kubelet (cluster spec `mode: scale`): pods without processes, as KWOK simulates them.

What is simulated, and how little: a bound pod goes Running in ONE status write (startTime, pod IP,
Ready conditions, a running container status) in the event-loop turn after its Binding, and
Succeeded (or Failed with ANNOTATION_SIM_EXIT_CODE) after its ANNOTATION_SIM_DURATION seconds
(the spec's simDefaultSeconds when absent; null: until deleted) in one more. A pod being deleted is
removed at once, whatever its grace period (KWOK does the same). There is no working directory, no
log, no exec, no device IDs and no Events from the node; the kubelet's admission check is kept, on
GPUs only (an over-binding scheduler still shows as a pod Failed OutOfnvidia.com/gpu). Nodes send no
heartbeats and have no Leases in kube-node-lease: they stay as registered (Ready).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from airflow_gpu import constants as C
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.kubelet.nodeagent import PodIPs
from airflow_gpu.localcluster.registry.objects import ObjectAPI, deep_copy
from airflow_gpu.localcluster.podutil import is_terminal, now_iso, pod_requests, set_condition

POD_KEY, NODE_KEY = "/pods", "/nodes"


class SimulatedKubelet:
    def __init__(self, objects: ObjectAPI, sim_default_seconds: float | None = None):
        self.objects, self.store = objects, objects.store
        self.sim_default_seconds = sim_default_seconds
        self.pod_ips = PodIPs()
        self.gpus_used: dict[str, int] = defaultdict(int)  # node -> GPUs of its started, unfinished pods
        self.started: dict[str, tuple[str, int]] = {}  # pod uid -> (node, GPUs) while it holds them
        self.timers: dict[str, asyncio.TimerHandle] = {}  # pod uid -> its end
        self._pending: set[tuple[str, str]] = set()
        self._flush_handle: asyncio.Handle | None = None
        self.store.listeners.append(self._on_event)

    def _on_event(self, etype: str, key: str, obj: dict, old: dict | None) -> None:
        if key != POD_KEY:
            return
        if etype == "DELETED":
            self._release(obj["metadata"]["uid"])
            return
        if not (obj.get("spec") or {}).get("nodeName"):
            return
        uid = obj["metadata"]["uid"]
        if uid in self.started and not obj["metadata"].get("deletionTimestamp") and not is_terminal(obj):
            return  # our own Running write, or a label/annotation change: nothing to do
        self._pending.add((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        if self._flush_handle is None:  # one callback per loop turn for every pod bound in it
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def resync(self) -> None:
        for pod in self.store.values(POD_KEY):
            if (pod.get("spec") or {}).get("nodeName"):
                self._pending.add((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        self._flush()

    def _flush(self) -> None:
        self._flush_handle = None
        pending, self._pending = self._pending, set()
        for ident in pending:
            pod = self.store.get(POD_KEY, *ident)
            if pod is not None:
                self._sync(pod)

    def _sync(self, pod: dict) -> None:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            self._release(meta["uid"])
            if not meta.get("finalizers"):
                try:
                    self.store.delete(POD_KEY, meta["namespace"], meta["name"], "pods")
                except errors.ApiError:
                    pass
            return
        if is_terminal(pod):
            self._release(meta["uid"])
            return
        if meta["uid"] not in self.started and (pod.get("status") or {}).get("phase") != "Running":
            self._start(pod)

    def _start(self, pod: dict) -> None:
        node_name = pod["spec"]["nodeName"]
        node = self.store.get(NODE_KEY, "", node_name)
        if node is None:
            return
        gpus = int(pod_requests(pod).get(C.RESOURCE_GPU, 0))
        allocatable = int(((node.get("status") or {}).get("allocatable") or {}).get(C.RESOURCE_GPU, 0) or 0)
        new = deep_copy(pod)
        status = new.setdefault("status", {})
        stamp = now_iso()
        if self.gpus_used[node_name] + gpus > allocatable:
            status.update(phase="Failed", reason=f"OutOf{C.RESOURCE_GPU}",
                          message=f"Pod was rejected: Node didn't have enough resource: {C.RESOURCE_GPU}, requested: "
                                  f"{gpus}, used: {self.gpus_used[node_name]}, capacity: {allocatable}")
            self.objects.update_status(POD_KEY, new)
            return
        self.gpus_used[node_name] += gpus
        uid = pod["metadata"]["uid"]
        self.started[uid] = (node_name, gpus)
        ip = self.pod_ips.next(node)
        status.update(phase="Running", hostIP="127.0.0.1", hostIPs=[{"ip": "127.0.0.1"}], podIP=ip, podIPs=[{"ip": ip}],
                      startTime=status.get("startTime") or stamp)
        for ctype in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
            set_condition(status, ctype, "True")
        status["containerStatuses"] = [self._container(c, {"running": {"startedAt": stamp}}, True)
                                       for c in pod["spec"].get("containers") or []]
        self.objects.update_status(POD_KEY, new)
        annotations = pod["metadata"].get("annotations") or {}
        seconds = annotations.get(C.ANNOTATION_SIM_DURATION)
        seconds = float(seconds) if seconds not in (None, "") else self.sim_default_seconds
        if seconds is not None:
            code = int(annotations.get(C.ANNOTATION_SIM_EXIT_CODE, "0") or 0)
            self.timers[uid] = asyncio.get_running_loop().call_later(
                seconds, self._end, pod["metadata"]["namespace"], pod["metadata"]["name"], uid, code, stamp)

    def _end(self, namespace: str, name: str, uid: str, code: int, started: str) -> None:
        self.timers.pop(uid, None)
        pod = self.store.get(POD_KEY, namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid or is_terminal(pod):
            return
        new = deep_copy(pod)
        status = new.setdefault("status", {})
        succeeded = code == 0
        status["phase"] = "Succeeded" if succeeded else "Failed"
        for ctype in ("Ready", "ContainersReady"):
            set_condition(status, ctype, "False", "PodCompleted" if succeeded else "PodFailed")
        finished = {"exitCode": code, "reason": "Completed" if succeeded else "Error", "startedAt": started,
                    "finishedAt": now_iso()}
        status["containerStatuses"] = [self._container(c, {"terminated": finished}, False)
                                       for c in pod["spec"].get("containers") or []]
        self._release(uid)
        self.objects.update_status(POD_KEY, new)

    @staticmethod
    def _container(spec: dict, state: dict, running: bool) -> dict:
        image = spec.get("image", "")
        return {"name": spec["name"], "image": image, "imageID": f"local://{image}", "containerID": f"sim://{spec['name']}",
                "restartCount": 0, "ready": running, "started": running, "state": state}

    def _release(self, uid: str) -> None:
        timer = self.timers.pop(uid, None)
        if timer is not None:
            timer.cancel()
        held = self.started.pop(uid, None)
        if held is not None:
            self.gpus_used[held[0]] -= held[1]

"""What a kubelet knows about its node: the status it reports, the GPU devices the NVIDIA device
plugin hands out, pod IPs from the node's podCIDR, and the kubelet's own admission check."""

from __future__ import annotations

import os

from airflow_gpu import constants as C
from airflow_gpu.localcluster.podutil import now_iso, pod_requests, quantity


def node_status(node: dict, ready: bool = True) -> dict:
    """Status a healthy kubelet reports for its node (conditions, addresses, nodeInfo)."""
    status = dict(node.get("status") or {})
    now = now_iso()
    conditions = []
    for ctype, reason, message in (
        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ):
        conditions.append({"type": ctype, "status": "False", "reason": reason, "message": message,
                           "lastHeartbeatTime": now, "lastTransitionTime": now})
    conditions.append({"type": "Ready", "status": "True" if ready else "Unknown",
                       "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                       "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status.",
                       "lastHeartbeatTime": now, "lastTransitionTime": now})
    status["conditions"] = conditions
    status["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"},
                           {"type": "Hostname", "address": node["metadata"]["name"]}]
    status["nodeInfo"] = {"kubeletVersion": "v1.32.0", "kubeProxyVersion": "v1.32.0", "osImage": "airflow-gpu local",
                          "kernelVersion": os.uname().release, "operatingSystem": "linux", "architecture": "amd64",
                          "containerRuntimeVersion": "local-process://1", "machineID": "", "systemUUID": "",
                          "bootID": ""}
    status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": 10250}}
    status["phase"] = "Running"
    return status


def _is_device(resource: str) -> bool:
    return resource == C.RESOURCE_GPU or resource.startswith(C.RESOURCE_MIG_PREFIX)


class Devices:
    """Per node, the free device IDs (GPU-<node>-<i>, MIG-<node>-<profile>-<i>) of the device plugin."""

    def __init__(self) -> None:
        self.free: dict[str, list[str]] = {}

    def register(self, node: dict) -> None:
        name = node["metadata"]["name"]
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        devices = [f"GPU-{name}-{i}" for i in range(int(allocatable.get(C.RESOURCE_GPU, 0) or 0))]
        for resource, count in allocatable.items():
            if resource.startswith(C.RESOURCE_MIG_PREFIX):
                profile = resource[len(C.RESOURCE_MIG_PREFIX):]
                devices += [f"MIG-{name}-{profile}-{i}" for i in range(int(count))]
        self.free[name] = devices

    def allocate(self, node: str, requests: dict) -> list[str]:
        free = self.free.get(node, [])
        taken: list[str] = []
        for resource, amount in requests.items():
            if not _is_device(resource) or amount <= 0:
                continue
            prefix = f"GPU-{node}-" if resource == C.RESOURCE_GPU else \
                f"MIG-{node}-{resource[len(C.RESOURCE_MIG_PREFIX):]}-"
            take = [d for d in free if d.startswith(prefix)][:int(amount)]
            for device in take:
                free.remove(device)
            taken += take
        return taken

    def release(self, node: str, devices: list[str]) -> None:
        if devices and node in self.free:
            self.free[node].extend(devices)

    def forget(self, node: str) -> None:
        self.free.pop(node, None)


class PodIPs:
    """Pod IPs from the node's podCIDR (in 127.0.0.0/8, so local processes reach each other)."""

    def __init__(self) -> None:
        self._counter: dict[str, int] = {}

    def next(self, node: dict) -> str:
        cidr = (node.get("spec") or {}).get("podCIDR", "127.100.0.0/24")
        base = cidr.split("/")[0].rsplit(".", 1)[0]
        n = self._counter.get(base, 1) % 253 + 1
        self._counter[base] = n
        return f"{base}.{n}"


def admit(pod: dict, node: dict, pods_on_node: list[dict]) -> tuple[str, str] | None:
    """The kubelet's own admission: a pod over the node's allocatable is rejected (OutOf<resource>),
    which is how an over-binding scheduler shows up on a real node."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used: dict = {}
    for other in pods_on_node:
        for k, v in pod_requests(other).items():
            used[k] = used.get(k, 0) + v
    for name, value in pod_requests(pod).items():
        cap = quantity(allocatable[name]) if name in allocatable else None
        if cap is None and not (_is_device(name) and value > 0):
            continue
        cap = cap or 0
        if used.get(name, 0) + value > cap:
            return (f"OutOf{name}", f"Pod was rejected: Node didn't have enough resource: {name}, requested: "
                                    f"{value}, used: {used.get(name, 0)}, capacity: {cap}")
    return None

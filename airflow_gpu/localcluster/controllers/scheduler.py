"""A small default scheduler for pods with schedulerName default-scheduler, so ordinary pods run.

Resource fit (cpu, memory, pods, extended resources such as nvidia.com/gpu and MIG slices),
nodeSelector, required node affinity, taints/tolerations, unschedulable nodes; first the node with
the most free CPU (spreading, as kube-scheduler's default scoring roughly does). Pods naming any
other scheduler (the project's GPU scheduler) are left alone until someone binds them.
"""

from __future__ import annotations

import asyncio
import logging

from airflow_gpu.localcluster.events import Recorder
from airflow_gpu.localcluster.registry.objects import ObjectAPI, deep_copy
from airflow_gpu.localcluster.podutil import is_terminal, pod_requests, quantity, set_condition, tolerates
from airflow_gpu.localcluster.registry.selectors import match_expression

log = logging.getLogger(__name__)
POD_KEY = "/pods"
NODE_KEY = "/nodes"
DEFAULT_SCHEDULER = "default-scheduler"


def _waits_for_us(pod: dict) -> bool:
    return (pod["spec"].get("schedulerName") == DEFAULT_SCHEDULER and not pod["spec"].get("nodeName")
            and not pod["metadata"].get("deletionTimestamp") and not is_terminal(pod))


class DefaultScheduler:
    def __init__(self, objects: ObjectAPI, events: Recorder):
        self.objects, self.store, self.events = objects, objects.store, events
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        # the pods waiting for this scheduler, kept by the listener: a pass over every stored pod on
        # each pod that ends or is deleted cost the API server a fifth of its time at scale (issue 31)
        self._waiting: set[tuple[str, str]] = set()
        self.store.listeners.append(self._on_event)

    def _on_event(self, etype: str, key: str, obj: dict, old: dict | None) -> None:
        if key == POD_KEY:
            ident = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if etype != "DELETED" and _waits_for_us(obj):
                self._waiting.add(ident)
            else:
                self._waiting.discard(ident)
        if key == NODE_KEY or (key == POD_KEY and (etype == "DELETED" or (
                obj["spec"].get("schedulerName") == DEFAULT_SCHEDULER and not obj["spec"].get("nodeName")))):
            self._wake.set()
        elif key == POD_KEY and old is not None and is_terminal(obj) and not is_terminal(old):
            self._wake.set()

    def start(self) -> None:
        self.resync()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def resync(self) -> None:
        """The waiting pods from the store itself (after it was loaded: a replay calls no listener)."""
        self._waiting = {(p["metadata"].get("namespace", ""), p["metadata"]["name"])
                         for p in self.store.values(POD_KEY) if _waits_for_us(p)}
        self._wake.set()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.schedule_pending()
            except Exception:
                log.exception("default scheduler pass failed")
            await asyncio.sleep(0.05)  # batch bursts of pod creations into one pass

    def schedule_pending(self) -> None:
        pending = [p for p in (self.store.get(POD_KEY, *ident) for ident in self._waiting)
                   if p is not None and _waits_for_us(p)]
        if not pending:
            return
        pending.sort(key=lambda p: (-(p["spec"].get("priority") or 0), p["metadata"]["creationTimestamp"]))
        nodes = {n["metadata"]["name"]: n for n in self.store.values(NODE_KEY)}
        free = self._free(nodes)
        for pod in pending:
            requests = pod_requests(pod)
            chosen, reasons = None, {}
            for name, node in sorted(nodes.items(), key=lambda kv: -free[kv[0]].get("cpu", 0)):
                why = self._filter(pod, node, requests, free[name])
                if why is None:
                    chosen = name
                    break
                reasons[why] = reasons.get(why, 0) + 1
            if chosen is None:
                self._unschedulable(pod, len(nodes), reasons)
                continue
            try:
                self.objects.bind(pod["metadata"]["namespace"], pod["metadata"]["name"], chosen)
            except Exception as exc:
                log.info("default scheduler: binding %s failed: %s", pod["metadata"]["name"], exc)
                continue
            for k, v in requests.items():
                free[chosen][k] = free[chosen].get(k, 0) - v
            free[chosen]["pods"] = free[chosen].get("pods", 0) - 1
            self.events.pod(pod, "Normal", "Scheduled",
                            f"Successfully assigned {pod['metadata']['namespace']}/{pod['metadata']['name']} to {chosen}",
                            component=DEFAULT_SCHEDULER)

    def _free(self, nodes: dict[str, dict]) -> dict[str, dict]:
        """Allocatable minus the requests of the pods bound to each node (one pass over pods)."""
        free = {name: {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
                for name, node in nodes.items()}
        for pod in self.store.values(POD_KEY):
            alloc = free.get(pod["spec"].get("nodeName") or "")
            if alloc is None or is_terminal(pod):
                continue
            for k, v in pod_requests(pod).items():
                alloc[k] = alloc.get(k, 0) - v
            alloc["pods"] = alloc.get("pods", 0) - 1
        return free

    @staticmethod
    def _filter(pod: dict, node: dict, requests: dict, free: dict) -> str | None:
        spec, labels = pod["spec"], node["metadata"].get("labels") or {}
        ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), None)
        if (node.get("spec") or {}).get("unschedulable"):
            return "node(s) were unschedulable"
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(spec.get("tolerations"), taint):
                return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
        if ready is not None and ready.get("status") != "True":
            return "node(s) were not ready"
        for k, v in (spec.get("nodeSelector") or {}).items():
            if labels.get(k) != v:
                return "node(s) didn't match Pod's node affinity/selector"
        terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
        if terms and not any(all(match_expression(labels, e) for e in t.get("matchExpressions") or [])
                             and all(_field_match(node, e) for e in t.get("matchFields") or []) for t in terms):
            return "node(s) didn't match Pod's node affinity/selector"
        if free.get("pods", 1) < 1:
            return "Too many pods"
        for k, v in requests.items():
            if v > 0 and free.get(k, 0) < v:
                return f"Insufficient {k}"
        return None

    def _unschedulable(self, pod: dict, total: int, reasons: dict) -> None:
        detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        message = f"0/{total} nodes are available: {detail}." if detail else f"0/{total} nodes are available."
        new = deep_copy(pod)
        if set_condition(new.setdefault("status", {}), "PodScheduled", "False", "Unschedulable", message):
            self.objects.update_status(POD_KEY, new)
            self.events.pod(pod, "Warning", "FailedScheduling", message, component=DEFAULT_SCHEDULER)


def _field_match(node: dict, expr: dict) -> bool:
    if expr.get("key") != "metadata.name":
        return False
    return match_expression({"metadata.name": node["metadata"]["name"]}, expr)

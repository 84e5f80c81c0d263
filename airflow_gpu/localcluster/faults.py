"""Injected faults: spot interruption of a node, a node going NotReady, an API server restart.

Spot interruption follows what pods see on a real cluster, in order:
  t0          node tainted karpenter.sh/disrupted:NoSchedule; every pod on it gets the
              DisruptionTarget condition (before any signal), and an event is recorded;
  t0+notice   pods are stopped: mode "eviction" (Karpenter drains through the Eviction API: reason
              EvictionByEvictionAPI, pods deleted with their grace period -> SIGTERM, SIGKILL) or mode
              "shutdown" (graceful node shutdown as on GKE spot: reason TerminationByKubelet, pods end
              Failed/Terminated "Pod was terminated in response to imminent node shutdown.");
  then        the machine goes away (what still runs is killed) and the Node object is deleted;
              PodGC removes pods left on it after podGCSeconds (DisruptionTarget DeletionByPodGC);
  t0+replace  optionally a replacement node from the same pool joins.
"""

from __future__ import annotations

import asyncio
import logging

from airflow_gpu import constants as C
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.kubelet.kubelet import SHUTDOWN_MESSAGE
from airflow_gpu.localcluster.kubelet.nodeagent import node_status
from airflow_gpu.localcluster.registry.objects import deep_copy
from airflow_gpu.localcluster.podutil import is_terminal, now_iso, set_condition

log = logging.getLogger(__name__)
POD_KEY, NODE_KEY = "/pods", "/nodes"
MODES = ("eviction", "shutdown")
UNREACHABLE = "node.kubernetes.io/unreachable"


class Faults:
    def __init__(self, cluster):
        self.cluster = cluster
        self.tasks: set[asyncio.Task] = set()

    @property
    def objects(self):
        return self.cluster.objects

    @property
    def store(self):
        return self.cluster.store

    def _node(self, name: str) -> dict:
        node = self.store.get(NODE_KEY, "", name)
        if node is None:
            raise errors.not_found("nodes", name)
        return node

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _pods_on(self, node: str) -> list[dict]:
        return [p for p in self.store.values(POD_KEY) if p["spec"].get("nodeName") == node and not is_terminal(p)]

    # --- spot interruption ---------------------------------------------------------------------
    def interrupt(self, node: str, notice: float = 120.0, replace_after: float | None = None,
                  mode: str = "eviction") -> dict:
        if mode not in MODES:
            raise errors.bad_request(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if notice < 0 or (replace_after is not None and replace_after < 0):
            raise errors.bad_request("notice and replaceAfter are seconds >= 0")
        current = self._node(node)
        new = deep_copy(current)
        taints = new["spec"].setdefault("taints", [])
        if not any(t["key"] == C.TAINT_KARPENTER_DISRUPTED for t in taints):
            taints.append({"key": C.TAINT_KARPENTER_DISRUPTED, "effect": "NoSchedule", "timeAdded": now_iso()})
        self.objects.update_status(NODE_KEY, new)
        self.cluster.events.record(new, "Normal", "SpotInterrupted",
                                   f"Spot interruption notice: node {node} is reclaimed in {notice:g}s", "karpenter")
        reason, message = ((C.REASON_EVICTION_BY_EVICTION_API, "Eviction API: evicting") if mode == "eviction"
                           else (C.REASON_TERMINATION_BY_KUBELET, SHUTDOWN_MESSAGE))
        marked = []
        for pod in self._pods_on(node):
            self.objects.mark_disruption(pod, reason, message)
            marked.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
        self._spawn(self._interrupt_later(node, notice, mode))
        if replace_after is not None:
            self._spawn(self._replace_later(node, replace_after))
        return {"node": node, "mode": mode, "notice": notice, "replaceAfter": replace_after, "pods": marked}

    async def _interrupt_later(self, node: str, notice: float, mode: str) -> None:
        await asyncio.sleep(notice)
        if self.store.get(NODE_KEY, "", node) is None:
            return
        kubelet = self.cluster.kubelet
        graces = []
        for pod in self._pods_on(node):
            graces.append(pod["spec"].get("terminationGracePeriodSeconds", 30))
            if mode == "eviction":
                try:
                    self.objects.evict(pod["metadata"]["namespace"], pod["metadata"]["name"])
                except errors.ApiError:
                    pass
        runs = kubelet.shutdown_node(node) if mode == "shutdown" else \
            [r for r in kubelet.runs.values() if r.node == node and not r.finished]
        if runs:
            # the machine lives until its pods are done or their longest grace period has passed
            await asyncio.wait([asyncio.ensure_future(r.ended.wait()) for r in runs],
                               timeout=max(graces or [0]) + 1)
        kubelet.kill_node(node)
        try:
            self.store.delete(NODE_KEY, "", node, "nodes")
        except errors.ApiError:
            pass

    async def _replace_later(self, node: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.cluster.add_replacement_node(node)

    # --- node NotReady ---------------------------------------------------------------------------
    def not_ready(self, node: str, seconds: float | None = None) -> dict:
        """The kubelet stops reporting: Ready=Unknown, unreachable taints (NoSchedule + NoExecute,
        so pods are evicted by the taint manager after their tolerationSeconds, 300 by default)."""
        current = self._node(node)
        self.cluster.kubelet.unresponsive.add(node)
        new = deep_copy(current)
        for cond in new["status"].get("conditions") or []:
            cond.update(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.",
                        lastTransitionTime=now_iso())
        taints = [t for t in new["spec"].get("taints") or [] if t["key"] != UNREACHABLE]
        taints += [{"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now_iso()},
                   {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now_iso()}]
        new["spec"]["taints"] = taints
        self.objects.update_status(NODE_KEY, new)
        self.cluster.events.record(new, "Normal", "NodeNotReady", f"Node {node} status is now: NodeNotReady",
                                   "node-controller")
        for pod in self._pods_on(node):
            fresh = deep_copy(pod)
            set_condition(fresh.setdefault("status", {}), "Ready", "False", "NodeNotReady", None)
            self.objects.update_status(POD_KEY, fresh)
        if seconds is not None:
            self._spawn(self._ready_later(node, seconds))
        return {"node": node, "notReady": True, "seconds": seconds}

    async def _ready_later(self, node: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.ready(node)

    def ready(self, node: str) -> dict:
        current = self._node(node)
        kubelet = self.cluster.kubelet
        kubelet.unresponsive.discard(node)
        new = deep_copy(current)
        new["status"] = node_status(new)
        new["spec"]["taints"] = [t for t in new["spec"].get("taints") or [] if t["key"] != UNREACHABLE]
        if not new["spec"]["taints"]:
            new["spec"].pop("taints")
        self.objects.update_status(NODE_KEY, new)
        self.cluster.events.record(new, "Normal", "NodeReady", f"Node {node} status is now: NodeReady", "kubelet")
        kubelet.resync()
        for run in list(kubelet.runs.values()):
            if run.node == node and not run.finished:
                kubelet._refresh_statuses(run)
        return {"node": node, "notReady": False}

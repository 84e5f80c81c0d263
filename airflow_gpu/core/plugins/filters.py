"""Filter plugins: each returns a mask over all nodes and the reason label for the rejected ones.

Static filters (selector, taints, products, capacity type) depend only on the node list and the
pod's constraints, so their masks are computed once per distinct constraint and cached on the
snapshot's shared ClusterShape.
"""

from __future__ import annotations

import numpy as np

from airflow_gpu.constants import RESOURCE_GPU, RESOURCE_MIG_PREFIX
from airflow_gpu.core.framework import FilterResult
from airflow_gpu.core.model import PodRequest
from airflow_gpu.core.snapshot import Snapshot

REASON_CPU = "insufficient cpu"
REASON_MEMORY = "insufficient memory"
REASON_GPU = f"insufficient {RESOURCE_GPU}"
REASON_NODE_SELECTOR = "node(s) didn't match node selector"
REASON_CAPACITY_TYPE = "node(s) of another capacity type"
HARD_TAINT_EFFECTS = ("NoSchedule", "NoExecute")


class ResourceFit:
    """CPU, memory and the GPU form (whole GPUs, a gpu_milli share of one GPU, a MIG slice)."""

    name = "ResourceFit"
    resources = True  # reads only the node's own free capacity (framework.place_identical counts it itself)

    def filter(self, snap: Snapshot, pod: PodRequest) -> FilterResult:
        gpu_ok = snap.gpu_fit_mask(pod)
        cpu_ok = snap.cpu_free >= pod.cpu_milli
        mem_ok = snap.mem_free >= pod.memory_mib
        ok = gpu_ok & cpu_ok & mem_ok
        gpu_reason = f"insufficient {RESOURCE_MIG_PREFIX}{pod.mig_profile}" if pod.mig_profile else REASON_GPU

        def reason():  # GPU first: on a GPU cluster "no GPU" is the actionable part of the message
            return np.where(~gpu_ok, gpu_reason, np.where(~cpu_ok, REASON_CPU, REASON_MEMORY))

        return FilterResult(ok, reason)


class GpuProduct:
    """A GPU pod may only go to nodes whose product is one of pod.gpu_products (empty: any)."""

    name = "GpuProduct"
    static = True  # reads only the node list (labels, taints, products), never free capacity

    def filter(self, snap: Snapshot, pod: PodRequest) -> FilterResult:
        if not pod.gpu_products or not pod.uses_gpu:
            return _passes_all(snap)
        return FilterResult(
            snap.shape.product_mask(pod.gpu_products),
            f"node(s) with another GPU product (wants {'|'.join(pod.gpu_products)})",
        )


class NodeSelector:
    """Every (key, value) of pod.node_selector must be a label of the node."""

    name = "NodeSelector"
    static = True  # reads only the node list (labels, taints, products), never free capacity

    def filter(self, snap: Snapshot, pod: PodRequest) -> FilterResult:
        if not pod.node_selector:
            return _passes_all(snap)
        wanted = tuple(sorted(pod.node_selector))
        mask = _nodes_where(snap, ("selector", wanted), lambda node: all(node.label(k) == v for k, v in wanted))
        return FilterResult(mask, REASON_NODE_SELECTOR)


class TaintToleration:
    """NoSchedule / NoExecute taints must be tolerated; the reason names the first untolerated key."""

    name = "TaintToleration"
    static = True  # reads only the node list (labels, taints, products), never free capacity

    def filter(self, snap: Snapshot, pod: PodRequest) -> FilterResult:
        return FilterResult(*snap.shape.derived(("taints", pod.tolerations), lambda: self._untolerated(snap, pod)))

    @staticmethod
    def _untolerated(snap: Snapshot, pod: PodRequest) -> tuple:
        reasons = []
        for node in snap.nodes:
            bad = next(
                (
                    t
                    for t in node.taints
                    if t.effect in HARD_TAINT_EFFECTS and not any(tol.tolerates(t) for tol in pod.tolerations)
                ),
                None,
            )
            reasons.append("" if bad is None else f"untolerated taint {bad.key}")
        reason = np.array(reasons, dtype=object).reshape(len(snap))
        ok = reason == ""
        # no hard taint in the way: the shared all-nodes mask, which run_filters skips
        return (snap.shape.every_node, "") if ok.all() else (ok, reason)


class CapacityType:
    """pod.capacity_types (e.g. ("spot",)) restricts nodes by Node.capacity_type; empty: any."""

    name = "CapacityType"
    static = True  # reads only the node list (labels, taints, products), never free capacity

    def filter(self, snap: Snapshot, pod: PodRequest) -> FilterResult:
        if not pod.capacity_types:
            return _passes_all(snap)
        types = tuple(sorted(pod.capacity_types))
        mask = _nodes_where(snap, ("capacity", types), lambda node: node.capacity_type in types)
        return FilterResult(mask, REASON_CAPACITY_TYPE)


def _nodes_where(snap: Snapshot, cache_key: tuple, predicate) -> np.ndarray:
    """Mask of the nodes satisfying `predicate`, built once per cluster shape and cache key (node
    labels and capacity types do not change between placements)."""
    return snap.shape.cached_mask(
        cache_key, lambda: np.fromiter((predicate(node) for node in snap.nodes), dtype=bool, count=len(snap))
    )


def _passes_all(snap: Snapshot) -> FilterResult:
    """The one result of a filter that rejects nothing (run_filters skips it), made once per cluster
    shape: a placement asks every filter, and most ask nothing of a pod."""
    return snap.shape.derived("passes-all", lambda: FilterResult(snap.shape.every_node, ""))


def default_filters() -> tuple:
    """The filters every profile runs, in kube-scheduler's order (static ones first is only cosmetic:
    a node is reported under the first filter that rejects it)."""
    return (NodeSelector(), TaintToleration(), CapacityType(), GpuProduct(), ResourceFit())

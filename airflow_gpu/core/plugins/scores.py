"""The FGD artifact's baseline score plugins, vectorised, with its integer arithmetic.

Each score(snap, pod, nodes) returns integer scores (0..100) for feasible node indices `nodes`,
reproducing hkust-adsl/kubernetes-scheduler-simulator pkg/simulator/plugin (Random, DotProduct with
merged GPU dimension and max-spec normalisation, GpuClustering, GpuPacking, BestFit with its min-max
NormalizeScore). GPU choice on the chosen node: BestFitGpu (least free that fits, first on ties) or
RandomGpu, as the artifact's Open-Gpu-Share "best" / "random" selection.
"""

from __future__ import annotations

import numpy as np

from airflow_gpu.core.model import GPU_MILLI, PodRequest
from airflow_gpu.core.snapshot import GPU_KINDS, Snapshot

MAX_NODE_SCORE = 100
MAX_SPEC_CPU = 128_000  # the artifact's normalisers (largest node in the Alibaba clusters)
MAX_SPEC_GPU = 8_000


def _pod_gpu_total(pod: PodRequest) -> int:
    return pod.gpus * GPU_MILLI + pod.gpu_milli


def normalize_min_max(scores: np.ndarray) -> np.ndarray:
    """The artifact's NormalizeScore: integer (s - lo) * 100 / (hi - lo); all 0 when equal."""
    lo, hi = scores.min(), scores.max()
    if hi == lo:
        return np.zeros_like(scores)
    return (scores - lo) * MAX_NODE_SCORE // (hi - lo)


class RandomScore:
    """One uniformly random feasible node scores 100, the rest 0."""

    name = "Random"

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        out = np.zeros(len(nodes), dtype=np.int64)
        out[self.rng.integers(len(nodes))] = MAX_NODE_SCORE
        return out


class DotProductScore:
    """Tetris: 100 * (1 - <free, request> / 2), both normalised by the max spec (CPU, total GPU)."""

    name = "DotProd"

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        cpu = snap.cpu_free[nodes] / MAX_SPEC_CPU * (pod.cpu_milli / MAX_SPEC_CPU)
        gpu = snap.gpu_free[nodes].sum(axis=1) / MAX_SPEC_GPU * (_pod_gpu_total(pod) / MAX_SPEC_GPU)
        return (MAX_NODE_SCORE * (1.0 - (cpu + gpu) / 2.0)).astype(np.int64)


class BestFitScore:
    """Least (CPU, total GPU) left after placing, by max spec, 0.5/0.5; then min-max normalised."""

    name = "BestFit"

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        left = 0.5 * (snap.cpu_free[nodes] - pod.cpu_milli) / MAX_SPEC_CPU + 0.5 * (
            snap.gpu_free[nodes].sum(axis=1) - _pod_gpu_total(pod)
        ) / MAX_SPEC_GPU
        return normalize_min_max(((1.0 - left) * MAX_NODE_SCORE).astype(np.int64))


class LeastAllocatedScore:
    """kube-scheduler's default NodeResourcesLeastAllocated (spreading): most free (CPU, total GPU)
    fraction after placing, 0.5/0.5, by node capacity. The naive baseline's placement."""

    name = "LeastAllocated"

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        cpu_cap = np.maximum(snap.shape.cpu_cap[nodes], 1)
        gpu_cap = np.maximum(snap.shape.gpu_exists[nodes].sum(axis=1) * GPU_MILLI, 1)
        free = 0.5 * (snap.cpu_free[nodes] - pod.cpu_milli) / cpu_cap + 0.5 * (
            snap.gpu_free[nodes].sum(axis=1) - _pod_gpu_total(pod)
        ) / gpu_cap
        return (np.clip(free, 0.0, 1.0) * MAX_NODE_SCORE).astype(np.int64)


class GpuClusteringScore:
    """Keep GPU pods of one kind (share / k-GPU) together: same-kind-only nodes best, then mixed
    nodes with that kind, then empty nodes, then other kinds; fuller nodes first within each band."""

    name = "GpuClustering"

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        if not (pod.gpus or pod.gpu_milli):
            return np.zeros(len(nodes), dtype=np.int64)
        tags = snap.kind_counts[nodes]
        mine = tags[:, 0 if pod.gpu_milli else min(pod.gpus, len(GPU_KINDS) - 1)] > 0
        kinds = (tags > 0).sum(axis=1)
        base = np.where(mine, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
        used = MAX_SPEC_GPU - snap.gpu_free[nodes].sum(axis=1)
        return (MAX_NODE_SCORE // 4) * used // MAX_SPEC_GPU + base


class GpuPackingScore:
    """Prefer shared GPUs already in use, then free GPUs on used nodes, then empty nodes."""

    name = "GpuPacking"

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        if not (pod.gpus or pod.gpu_milli):
            return np.zeros(len(nodes), dtype=np.int64)
        free = snap.gpu_free[nodes]
        count = snap.shape.gpu_count[nodes]
        whole = (free == GPU_MILLI).sum(axis=1)
        empty_node = whole == count
        case3 = np.maximum(MAX_NODE_SCORE // 3 - whole, whole)
        if pod.gpus:
            # whole GPUs only fit on fully free GPUs: case 2 uses pod.gpus of them
            case2 = np.maximum(MAX_NODE_SCORE // 2 - pod.gpus, MAX_NODE_SCORE // 3)
            return np.where(empty_node, case3, case2).astype(np.int64)
        # a share goes on the fitting GPU with the least free milli (the artifact's ascending walk)
        masked = np.where(free >= pod.gpu_milli, free, GPU_MILLI + 1)
        least = masked.min(axis=1)
        case2 = np.full(len(nodes), max(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3))
        case1 = np.maximum(MAX_NODE_SCORE - (least * 100 // GPU_MILLI) // 10, MAX_NODE_SCORE // 2)
        return np.where(empty_node, case3, np.where(least == GPU_MILLI, case2, case1)).astype(np.int64)


class BestFitGpu:
    """GPU choice "best": whole GPUs lowest index first; a share on the fitting GPU with least free."""

    whole_gpus_lowest_first = True  # as default_gpu_choice (framework.place_identical relies on it)

    def choose_gpus(self, snap: Snapshot, pod: PodRequest, node: int):
        return snap.default_gpu_choice(pod, node)


class RandomGpu:
    """GPU choice "random": a share on a uniformly random fitting GPU; whole GPUs lowest index first."""

    whole_gpus_lowest_first = True  # as default_gpu_choice (framework.place_identical relies on it)

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def choose_gpus(self, snap: Snapshot, pod: PodRequest, node: int):
        if pod.gpu_milli:
            ok = np.flatnonzero(snap.gpu_free[node] >= pod.gpu_milli)
            return ((int(ok[self.rng.integers(len(ok))]), pod.gpu_milli),)
        return snap.default_gpu_choice(pod, node)


class GpuProductPreference:
    """A pod's gpu_products are accepted products in preference order: the first scores 100, the
    last 100/k (k products); nodes of other products never get here (GpuProduct filter)."""

    name = "GpuProductPreference"
    static = True  # reads only the node list, never free capacity: the same score pod after pod

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        k = len(pod.gpu_products)
        if k < 2 or not pod.uses_gpu:
            return np.zeros(len(nodes), dtype=np.int64)
        rank = {p: i for i, p in enumerate(pod.gpu_products)}
        by_id = np.array([rank.get(p, k) for p in snap.shape.products] + [k], dtype=np.int64)
        return MAX_NODE_SCORE * (k - by_id[snap.shape.product_id[nodes]]) // k


class CapacityPreference:
    """A pod that accepts several capacity types (PodRequest.capacity_types, in preference order:
    core.capacity sets spot first for spot-eligible work, on-demand first for work that may only
    overflow onto spot) scores 100 on nodes of the first type, 0 elsewhere; one type or none: no
    preference. Profiles weigh it above every other score (a preference, not a tie-break)."""

    name = "CapacityPreference"
    static = True  # reads only the node list, never free capacity: the same score pod after pod

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        if len(pod.capacity_types) < 2:
            return np.zeros(len(nodes), dtype=np.int64)
        first = pod.capacity_types[0]
        shape = snap.shape
        of_type = shape.cached_mask(("capacity-preference", first),
                                    lambda: np.array([n.capacity_type == first for n in shape.nodes], dtype=bool))
        return of_type[nodes] * MAX_NODE_SCORE

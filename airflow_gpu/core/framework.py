"""The Kubernetes scheduling framework's shape (filter -> score -> reserve), vectorised over nodes.

A filter plugin looks at every node at once and returns a boolean mask plus the reason label for the
nodes it rejects; a score plugin returns one score per feasible node; a Profile is filters plus
weighted scores plus a fixed tie order. `place_pod` runs a profile for one pod and returns the
Placement (node and GPU indices) without changing the snapshot: the caller reserves it with
`Snapshot.assume`, so gang admission can try members on a copy and drop the copy on failure.

Ties: scores are integers (as in kube-scheduler and the FGD artifact), and the best-scoring node with
the lowest rank in `Profile.tie_rank` wins. With a seeded shuffled rank this is the artifact's
"consistent first fit among equals", which its published numbers depend on.

What a plugin may declare so that `place_identical` places a pod set's members at once (a plugin
that declares nothing keeps them one by one): a filter `static = True` (reads only the node list)
or `fixed = True` (a mask placing pods does not change) or `resources = True` (ResourceFit: the
node's own free capacity); a score `static = True` (the same score pod after pod) or
`score_run(snap, pod, nodes, depth)` (its scores member after member); a GPU chooser
`whole_gpus_lowest_first = True` (whole GPUs as `Snapshot.default_gpu_choice` takes them).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from airflow_gpu.core.model import GPU_MILLI, Placement, PodRequest
from airflow_gpu.core.snapshot import Snapshot


@dataclass(frozen=True)
class FilterResult:
    """ok[i]: node i passes. reason: the label for rejected nodes, or an array of labels (one per
    node, read only where ok is False) when one plugin has several reasons, or a zero-argument
    callable returning that array (computed only if someone reads the diagnosis)."""

    ok: np.ndarray
    reason: str | np.ndarray | Callable[[], np.ndarray]


@runtime_checkable
class FilterPlugin(Protocol):
    name: str

    def filter(self, snap: Snapshot, pod: PodRequest) -> FilterResult: ...


@runtime_checkable
class ScorePlugin(Protocol):
    name: str

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        """Scores (integers, higher is better) for node indices `nodes`, all of which passed filters."""
        ...


@runtime_checkable
class GpuChooser(Protocol):
    """A plugin that also decides which GPUs of the chosen node the pod takes (FGD does)."""

    def choose_gpus(self, snap: Snapshot, pod: PodRequest, node: int) -> tuple[tuple[int, int], ...]: ...


class FilterDiagnosis:
    """Why nodes were rejected, counted per reason (each node counted once, under its first failing
    filter, as kube-scheduler reports it). Counting happens on first read: the simulator never
    reads it, a scheduler reads it only for pods that wait."""

    __slots__ = ("total", "_feasible", "_parts", "_reasons", "_ok")

    def __init__(self, total: int, feasible: int | None = None, reasons=None, parts=(), ok: np.ndarray | None = None):
        """parts: (mask of the nodes a filter passes, its reason) per filter, in order; feasible
        defaults to the nodes `ok` passes (counted when read)."""
        self.total = total
        self._feasible = feasible
        self._ok = ok
        self._parts = parts
        self._reasons = tuple(reasons) if reasons is not None else None

    @property
    def feasible(self) -> int:
        if self._feasible is None:
            self._feasible = int(self._ok.sum()) if self._ok is not None else self.total
        return self._feasible

    @property
    def reasons(self) -> tuple[tuple[str, int], ...]:
        if self._reasons is None:
            counts: Counter[str] = Counter()
            passing = np.ones(self.total, dtype=bool)
            for mask, reason in self._parts:
                newly = passing & ~mask  # attribute a node to its first failing filter only
                if not newly.any():
                    continue
                passing &= mask
                if isinstance(reason, str):
                    counts[reason] += int(newly.sum())
                else:
                    labels = reason() if callable(reason) else reason
                    counts.update(np.asarray(labels)[newly].tolist())
            self._reasons = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
            self._parts = ()
        return self._reasons

    def message(self) -> str:
        """'0/12 nodes are available: 8 insufficient nvidia.com/gpu, 4 untolerated taint ...'."""
        head = f"{self.feasible}/{self.total} nodes are available"
        if not self.reasons:
            return head
        return head + ": " + ", ".join(f"{count} {reason}" for reason, count in self.reasons)

    def __str__(self) -> str:
        return self.message()

    def __repr__(self) -> str:
        return f"FilterDiagnosis({self.message()!r})"


@dataclass
class Profile:
    """Filters, weighted scores and the tie order: one scheduling policy.

    gpu_chooser: picks GPU indices on the chosen node (default: Snapshot.default_gpu_choice).
    tie_rank: [N] rank of each node among equal scores (lower wins); None = node list order.
    """

    name: str
    filters: tuple[FilterPlugin, ...]
    scores: tuple[tuple[ScorePlugin, float], ...] = ()
    gpu_chooser: GpuChooser | None = None
    tie_rank: np.ndarray | None = None

    def with_tie_rank(self, rank: np.ndarray) -> Profile:
        return Profile(self.name, self.filters, self.scores, self.gpu_chooser, np.asarray(rank))


def run_filters(snap: Snapshot, pod: PodRequest, filters) -> tuple[np.ndarray, FilterDiagnosis]:
    """Every filter over every node: the feasible mask (read only), and the reasons for the rest
    (worked out only when read: most placements never read them)."""
    ok = None
    parts = []
    every = snap.shape.every_node
    for plugin in filters:
        result = plugin.filter(snap, pod)
        if result.ok is every:  # rejects nothing
            continue
        parts.append((result.ok, result.reason))
        ok = result.ok if ok is None else ok & result.ok
    if ok is None:
        ok = every
    return ok, FilterDiagnosis(total=len(snap), parts=tuple(parts), ok=ok)


def static_mask(snap: Snapshot, pod: PodRequest, filters) -> np.ndarray:
    """[N] bool: the nodes that pass those of `filters` that read only the node list (a plugin's
    `static = True`: labels, taints, GPU product), not free capacity: where `pod` may ever go."""
    ok = snap.shape.every_node
    for plugin in filters:
        if getattr(plugin, "static", False):
            mask = plugin.filter(snap, pod).ok
            if mask is not snap.shape.every_node:
                ok = ok & mask
    return ok


def total_scores(snap: Snapshot, pod: PodRequest, profile: Profile, nodes: np.ndarray) -> np.ndarray:
    """Weighted sum of the profile's score plugins over node indices `nodes`."""
    total = None
    for plugin, weight in profile.scores:
        part = weight * np.asarray(plugin.score(snap, pod, nodes), dtype=np.float64)
        total = part if total is None else total + part
    return total if total is not None else np.zeros(len(nodes), dtype=np.float64)


def pick_best(nodes: np.ndarray, scores: np.ndarray, tie_rank: np.ndarray | None) -> int:
    """The node with the highest score; among equals the lowest tie rank (or lowest index)."""
    best = nodes[scores == scores.max()]
    if tie_rank is None or len(best) == 1:
        return int(best[0])
    return int(best[np.argmin(tie_rank[best])])


def place_identical(snap: Snapshot, pods: list[PodRequest], profile: Profile) -> list[Placement] | None:
    """The placements place_pod gives `pods` (one shape, whole GPUs) placed one after another, each
    with the earlier ones held, worked out at once: a gang of 128 one-GPU members is one score
    table, not 128 passes over every filter and score. Exact because every filter of the profile
    is fixed by the node list or reads the node's own free capacity, and every score plugin says
    its scores pod after pod (`score_run`) or is static: placing a pod changes only its node's
    row. None (nothing worked out) when that does not hold, or when not every pod fits: the caller
    places them one by one and says why. Does not change `snap`."""
    pod = pods[0]
    if pod.gpus <= 0 or pod.gpu_milli or pod.mig_profile is not None or not profile.scores:
        return None
    chooser = profile.gpu_chooser
    if chooser is not None and not getattr(chooser, "whole_gpus_lowest_first", False):
        return None
    if not all(getattr(f, "static", False) or getattr(f, "fixed", False) or getattr(f, "resources", False)
               for f in profile.filters):
        return None
    ok, _ = run_filters(snap, pod, profile.filters)
    nodes = np.flatnonzero(ok)
    if not len(nodes):
        return None
    # how many of them fit on each node, by the node's own free capacity (ResourceFit, pod after pod)
    cap = snap.whole_free_gpus()[nodes] // pod.gpus
    if pod.cpu_milli:
        cap = np.minimum(cap, snap.cpu_free[nodes] // pod.cpu_milli)
    if pod.memory_mib:
        cap = np.minimum(cap, snap.mem_free[nodes] // pod.memory_mib)
    if int(cap.sum()) < len(pods):
        return None
    depth = int(min(len(pods), cap.max()))
    table = None
    for plugin, weight in profile.scores:
        if getattr(plugin, "static", False):
            part = (weight * np.asarray(plugin.score(snap, pod, nodes), dtype=np.float64))[:, None]
        elif hasattr(plugin, "score_run"):
            run = plugin.score_run(snap, pod, nodes, depth)
            if run is None:
                return None
            part = weight * np.asarray(run, dtype=np.float64)
        else:
            return None
        table = part if table is None else table + part
    table = np.broadcast_to(table, (len(nodes), depth))
    # pick_best pod after pod: the highest score, then the lowest tie rank, then the lowest index
    rank = profile.tie_rank
    heap = [(-float(table[j, 0]), int(rank[n]) if rank is not None else 0, int(n), j) for j, n in enumerate(nodes)]
    heapq.heapify(heap)
    used = [0] * len(nodes)
    whole_ids: dict[int, list[int]] = {}
    out = []
    for p in pods:
        _, _, node, j = heapq.heappop(heap)
        ids = whole_ids.get(node)
        if ids is None:  # default_gpu_choice pod after pod: the lowest-index whole GPUs still free
            ids = whole_ids[node] = np.flatnonzero(snap.gpu_free[node] == GPU_MILLI).tolist()
        m = used[j]
        out.append(snap.placement_for(p, node, tuple((g, GPU_MILLI) for g in ids[m * p.gpus:(m + 1) * p.gpus])))
        used[j] = m + 1
        if m + 1 < cap[j] and m + 1 < depth:
            heapq.heappush(heap, (-float(table[j, m + 1]), int(rank[node]) if rank is not None else 0, node, j))
    return out


def place_pod(snap: Snapshot, pod: PodRequest, profile: Profile) -> tuple[Placement | None, FilterDiagnosis]:
    """Where `pod` would go under `profile` (node and GPU indices), or None with the reasons.

    Does not change `snap`; reserve the result with `snap.assume(placement)`.
    """
    ok, diagnosis = run_filters(snap, pod, profile.filters)
    nodes = np.flatnonzero(ok)
    if not len(nodes):
        return None, diagnosis
    if len(nodes) == 1 or not profile.scores:
        if profile.tie_rank is not None and len(nodes) > 1:
            node = int(nodes[np.argmin(profile.tie_rank[nodes])])
        else:
            node = int(nodes[0])
    else:
        node = pick_best(nodes, total_scores(snap, pod, profile, nodes), profile.tie_rank)
    shares = profile.gpu_chooser.choose_gpus(snap, pod, node) if profile.gpu_chooser else None
    return snap.placement_for(pod, node, shares), diagnosis

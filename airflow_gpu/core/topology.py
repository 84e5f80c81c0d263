"""Topology for multi-node gangs: which node subsets to try, tightest first.

One node when the whole gang fits on one; otherwise the fewest nodes within one NVLink clique, then
within one rack, then within one zone; with a soft requirement, finally anywhere. Each candidate is a
Domain: a node subset the gang admission code places every member into (all or none) before moving
on to the next candidate. Pure numpy over the snapshot; the order is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from airflow_gpu.core.framework import Profile, run_filters
from airflow_gpu.core.model import GPU_MILLI, Gang, TopologyLevel
from airflow_gpu.core.snapshot import Snapshot

_LEVELS = (TopologyLevel.NODE, TopologyLevel.CLIQUE, TopologyLevel.RACK, TopologyLevel.ZONE, TopologyLevel.ANY)


@dataclass(frozen=True)
class Domain:
    """A node subset to place a whole gang in. nodes_needed is an estimate (members per node from
    the free capacity for the gang's largest member), used to order candidates."""

    level: TopologyLevel
    name: str
    nodes: np.ndarray  # node indices, best first (most members fit first)
    nodes_needed: int


def members_per_node(snap: Snapshot, gang: Gang, eligible: np.ndarray | None = None) -> np.ndarray:
    """[N] how many of the gang's largest member fit on each node's free capacity (0 if not eligible)."""
    cpu = max(m.cpu_milli for m in gang.members)
    mem = max(m.memory_mib for m in gang.members)
    gpus = max(m.gpus for m in gang.members)
    share = max(m.gpu_milli for m in gang.members)
    big = np.iinfo(np.int64).max // 4
    fit = np.full(len(snap), big, dtype=np.int64)
    if cpu:
        fit = np.minimum(fit, snap.cpu_free // cpu)
    if mem:
        fit = np.minimum(fit, snap.mem_free // mem)
    if gpus:
        fit = np.minimum(fit, snap.whole_free_gpus() // gpus)
    elif share:
        # shares never span GPUs: count how many shares each GPU holds
        fit = np.minimum(fit, (snap.gpu_free // share).sum(axis=1))
    fit = np.minimum(fit, len(gang.members))
    if eligible is not None:
        fit = np.where(eligible, fit, 0)
    return fit


def eligible_nodes(snap: Snapshot, gang: Gang, profile: Profile) -> np.ndarray:
    """[N] bool: nodes that pass the profile's filters for EVERY member taken alone."""
    ok = np.ones(len(snap), dtype=bool)
    seen = set()
    for member in gang.members:
        key = (member.cpu_milli, member.memory_mib, member.gpus, member.gpu_milli, member.mig_profile,
               member.gpu_products, member.node_selector, member.tolerations, member.capacity_types)
        if key in seen:
            continue
        seen.add(key)
        mask, _ = run_filters(snap, member, profile.filters)
        ok &= mask
    return ok


def candidate_domains(snap: Snapshot, gang: Gang, profile: Profile | None = None) -> list[Domain]:
    """Node subsets to try for `gang`, in order: single nodes that hold it all (tightest fit first),
    then cliques, racks and zones by fewest nodes needed, then (soft only) the whole cluster.

    A hard requirement at level L stops after L. Domains whose free capacity cannot hold the gang
    (by the largest-member estimate) are left out, so an empty list means "does not fit now".
    """
    eligible = eligible_nodes(snap, gang, profile) if profile is not None else None
    fit = members_per_node(snap, gang, eligible)
    want = len(gang.members)
    req = gang.topology
    limit = _LEVELS.index(req.level) if req.hard else len(_LEVELS) - 1
    out: list[Domain] = []

    # one node: every member on it; tightest (fewest GPUs left over) first, then node order
    whole = np.flatnonzero(fit >= want)
    if len(whole):
        leftover = snap.gpu_free[whole].sum(axis=1) - gang.gpu_milli_total
        order = whole[np.lexsort((whole, leftover))]
        out.extend(Domain(TopologyLevel.NODE, snap.nodes[i].name, np.array([i]), 1) for i in order)
    if want == 1 or limit == 0:
        return out

    # a hard requirement at level L holds only for tighter domains inside one L domain: labels need
    # not nest (a clique may span racks), so a tighter domain across L boundaries is skipped
    bound = snap.shape.domain_ids(req.level.value) if req.hard and req.level is not TopologyLevel.ANY else None

    for level in _LEVELS[1 : limit + 1]:
        if level is TopologyLevel.ANY:
            ids = np.zeros(len(snap), dtype=np.int64)
            names = ["*"]
        else:
            ids = snap.shape.domain_ids(level.value)
            names = sorted({getattr(n, level.value) for n in snap.nodes if getattr(n, level.value)})
        found = []
        for d, name in enumerate(names):
            members = np.flatnonzero((ids == d) & (fit > 0))
            if not len(members):
                continue
            order = members[np.lexsort((members, -fit[members]))]
            if bound is not None and level is not req.level:
                spans = np.unique(bound[order])
                if len(spans) != 1 or spans[0] < 0:
                    continue
            cum = np.cumsum(fit[order])
            if cum[-1] < want:
                continue
            needed = int(np.searchsorted(cum, want) + 1)
            found.append(Domain(level, name, order, needed))
        found.sort(key=lambda dom: (dom.nodes_needed, dom.name))
        out.extend(found)
    return out


def gpus_free_total(snap: Snapshot, nodes: np.ndarray) -> int:
    """Whole GPUs free in a node subset (for wait reasons such as 'largest free block')."""
    return int((snap.gpu_free[nodes] == GPU_MILLI).sum())

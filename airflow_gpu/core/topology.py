"""Topology for multi-node gangs: which node subsets to try, tightest first.

One node when the whole gang fits on one; otherwise the fewest nodes within one NVLink clique, then
within one rack, then within one zone; with a soft requirement, finally anywhere. Each candidate is a
Domain: a node subset the gang admission code places every member into (all or none) before moving
on to the next candidate. Pure numpy over the snapshot; the order is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from airflow_gpu.core.framework import Profile, run_filters
from airflow_gpu.core.model import GPU_MILLI, Gang, PodRequest, TopologyLevel
from airflow_gpu.core.snapshot import Snapshot

# The topology level ladder, tightest first: the one copy (room, preemption and wait reasons use it).
LADDER = (TopologyLevel.NODE, TopologyLevel.CLIQUE, TopologyLevel.RACK, TopologyLevel.ZONE, TopologyLevel.ANY)


@dataclass(frozen=True)
class Domain:
    """A node subset to place a whole gang in. nodes_needed is an estimate (members per node from
    the free capacity, pod set by pod set), used to order candidates."""

    level: TopologyLevel
    name: str
    nodes: np.ndarray  # node indices, best first (most members fit first)
    nodes_needed: int


def fit_count(req: PodRequest, count: int, cpu, mem, gpu_rows, mig_rows=None, mig_profiles=(),
              whole=None) -> np.ndarray:
    """How many pods shaped like `req` (at most `count`) fit, alone, on each row's free capacity:
    cpu [k], mem [k], gpu_rows [k, G] milli free per GPU, mig_rows [k, P] (None: MIG not counted);
    whole [k]: entirely free GPUs per row, when known (Snapshot.whole_free_gpus)."""
    fit = np.full(len(cpu), count, dtype=np.int64)
    if req.cpu_milli:
        fit = np.minimum(fit, cpu // req.cpu_milli)
    if req.memory_mib:
        fit = np.minimum(fit, mem // req.memory_mib)
    if req.gpus:
        fit = np.minimum(fit, ((gpu_rows == GPU_MILLI).sum(axis=1) if whole is None else whole) // req.gpus)
    elif req.gpu_milli:
        # shares never span GPUs: count how many shares each GPU holds
        fit = np.minimum(fit, (gpu_rows // req.gpu_milli).sum(axis=1))
    elif req.mig_profile is not None and mig_rows is not None:
        col = mig_profiles.index(req.mig_profile) if req.mig_profile in mig_profiles else -1
        fit = np.minimum(fit, mig_rows[:, col] if col >= 0 else 0)
    return np.maximum(fit, 0)


def fit_count_one(req: PodRequest, count: int, cpu: int, mem: int, gpu_row) -> int:
    """fit_count for one node in plain Python (MIG not counted: an upper bound): walking victims
    node by node calls this tens of thousands of times, where numpy's per-call cost dominates.
    gpu_row: milli free per GPU (a list or a 1-D array)."""
    fit = count
    if req.cpu_milli:
        fit = min(fit, cpu // req.cpu_milli)
    if req.memory_mib:
        fit = min(fit, mem // req.memory_mib)
    if req.gpus:
        fit = min(fit, sum(1 for f in gpu_row if f == GPU_MILLI) // req.gpus)
    elif req.gpu_milli:
        fit = min(fit, sum(f // req.gpu_milli for f in gpu_row))
    return max(int(fit), 0)


def set_fits(snap: Snapshot, gang: Gang, eligible: np.ndarray | None = None) -> np.ndarray:
    """[S, N] how many members of each pod set (gang.pod_sets) fit alone on each node's free
    capacity (0 where the set is not eligible; eligible is [S, N] or [N])."""
    sets = gang.pod_sets
    out = np.empty((len(sets), len(snap)), dtype=np.int64)
    for s, ps in enumerate(sets):
        out[s] = fit_count(ps.request, ps.count, snap.cpu_free, snap.mem_free, snap.gpu_free, snap.mig_free,
                           snap.shape.mig_profiles, snap.whole_free_gpus())
    if eligible is not None:
        out = np.where(eligible if eligible.ndim == 2 else eligible[None, :], out, 0)
    return out


def members_per_node(snap: Snapshot, gang: Gang, eligible: np.ndarray | None = None) -> np.ndarray:
    """[N] an upper bound of the gang's members that fit on each node: every pod set counted alone."""
    return set_fits(snap, gang, eligible).sum(axis=0)


def set_counts(gang: Gang) -> np.ndarray:
    return np.array([ps.count for ps in gang.pod_sets], dtype=np.int64)


def free_table(snap: Snapshot, node_ok: np.ndarray) -> np.ndarray:
    """[3, N] free CPU, memory and whole GPUs of the nodes in `node_ok` (0 elsewhere)."""
    return np.where(node_ok[None, :], np.stack([snap.cpu_free, snap.mem_free, snap.whole_free_gpus()]), 0)


def gang_needs(gang: Gang) -> np.ndarray:
    """[3] CPU, memory and whole GPUs of all members together."""
    return np.array([sum(m.cpu_milli for m in gang.members), sum(m.memory_mib for m in gang.members),
                     sum(m.gpus for m in gang.members)], dtype=np.int64)


def holds_every_set(fits: np.ndarray, counts: np.ndarray, nodes: np.ndarray, free: np.ndarray,
                    needs: np.ndarray) -> bool:
    """Each pod set has room in `nodes` counted alone, and the sets together fit the nodes' free
    CPU, memory and whole GPUs: rules out the hopeless, the placement decides."""
    return bool((fits[:, nodes].sum(axis=1) >= counts).all() and (free[:, nodes].sum(axis=1) >= needs).all())


def eligible_nodes(snap: Snapshot, gang: Gang, profile: Profile) -> np.ndarray:
    """[S, N] bool: nodes that pass the profile's filters for a member of each pod set."""
    sets = gang.pod_sets
    ok = np.empty((len(sets), len(snap)), dtype=bool)
    for s, ps in enumerate(sets):
        ok[s], _ = run_filters(snap, ps.request, profile.filters)
    return ok


def candidate_domains(snap: Snapshot, gang: Gang, profile: Profile | None = None) -> list[Domain]:
    """Node subsets to try for `gang`, in order: single nodes that hold it all (tightest fit first),
    then cliques, racks and zones by fewest nodes needed, then (soft only) the whole cluster.

    A hard requirement at level L stops after L. Domains whose free capacity cannot hold the gang
    (by the largest-member estimate) are left out, so an empty list means "does not fit now".
    """
    return list(iter_candidate_domains(snap, gang, profile))


def iter_candidate_domains(snap: Snapshot, gang: Gang, profile: Profile | None = None) -> Iterator[Domain]:
    """candidate_domains, level by level: a caller that stops after a few tries (gang admission
    does) never pays for the looser levels."""
    eligible = eligible_nodes(snap, gang, profile) if profile is not None else None
    fits = set_fits(snap, gang, eligible)
    fit = fits.sum(axis=0)
    want = len(gang.members)
    if int(fit.sum()) < want:
        return  # no domain holds more than every node together
    counts = set_counts(gang)
    mixed = len(counts) > 1
    if mixed:
        free, needs = free_table(snap, fits.any(axis=0)), gang_needs(gang)
    req = gang.topology
    limit = LADDER.index(req.level) if req.hard else len(LADDER) - 1

    # one node: every member on it; tightest (fewest GPUs left over) first, then node order
    whole = np.flatnonzero(fit >= want)
    if mixed:
        whole = whole[(fits[:, whole] >= counts[:, None]).all(axis=0) & (free[:, whole] >= needs[:, None]).all(axis=0)]
    if len(whole):
        leftover = snap.gpu_free[whole].sum(axis=1) - gang.gpu_milli_total
        order = whole[np.lexsort((whole, leftover))]
        yield from (Domain(TopologyLevel.NODE, snap.nodes[i].name, np.array([i]), 1) for i in order.tolist())
    if want == 1 or limit == 0:
        return

    # a hard requirement at level L holds only for tighter domains inside one L domain: labels need
    # not nest (a clique may span racks), so a tighter domain across L boundaries is skipped
    bound = snap.shape.domain_ids(req.level.value) if req.hard and req.level is not TopologyLevel.ANY else None

    for level in LADDER[1 : limit + 1]:
        if level is TopologyLevel.ANY:
            ids = np.zeros(len(snap), dtype=np.int64)
            names: tuple[str, ...] = ("*",)
        else:
            ids = snap.shape.domain_ids(level.value)
            names = snap.shape.domain_names(level.value)
        # every domain at once: nodes that fit a member, grouped by domain, most members first
        # (then node order) inside each; only domains whose sum holds the gang are looked at
        cand = np.flatnonzero((ids >= 0) & (fit > 0))
        if not len(cand):
            continue
        grouped = cand[np.lexsort((cand, -fit[cand], ids[cand]))]
        dom = ids[grouped]
        starts = np.flatnonzero(np.concatenate(([True], dom[1:] != dom[:-1])))
        sizes = np.diff(np.append(starts, len(grouped)))
        member_fit = fit[grouped]
        totals = np.add.reduceat(member_fit, starts)
        # nodes needed per domain: its best nodes, in order, until their members add up to the gang
        running = np.cumsum(member_fit)
        within = running - np.repeat(running[starts] - member_fit[starts], sizes)
        needed = np.add.reduceat((within < want).astype(np.int64), starts) + 1
        keep = np.flatnonzero(totals >= want)
        # fewest nodes first, then by name (domain ids follow the sorted names)
        keep = keep[np.lexsort((dom[starts[keep]], needed[keep]))]
        for k in keep.tolist():
            s = int(starts[k])
            order = grouped[s : s + int(sizes[k])]
            if bound is not None and level is not req.level:
                spans = np.unique(bound[order])
                if len(spans) != 1 or spans[0] < 0:
                    continue
            if mixed and not holds_every_set(fits, counts, order, free, needs):
                continue
            yield Domain(level, names[int(dom[s])], order, int(needed[k]))

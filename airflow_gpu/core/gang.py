"""Gang admission: every member of a gang is placed, or none is.

`admit` checks the team's quota (core.quota), asks core.topology for candidate node domains (one
node, then the fewest nodes in one NVLink clique, rack, zone; then anywhere when the requirement is
soft), and places the members one by one with the profile's plugins on a COPY of the snapshot, so a
gang that does not fit leaves nothing held (no partial allocation, hence no coscheduling deadlock).
When it does not fit, the decision carries a wait reason a person can act on.

Pure: the caller reserves the returned placements (Snapshot.assume) or binds them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from airflow_gpu.core.framework import FilterResult, Profile, place_pod
from airflow_gpu.core.model import Gang, Placement, PodRequest, TopologyLevel
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, QuotaVerdict, check, demand_of_placements, demand_on_product
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.topology import Domain, candidate_domains, eligible_nodes, members_per_node

# Trying every candidate domain of a big cluster would cost a full gang placement each; the
# capacity estimate behind candidate_domains makes the first one succeed almost always.
MAX_DOMAIN_ATTEMPTS = 6

BLOCKED_QUOTA = "quota"
BLOCKED_CAPACITY = "capacity"

_WHERE = {
    TopologyLevel.NODE: "on one node",
    TopologyLevel.CLIQUE: "in one NVLink clique",
    TopologyLevel.RACK: "in one rack",
    TopologyLevel.ZONE: "in one zone",
    TopologyLevel.ANY: "in the cluster",
}


@dataclass(frozen=True)
class GangDecision:
    """The outcome for one gang. admitted: `placements` holds every member; else `reason` says why
    it waits and `blocked_by` whether quota or capacity stopped it."""

    gang: Gang
    admitted: bool
    placements: tuple[Placement, ...] = ()
    reason: str = ""
    blocked_by: str = ""  # "" | BLOCKED_QUOTA | BLOCKED_CAPACITY
    borrowed: bool = False  # admitted on the cohort's idle quota (best-effort priority)
    domain: str = ""  # e.g. "clique c1 (2 nodes)"
    quota: QuotaVerdict | None = None


class _Within:
    """Filter plugin restricting a placement to a node mask (a topology domain minus reservations)."""

    name = "GangDomain"

    def __init__(self, mask: np.ndarray, reason: str):
        self.mask = mask
        self.reason = reason

    def filter(self, snap: Snapshot, pod: PodRequest) -> FilterResult:
        return FilterResult(self.mask, self.reason)


def restricted(profile: Profile, mask: np.ndarray, reason: str) -> Profile:
    """`profile` with one more filter, first: only nodes in `mask`."""
    return Profile(profile.name, (_Within(mask, reason),) + tuple(profile.filters), profile.scores,
                   profile.gpu_chooser, profile.tie_rank, profile.select)


def _place_members(snap: Snapshot, members: list[PodRequest], profile: Profile,
                   mask: np.ndarray) -> tuple[list[Placement] | None, str]:
    """All members into the nodes of `mask` on `snap` (mutated: callers pass a copy)."""
    prof = restricted(profile, mask, "node(s) outside the gang's domain")
    placed: list[Placement] = []
    for pod in members:
        placement, diagnosis = place_pod(snap, pod, prof)
        if placement is None:
            return None, f"member {pod.name} does not fit: {diagnosis.message()}"
        snap.assume(placement)
        placed.append(placement)
    return placed, ""


def _describe_domain(dom: Domain, used: int) -> str:
    if dom.level is TopologyLevel.NODE:
        return f"node {dom.name}"
    if dom.level is TopologyLevel.ANY:
        return f"cluster ({used} nodes)"
    return f"{dom.level.value} {dom.name} ({used} nodes)"


def place_gang(snap: Snapshot, gang: Gang, profile: Profile,
               exclude: np.ndarray | None = None) -> tuple[tuple[Placement, ...] | None, str, str]:
    """Placements for every member of `gang`, or None. Does not change `snap`.

    exclude: [N] bool, nodes the gang must not use (a reservation held for another gang).
    Returns (placements | None, domain description, wait reason).
    """
    if not gang.members:
        raise ValueError(f"gang {gang.name}: has no members")
    # Largest members first: they are the hardest to fit, small ones fill around them.
    members = sorted(gang.members, key=lambda m: (-m.gpu_milli_total, -m.cpu_milli, -m.memory_mib))
    base = profile if exclude is None else restricted(profile, ~exclude, "node(s) reserved for another gang")

    if len(members) == 1:
        # One pod has no topology: let the profile's scores (packing, fragmentation) pick freely.
        work = snap.copy()
        placed, why = _place_members(work, members, base, np.ones(len(snap), dtype=bool))
        if placed is None:
            return None, "", why
        return tuple(placed), f"node {placed[0].node}", ""

    domains = candidate_domains(snap, gang, base)
    last_why = ""
    attempts = 0
    for dom in domains:
        # Fewest nodes first: the best-filled nodes of the domain, then the whole domain.
        subsets = [dom.nodes[: dom.nodes_needed]]
        if dom.nodes_needed < len(dom.nodes):
            subsets.append(dom.nodes)
        for nodes in subsets:
            if attempts >= MAX_DOMAIN_ATTEMPTS:
                break
            attempts += 1
            mask = np.zeros(len(snap), dtype=bool)
            mask[nodes] = True
            placed, why = _place_members(snap.copy(), members, base, mask)
            if placed is not None:
                return tuple(placed), _describe_domain(dom, len({p.node for p in placed})), ""
            last_why = why
    return None, "", last_why or no_fit_reason(snap, gang, base)


def _demand_words(gang: Gang) -> tuple[str, int, str]:
    """(unit, how many units in all, product text) for the wait reason, from the largest member."""
    big = max(gang.members, key=lambda m: (m.gpu_milli_total, m.mig_profile is not None))
    products = "|".join(big.gpu_products) if big.gpu_products else "GPU"
    n = len(gang.members)
    if big.gpus:
        return "gpus", n * big.gpus, products
    if big.gpu_milli:
        return "share", n, f"{big.gpu_milli}-milli {products} shares"
    if big.mig_profile:
        return "mig", n, f"{big.mig_profile} MIG slices"
    return "pods", n, "pods"


def no_fit_reason(snap: Snapshot, gang: Gang, profile: Profile) -> str:
    """'needs 16 x H100 in one NVLink clique; largest free block is 8' and the like."""
    fit = members_per_node(snap, gang, eligible_nodes(snap, gang, profile))
    req = gang.topology
    level = req.level if req.hard else TopologyLevel.ANY
    if len(gang.members) == 1:
        level = TopologyLevel.NODE
    if level is TopologyLevel.NODE:
        block = int(fit.max()) if len(fit) else 0
    elif level is TopologyLevel.ANY:
        block = int(fit.sum())
    else:
        ids = snap.shape.domain_ids(level.value)
        known = ids >= 0
        block = int(np.bincount(ids[known], weights=fit[known]).max()) if known.any() else 0
    unit, total, what = _demand_words(gang)
    per = max(m.gpus for m in gang.members) if unit == "gpus" else 1
    have = min(block, len(gang.members)) * per
    if unit == "gpus":
        head = f"needs {total} GPUs {_WHERE[level]}" if what == "GPU" else f"needs {total} x {what} {_WHERE[level]}"
        if len(gang.members) > 1:
            head += f" ({len(gang.members)} pods x {per})"
        return f"{head}; {have} free" if level is TopologyLevel.ANY else f"{head}; largest free block is {have}"
    return f"needs {total} x {what} {_WHERE[level]}; room for {have}"


def accepted_products(snap: Snapshot, gang: Gang) -> list[str]:
    """Node GPU products the gang's GPU members accept, in preference order (empty list: any)."""
    out: list[str] = []
    for m in gang.members:
        for p in m.gpu_products:
            if p not in out:
                out.append(p)
    return out or list(snap.shape.products)


def _uses_gpus(gang: Gang) -> bool:
    return any(m.gpus or m.gpu_milli or m.mig_profile for m in gang.members)


def _only_products(gang: Gang, products: list[str]) -> Gang:
    members = tuple(
        replace(m, gpu_products=tuple(p for p in (m.gpu_products or products) if p in products))
        if (m.gpus or m.gpu_milli or m.mig_profile) else m
        for m in gang.members
    )
    return replace(gang, members=members)


def admit(snap: Snapshot, gang: Gang, profile: Profile, quota: QuotaBook | None = None,
          usage: QuotaUsage | None = None, exclude: np.ndarray | None = None) -> GangDecision:
    """Admit `gang` whole or not at all, within its team's quota. Changes neither snap nor usage."""
    if quota is None or not _uses_gpus(gang):
        placed, domain, why = place_gang(snap, gang, profile, exclude)
        if placed is None:
            return GangDecision(gang, False, reason=why, blocked_by=BLOCKED_CAPACITY)
        return GangDecision(gang, True, placed, domain=domain)

    usage = usage if usage is not None else QuotaUsage()
    # Quota first, per accepted product (Kueue's flavor assignment): a product the team has no
    # room on is taken out of the members' accepted products before anything is placed.
    products = accepted_products(snap, gang)
    allowed: list[str] = []
    refusal: QuotaVerdict | None = None
    for label in products:
        verdict = check(quota, usage, gang.team, demand_on_product(gang, quota.product(label), quota.weight(label)))
        if verdict.fits:
            allowed.append(label)
        elif refusal is None:
            refusal = verdict
    if not allowed:
        if refusal is None:
            refusal = QuotaVerdict(False, reason=f"no node offers a GPU product gang {gang.name} accepts")
            return GangDecision(gang, False, reason=refusal.reason, blocked_by=BLOCKED_CAPACITY, quota=refusal)
        return GangDecision(gang, False, reason=refusal.reason, blocked_by=BLOCKED_QUOTA, quota=refusal)

    # Several products may pass one by one yet not mixed; then fall back to one product at a time.
    tries = [allowed] + ([[p] for p in allowed] if len(allowed) > 1 else [])
    node_product = {n.name: n.gpu_product for n in snap.nodes}
    why = ""
    quota_refusal: QuotaVerdict | None = None
    for option in tries:
        candidate = gang if option == products else _only_products(gang, option)
        placed, domain, why = place_gang(snap, candidate, profile, exclude)
        if placed is None:
            if option is allowed:
                # Capacity, not quota, is what stops it on every allowed product together.
                break
            continue
        verdict = check(quota, usage, gang.team, demand_of_placements(placed, node_product, quota))
        if verdict.fits:
            return GangDecision(gang, True, placed, borrowed=verdict.borrowed, domain=domain, quota=verdict)
        quota_refusal = quota_refusal or verdict
    if quota_refusal is not None:
        return GangDecision(gang, False, reason=quota_refusal.reason, blocked_by=BLOCKED_QUOTA, quota=quota_refusal)
    return GangDecision(gang, False, reason=why, blocked_by=BLOCKED_CAPACITY)

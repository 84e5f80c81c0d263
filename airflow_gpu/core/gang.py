"""Gang admission: every member of a gang is placed, or none is.

`admit` checks the team's quota (core.quota), asks core.topology for candidate node domains (one
node, then the fewest nodes in one NVLink clique, rack, zone; then anywhere when the requirement is
soft), and places the members one by one with the profile's plugins on a COPY of the snapshot, so a
gang that does not fit leaves nothing held (no partial allocation, hence no coscheduling deadlock).
When it does not fit, the decision carries a wait reason a person can act on.

Pure: the caller reserves the returned placements (Snapshot.assume) or binds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from airflow_gpu.core.framework import FilterResult, Profile, place_identical, place_pod
from airflow_gpu.core.model import GPU_MILLI, Gang, Placement, PodRequest, TopologyLevel
from airflow_gpu.core.quota import (
    MAY_STOP_SEARCH,
    QuotaBook,
    QuotaUsage,
    QuotaVerdict,
    check,
    demand_of_placements,
    demand_on_product,
)
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.topology import Domain, eligible_nodes, iter_candidate_domains, members_per_node

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
    # refused, and quota had a say on these node GPU products (taken out, a pool as large as the
    # cluster, or the refusal itself): less usage there may let it in without a node gaining room
    quota_products: frozenset[str] = frozenset()


class _Within:
    """Filter plugin restricting a placement to a node mask (a topology domain minus reservations)."""

    name = "GangDomain"
    fixed = True  # a mask that placing pods does not change (framework.place_identical)

    def __init__(self, mask: np.ndarray, reason: str):
        self.mask = mask
        self.reason = reason

    def filter(self, snap: Snapshot, pod: PodRequest) -> FilterResult:
        return FilterResult(self.mask, self.reason)


def restricted(profile: Profile, mask: np.ndarray, reason: str) -> Profile:
    """`profile` with one more filter, first: only nodes in `mask`."""
    return Profile(profile.name, (_Within(mask, reason),) + tuple(profile.filters), profile.scores,
                   profile.gpu_chooser, profile.tie_rank)


def _place_members(snap: Snapshot, members: Sequence[PodRequest], profile: Profile,
                   mask: np.ndarray, explain: bool = True) -> tuple[list[Placement] | None, str]:
    """All members into the nodes of `mask`, each placed with the earlier ones held; `snap` is the
    same afterwards (the members are assumed on a trial and undone). explain=False: the wait reason
    names the member only (the per-node count of kube-scheduler's message is not built)."""
    prof = restricted(profile, mask, "node(s) outside the gang's domain")
    placed: list[Placement] = []
    last = len(members) - 1
    with snap.trial() as trial:
        k = 0
        while k <= last:
            run = _identical_run(members, k)
            # a pod set's members one after another, placed at once when the profile can say so
            # (the same placements: framework.place_identical); else, or when one does not fit, one by one
            batch = place_identical(snap, members[k:k + run], prof) if run > 1 else None
            if batch:
                if k + run <= last:  # held for the members after them (the caller holds the whole gang)
                    for placement in batch:
                        trial.assume(placement)
                placed += batch
                k += run
                continue
            pod = members[k]
            placement, diagnosis = place_pod(snap, pod, prof)
            if placement is None:
                return None, f"member {pod.name} does not fit" + (f": {diagnosis.message()}" if explain else "")
            if k < last:
                trial.assume(placement)
            placed.append(placement)
            k += 1
    return placed, ""


def _identical_run(members: Sequence[PodRequest], k: int) -> int:
    """How many members from the k-th on ask exactly what it asks (one pod set, as a rule)."""
    shape = members[k].shape
    n = k + 1
    while n < len(members) and members[n].shape == shape:
        n += 1
    return n - k


def _describe_domain(dom: Domain, used: int) -> str:
    if dom.level is TopologyLevel.NODE:
        return f"node {dom.name}"
    if dom.level is TopologyLevel.ANY:
        return f"cluster ({used} nodes)"
    return f"{dom.level.value} {dom.name} ({used} nodes)"


def place_gang(snap: Snapshot, gang: Gang, profile: Profile, exclude: np.ndarray | None = None,
               explain: bool = True) -> tuple[tuple[Placement, ...] | None, str, str]:
    """Placements for every member of `gang`, or None. Does not change `snap`.

    The GPU members go on ONE GPU product (Kueue: one flavor per pod set), tried in the order of
    `accepted_products`, unless the gang opted in to mixing (Gang.products_mixed).
    exclude: [N] bool, nodes the gang must not use (a reservation held for another gang).
    explain=False: a shorter wait reason, for a caller that shows none (same placements).
    Returns (placements | None, domain description, wait reason; with several products tried, each
    product and why it was refused).
    """
    if not gang.members:
        raise ValueError(f"gang {gang.name}: has no members")
    products = one_product_options(snap, gang)
    if len(products) <= 1:
        return _place_gang(snap, gang, profile, exclude, explain)
    if _any_product(gang):
        # no order to keep: the placement the scores choose stands when it is on one product
        # (the common case, one placement); when nothing fits on every product together, nothing
        # fits on one of them
        placed, domain, why = _place_gang(snap, gang, profile, exclude, explain)
        if placed is None:
            return placed, domain, why
        if len({snap.shape.node_product.get(p.node) for p in placed if p.gpu_shares or p.mig_profile}) <= 1:
            return placed, domain, why
    whys = []
    free = snap.whole_free_gpus()
    for label in products:
        # a product without as many free whole GPUs as the gang asks there is not worth a placement
        need = sum(m.gpus for m in gang.members if not m.gpu_products or label in m.gpu_products)
        have = int(free[snap.shape.product_mask((label,))].sum()) if need else 0
        if need > have:
            whys.append(f"{label}: needs {need} GPUs; {have} free")
            continue
        placed, domain, why = _place_gang(snap, only_products(gang, [label]), profile, exclude, explain)
        if placed is not None:
            return placed, domain, ""
        whys.append(f"{label}: {why}")
    return None, "", "; ".join(whys)


def _any_product(gang: Gang) -> bool:
    """No GPU member names a product: every product is as good (absent a platform order)."""
    return not any(ps.request.gpu_products for ps in gang.pod_sets if ps.request.uses_gpu)


def keeps_one_product(gang: Gang, book: QuotaBook | None = None) -> bool:
    """Are the gang's products tried one at a time, in order (Kueue's flavors)? Yes for several
    GPU pods (they must share one product) unless the gang opted in to mixing; for one GPU pod
    when it names several products or the platform orders them (it cannot straddle; one that
    accepts any product is left to the scores, which is cheaper on a cluster of many products)."""
    if gang.products_mixed:
        return False
    gpu = [ps for ps in gang.pod_sets if ps.request.uses_gpu]  # pod sets: a 128-pod gang is one or two
    count = sum(ps.count for ps in gpu)
    if count != 1:
        return count > 1
    return len(gpu[0].request.gpu_products) > 1 or (book is not None and bool(book.product_rank))


def one_product_options(snap: Snapshot, gang: Gang, book: QuotaBook | None = None) -> list[str]:
    """The node GPU products to try the gang on, one at a time, in order: [] or one product when
    there is nothing to choose (see keeps_one_product; one product offered). A partly bound gang
    stays on the product its bound members run on."""
    if not keeps_one_product(gang, book):
        return []
    products = [p for p in accepted_products(snap, gang, book) if p in snap.shape.products]
    if gang.pinned and len(products) > 1:
        node_product = snap.shape.node_product
        bound = {node_product.get(n) for n in gang.pinned} & set(products)
        products = [p for p in products if p in bound] or products
    return products


def _place_gang(snap: Snapshot, gang: Gang, profile: Profile, exclude: np.ndarray | None,
                explain: bool) -> tuple[tuple[Placement, ...] | None, str, str]:
    """place_gang on the products the gang's members accept as they are."""
    if gang.pinned:
        return _place_pinned(snap, gang, profile, exclude, explain)
    members = gang.largest_first
    base = profile if exclude is None else restricted(profile, ~exclude, "node(s) reserved for another gang")

    if len(members) == 1:
        # One pod has no topology: let the profile's scores (packing, fragmentation) pick freely.
        placed, why = _place_members(snap, members, base, snap.shape.every_node, explain)
        if placed is None:
            return None, "", why
        return tuple(placed), f"node {placed[0].node}", ""

    domains = iter_candidate_domains(snap, gang, base)
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
            placed, why = _place_members(snap, members, base, mask, explain)
            if placed is not None:
                return tuple(placed), _describe_domain(dom, len({p.node for p in placed})), ""
            last_why = why
        if attempts >= MAX_DOMAIN_ATTEMPTS:
            break  # the candidates are made lazily: the ones never tried are never built
    return None, "", last_why or (no_fit_reason(snap, gang, base) if explain else "no topology domain holds the gang")


def pinned_domain(snap: Snapshot, gang: Gang) -> np.ndarray:
    """[N] bool: the nodes of the topology domain (at the gang's level) where its bound members run."""
    level = gang.topology.level
    known = [snap.shape.index[n] for n in gang.pinned if n in snap.shape.index]
    mask = np.zeros(len(snap), dtype=bool)
    if level is TopologyLevel.ANY:
        mask[:] = True
    elif level is TopologyLevel.NODE:
        mask[known] = True
    else:
        ids = snap.shape.domain_ids(level.value)
        doms = {int(ids[i]) for i in known if ids[i] >= 0}
        mask = np.isin(ids, list(doms)) if doms else mask
        mask[known] = True
    return mask


def _place_pinned(snap: Snapshot, gang: Gang, profile: Profile, exclude: np.ndarray | None,
                  explain: bool) -> tuple[tuple[Placement, ...] | None, str, str]:
    """The rest of a partly bound gang: inside the domain its bound members pin; a soft requirement
    then widens to anywhere, a hard one never does."""
    where = f"the {gang.topology.level.value} of its bound members"
    inside = restricted(profile, pinned_domain(snap, gang), f"node(s) outside {where}")
    free = replace(gang, pinned=())
    placed, domain, why = place_gang(snap, free, inside, exclude, explain)
    if placed is not None:
        return placed, f"{domain}, {where}", ""
    if gang.topology.hard:
        return None, "", f"{why} (kept to {where}: the topology requirement is hard)"
    return place_gang(snap, free, profile, exclude, explain)


def _demand_words(gang: Gang) -> tuple[str, int, str, str]:
    """(unit, how many units in all, product text, per-set breakdown) for the wait reason, from the
    gang's GPU pod sets (a CPU-only launcher asks no GPU)."""
    gpu_sets = [ps for ps in gang.pod_sets if ps.request.uses_gpu] or list(gang.pod_sets)
    big = gpu_sets[0].request
    products = "|".join(big.gpu_products) if big.gpu_products else "GPU"
    n = sum(ps.count for ps in gpu_sets)
    if big.gpus:
        whole = [ps for ps in gpu_sets if ps.request.gpus]
        parts = " + ".join(f"{ps.count} pods x {ps.request.gpus}" for ps in whole)
        return "gpus", sum(ps.count * ps.request.gpus for ps in whole), products, parts
    if big.gpu_milli:
        return "share", n, f"{big.gpu_milli}-milli {products} shares", ""
    if big.mig_profile:
        return "mig", n, f"{big.mig_profile} MIG slices", ""
    return "pods", n, "pods", ""


def no_fit_reason(snap: Snapshot, gang: Gang, profile: Profile) -> str:
    """'needs 16 x H100 in one NVLink clique; largest free block is 8' and the like."""
    eligible = eligible_nodes(snap, gang, profile)
    req = gang.topology
    level = req.level if req.hard else TopologyLevel.ANY
    if len(gang.members) == 1:
        level = TopologyLevel.NODE
    unit, total, what, parts = _demand_words(gang)
    if unit == "gpus":
        # whole GPUs free on nodes that suit the GPU members, in the best domain of the level
        gpu_set = next(s for s, ps in enumerate(gang.pod_sets) if ps.request.gpus)
        per_node = np.where(eligible[gpu_set], snap.whole_free_gpus(), 0)
    else:
        per_node = members_per_node(snap, gang, eligible)
    if level is TopologyLevel.NODE:
        block = int(per_node.max()) if len(per_node) else 0
    elif level is TopologyLevel.ANY:
        block = int(per_node.sum())
    else:
        ids = snap.shape.domain_ids(level.value)
        known = ids >= 0
        block = int(np.bincount(ids[known], weights=per_node[known]).max()) if known.any() else 0
    if unit == "gpus":
        head = f"needs {total} GPUs {_WHERE[level]}" if what == "GPU" else f"needs {total} x {what} {_WHERE[level]}"
        if len(gang.members) > 1:
            head += f" ({parts})"
        have = min(block, total)
        return f"{head}; {have} free" if level is TopologyLevel.ANY else f"{head}; largest free block is {have}"
    return f"needs {total} x {what} {_WHERE[level]}; room for {min(block, total)}"


def accepted_products(snap: Snapshot, gang: Gang, book: QuotaBook | None = None) -> list[str]:
    """Node GPU products the gang's GPU members accept (none named: every product of the cluster),
    in the author's order, or in the platform's order when `book` has one (QuotaBook.product_rank:
    listed, fastest, cheapest per work)."""
    out: list[str] = []
    for m in gang.members:
        for p in m.gpu_products:
            if p not in out:
                out.append(p)
    out = out or list(snap.shape.products)
    if book is not None and book.product_rank and len(out) > 1:
        rank, last = book.product_rank, len(book.product_rank)
        out.sort(key=lambda p: rank.get(book.product(p), last))  # stable: unranked keep the author's order
    return out


def only_products(gang: Gang, products: list[str]) -> Gang:
    """GPU members restricted to `products`; a pod set that accepts none of them keeps its own
    (its quota is checked where it is placed)."""
    key = tuple(products)
    got = gang.product_variants.get(key)
    if got is not None:
        return got
    cut: dict[tuple, tuple[str, ...]] = {}  # per member shape: members of a pod set are alike

    def only(m: PodRequest) -> PodRequest:
        kept = cut.get(m.shape)
        if kept is None:
            kept = cut[m.shape] = tuple(p for p in (m.gpu_products or products) if p in products)
        return replace(m, gpu_products=kept) if m.uses_gpu and kept else m

    got = gang.product_variants[key] = replace(gang, members=tuple(only(m) for m in gang.members))
    return got


def quota_capacity(snap: Snapshot, quota: QuotaBook, product: str) -> int:
    """The cluster's GPUs of quota `product` in quota units (milli-GPU, weighted)."""
    per_label = snap.shape.derived("gpus-per-product", lambda: _gpus_per_product(snap))
    return sum(round(count * GPU_MILLI * quota.weight(label)) for label, count in per_label.items()
               if quota.product(label) == product)


def _gpus_per_product(snap: Snapshot) -> dict[str, int]:
    per_label: dict[str, int] = {}
    for n, count in zip(snap.shape.nodes, snap.shape.gpu_counts):
        if n.gpu_product:
            per_label[n.gpu_product] = per_label.get(n.gpu_product, 0) + count
    return per_label


def pool_is_capacity(snap: Snapshot, quota: QuotaBook, verdict: QuotaVerdict) -> bool:
    """A refusal by a cohort pool that holds at least the whole cluster's GPUs of that product: the pool
    is short only when the cluster is (the teams' guarantees add up to the cluster), so the refusal is
    a capacity shortage, and treating it as quota would keep a big gang from ever being head of line."""
    key = verdict.pool_key
    return (not verdict.fits and key is not None and key[1] is None
            and verdict.pool_size >= quota_capacity(snap, quota, key[0]) > 0)


class QuotaAnswers:
    """admit's quota check before placement, per (team, ask), for one state of one usage: a cycle
    over a long backlog asks it for thousands of gangs of a few asks between two admissions. The
    answer depends on nothing else (the team's book, the usage, the cluster's products), so it is
    kept until the usage changes (QuotaUsage.version) or another usage or cluster is asked about."""

    def __init__(self) -> None:
        self._state: tuple = (None, -1, None, None)  # the objects themselves: no id is reused meanwhile
        self._answers: dict[tuple, _ProductRoom] = {}

    def room(self, snap: Snapshot, quota: QuotaBook, usage: QuotaUsage, gang: Gang) -> _ProductRoom:
        was_usage, was_version, was_shape, was_quota = self._state
        if usage is not was_usage or usage.version != was_version or snap.shape is not was_shape \
                or quota is not was_quota:
            self._state, self._answers = (usage, usage.version, snap.shape, quota), {}
        key = (gang.team, gang.ask)
        got = self._answers.get(key)
        if got is None:
            got = self._answers[key] = _product_room(snap, quota, usage, gang)
        return got


@dataclass(frozen=True)
class _ProductRoom:
    products: list[str]  # the node GPU products the gang accepts, in preference order
    allowed: list[str]  # those quota lets it be placed on
    refusal: QuotaVerdict | None  # the first product's refusal
    lent: QuotaVerdict | None  # within the guarantee, short as others borrowed it: said in the reason
    limited: frozenset[str]  # products quota took out, or allowed only as a pool as large as the cluster
    refused: tuple[tuple[str, str], ...] = ()  # (product, quota's reason) for each product taken out


def _product_room(snap: Snapshot, quota: QuotaBook, usage: QuotaUsage, gang: Gang) -> _ProductRoom:
    """Quota first, per accepted product (Kueue's flavor assignment): a product the team has no
    room on is taken out of the members' accepted products before anything is placed."""
    products = accepted_products(snap, gang, quota)
    allowed: list[str] = []
    refused: list[tuple[str, str]] = []
    refusal: QuotaVerdict | None = None
    lent: QuotaVerdict | None = None
    limited: set[str] = set()
    for label in products:
        verdict = check(quota, usage, gang.team,
                        demand_on_product(gang, quota.product(label), quota.weight(label), label))
        if verdict.fits or pool_is_capacity(snap, quota, verdict):
            # a pool as large as the cluster refuses only what capacity refuses: placement decides
            # (a capacity wait: the gang may become head of line and hold a reservation)
            allowed.append(label)
            if not verdict.fits:
                limited.add(label)
            lent = lent or (verdict if verdict.reclaimable else None)
        else:
            limited.add(label)
            refused.append((label, verdict.reason))
            if refusal is None:
                refusal = verdict
    return _ProductRoom(products, allowed, refusal, lent, frozenset(limited), tuple(refused))


def admit(snap: Snapshot, gang: Gang, profile: Profile, quota: QuotaBook | None = None,
          usage: QuotaUsage | None = None, exclude: np.ndarray | None = None,
          answers: QuotaAnswers | None = None, explain: bool = True) -> GangDecision:
    """Admit `gang` whole or not at all, within its team's quota; with `gang.min_member` below its
    size, at least that many members in member order when all do not fit (coscheduling's minMember).
    Changes neither snap nor usage. `answers`: quota checks kept across calls (same decisions).
    explain=False: shorter capacity reasons (place_gang), same decisions."""
    whole = _admit(snap, gang, profile, quota, usage, exclude, answers, explain)
    if whole.admitted or not 0 < gang.min_member < len(gang.members):
        return whole
    part = _admit(snap, replace(gang, members=gang.members[: gang.min_member], min_member=0), profile, quota,
                  usage, exclude, answers, explain)
    return replace(part, gang=gang) if part.admitted else whole


def _admit(snap: Snapshot, gang: Gang, profile: Profile, quota: QuotaBook | None,
           usage: QuotaUsage | None, exclude: np.ndarray | None, answers: QuotaAnswers | None,
           explain: bool = True) -> GangDecision:
    if quota is None or not gang.uses_gpu:
        placed, domain, why = place_gang(snap, gang, profile, exclude, explain)
        if placed is None:
            return GangDecision(gang, False, reason=why, blocked_by=BLOCKED_CAPACITY)
        return GangDecision(gang, True, placed, domain=domain)

    usage = usage if usage is not None else QuotaUsage()
    room = answers.room(snap, quota, usage, gang) if answers is not None else _product_room(snap, quota, usage, gang)
    products, allowed, refusal, lent, limited = room.products, room.allowed, room.refusal, room.lent, room.limited
    one_product = keeps_one_product(gang, quota)
    several = len(products) > 1 and one_product
    if not allowed:
        if refusal is None:
            refusal = QuotaVerdict(False, reason=f"no node offers a GPU product gang {gang.name} accepts")
            return GangDecision(gang, False, reason=refusal.reason, blocked_by=BLOCKED_CAPACITY, quota=refusal)
        reason = _per_product(room.refused) if several else refusal.reason
        return GangDecision(gang, False, reason=reason, blocked_by=BLOCKED_QUOTA, quota=refusal,
                            quota_products=frozenset(products))

    if not one_product:
        # Opted in (or one pod): several products may pass one by one yet not mixed; then one at a time.
        tries = [allowed] + ([[p] for p in allowed] if len(allowed) > 1 else [])
    elif allowed == products and _any_product(gang) and not quota.product_rank:
        tries = [allowed]  # place_gang keeps it to one product, whichever suits the scores
    else:
        tries = [[p] for p in allowed]  # one product for every GPU member, in order (Kueue's flavors)
    tq = quota.team(gang.team)
    stop_when_borrowing = tq is None or tq.when_can_borrow == MAY_STOP_SEARCH
    node_product = snap.shape.node_product
    why = ""
    quota_refusal: QuotaVerdict | None = None
    borrowing_fit: GangDecision | None = None
    tried: list[tuple[str, str]] = list(room.refused)
    for option in tries:
        label = option[0] if len(option) == 1 else "any product"
        candidate = gang if option == products else only_products(gang, option)
        placed, domain, why = place_gang(snap, candidate, profile, exclude, explain)
        if placed is None:
            if not one_product and option is allowed:
                # Capacity, not quota, is what stops it on every allowed product together.
                break
            tried.append((label, why))
            continue
        verdict = check(quota, usage, gang.team, demand_of_placements(placed, node_product, quota))
        if verdict.fits:
            decision = GangDecision(gang, True, placed, borrowed=verdict.borrowed, domain=domain, quota=verdict)
            if not verdict.borrowed or stop_when_borrowing:
                return decision
            # whenCanBorrow: TryNextFlavor: a later product may fit without borrowing
            borrowing_fit = borrowing_fit or decision
            tried.append((label, "fits only by borrowing"))
            continue
        quota_refusal = quota_refusal or verdict
        tried.append((label, verdict.reason))
    if borrowing_fit is not None:
        return borrowing_fit
    if several and len(tried) > 1:
        why = _per_product(tried)
    if quota_refusal is not None:
        return GangDecision(gang, False, reason=why if several else quota_refusal.reason, blocked_by=BLOCKED_QUOTA,
                            quota=quota_refusal, quota_products=frozenset(products))
    if lent is not None:
        why = f"{lent.reason}; {why}"
    return GangDecision(gang, False, reason=why, blocked_by=BLOCKED_CAPACITY, quota=lent,
                        quota_products=frozenset(limited))


def _per_product(tried: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """'h100-80gb: <why>; a100-80gb: <why>': each product tried and why it was refused."""
    return "; ".join(f"{label}: {why}" for label, why in tried)

"""Snapshot: the cluster's nodes and their FREE capacity, as numpy arrays so that filters and scores
run over all nodes at once (a per-node Python loop is too slow for 8,000 pods x 1,213 nodes).

Static facts (names, capacities, labels, taints, topology) live in `ClusterShape`, shared by every
copy; only the free-capacity arrays and the placement map are copied, so `copy()` is cheap and a gang
or preemption planner can try "what if" on a copy and throw it away.

Units as in model.py: CPU millicores, memory MiB, GPU milli (1000 = a whole GPU). Pure, no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from airflow_gpu.core.model import GPU_MILLI, Node, Placement, PodRequest


# Every change to a node's free capacity gets a new number from one process-wide counter, so equal
# version numbers mean equal node state even across snapshot copies: score caches key on it.
_VERSIONS = itertools.count(1)


# Kinds of GPU pods counted per node (Snapshot.kind_counts): a share of one GPU, or k whole GPUs.
GPU_KINDS = ("share", "1-gpu", "2-gpu", "3-gpu", "4-gpu", "5-gpu", "6-gpu", "7-gpu", "8-gpu", "more-gpu")


def gpu_kind(gpu_shares) -> int | None:
    """Index in GPU_KINDS of a placement's GPU shares (None: no GPU)."""
    if not gpu_shares:
        return None
    if len(gpu_shares) == 1 and gpu_shares[0][1] < GPU_MILLI:
        return 0
    return min(len(gpu_shares), len(GPU_KINDS) - 1)


class Placements(MutableMapping):
    """pod name -> Placement, with a copy that costs the changes since the last flatten, not the
    pods: a what-if copy of a 50,000-pod snapshot (preemption planning makes hundreds) shares one
    read-only base dict and keeps only what it added and removed on top."""

    __slots__ = ("_base", "_added", "_removed")

    def __init__(self, base: dict | None = None, added: dict | None = None, removed: set | None = None):
        self._base: dict = base if base is not None else {}  # never written once shared
        self._added: dict = added if added is not None else {}
        self._removed: set = removed if removed is not None else set()

    def __contains__(self, name) -> bool:
        return name in self._added or (name in self._base and name not in self._removed)

    def __getitem__(self, name):
        hit = self._added.get(name)
        if hit is not None:
            return hit
        if name in self._removed:
            raise KeyError(name)
        return self._base[name]

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __setitem__(self, name, placement) -> None:
        self._added[name] = placement

    def __delitem__(self, name) -> None:
        found = self._added.pop(name, None) is not None
        if name in self._base and name not in self._removed:
            self._removed.add(name)
            found = True
        if not found:
            raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self._added
        for name in self._base:
            if name not in self._removed and name not in self._added:
                yield name

    def __len__(self) -> int:
        shadowed = sum(1 for k in self._added if k in self._base and k not in self._removed)
        return len(self._base) - len(self._removed) + len(self._added) - shadowed

    def copy(self) -> Placements:
        if len(self._added) + len(self._removed) > max(64, len(self._base) // 8):
            # flatten (same contents): this and later copies share the fresh base
            self._base, self._added, self._removed = dict(self), {}, set()
        return Placements(self._base, dict(self._added), set(self._removed))


@dataclass(frozen=True)
class PlacementRows:
    """A gang's placements with node indices (ClusterShape.rows), on the nodes the shape knows:
    preemption planning reads every candidate's placements each cycle (tens of thousands of pods at
    scale), and resolving node names pod by pod each time cost more than the planning itself."""

    spots: tuple[tuple[int, tuple[tuple[int, int], ...], int, int], ...]  # (node, gpu shares, cpu, memory)
    nodes: tuple[int, ...]  # the spots' nodes
    flat_spots: tuple[int, ...]  # node, cpu, memory of every spot, one after the other (numpy reads it at once)
    flat_shares: tuple[int, ...]  # node, GPU index, milli of every GPU share of every spot


class OverCommitError(ValueError):
    """assume() would take more than a node has free, or forget() releases something never assumed."""


@dataclass(eq=False)
class ClusterShape:
    """What does not change while pods come and go. Built once per node list, shared by copies."""

    nodes: tuple[Node, ...]
    index: dict[str, int]
    gpu_count: np.ndarray  # [N] int
    gpu_exists: np.ndarray  # [N, Gmax] bool: padding columns are False
    cpu_cap: np.ndarray  # [N] int64
    mem_cap: np.ndarray  # [N] int64
    products: tuple[str, ...]  # distinct GPU products; product_id indexes it (-1: no GPU product)
    product_id: np.ndarray  # [N] int
    mig_profiles: tuple[str, ...]  # distinct MIG profiles over all nodes
    mig_cap: np.ndarray  # [N, P] int
    _mask_cache: dict = field(default_factory=dict)
    _rows: dict = field(default_factory=dict)  # gang name -> (its placements tuple, PlacementRows)

    @classmethod
    def from_nodes(cls, nodes) -> ClusterShape:
        nodes = tuple(nodes)
        index: dict[str, int] = {}
        for i, node in enumerate(nodes):
            if node.name in index:
                raise ValueError(f"node name {node.name!r} appears twice; node names must be unique")
            if node.gpu_count < 0 or node.cpu_milli < 0 or node.memory_mib < 0:
                raise ValueError(f"node {node.name}: capacities must not be negative")
            index[node.name] = i
        n = len(nodes)
        gpu_count = np.array([nd.gpu_count for nd in nodes], dtype=np.int64).reshape(n)
        gmax = max(1, int(gpu_count.max()) if n else 1)
        gpu_exists = np.arange(gmax)[None, :] < gpu_count[:, None]
        products = tuple(sorted({nd.gpu_product for nd in nodes if nd.gpu_product}))
        pid = {p: k for k, p in enumerate(products)}
        product_id = np.array([pid.get(nd.gpu_product, -1) for nd in nodes], dtype=np.int64).reshape(n)
        profiles = tuple(sorted({p for nd in nodes for p, _ in nd.mig_slices}))
        mig_cap = np.zeros((n, len(profiles)), dtype=np.int64)
        for i, nd in enumerate(nodes):
            for p, count in nd.mig_slices:
                mig_cap[i, profiles.index(p)] += count
        return cls(
            nodes=nodes,
            index=index,
            gpu_count=gpu_count,
            gpu_exists=gpu_exists,
            cpu_cap=np.array([nd.cpu_milli for nd in nodes], dtype=np.int64).reshape(n),
            mem_cap=np.array([nd.memory_mib for nd in nodes], dtype=np.int64).reshape(n),
            products=products,
            product_id=product_id,
            mig_profiles=profiles,
            mig_cap=mig_cap,
        )

    def derived(self, key, build):
        """A fact of the node list (labels, taints, products, capacity; never free capacity) that
        callers outside the shape compute once per distinct key: the cache lives beside the shape."""
        got = self._mask_cache.get(key)
        if got is None:
            got = self._mask_cache[key] = build()
        return got

    def cached_mask(self, key, build) -> np.ndarray:
        """A static per-node mask (labels, taints, products) computed once per distinct key."""
        mask = self._mask_cache.get(key)
        if mask is None:
            mask = build()
            mask.setflags(write=False)
            self._mask_cache[key] = mask
        return mask

    def product_mask(self, products: tuple[str, ...]) -> np.ndarray:
        """Nodes whose GPU product is one of `products` (empty: every node)."""
        if not products:
            return self.cached_mask(("product", ()), lambda: np.ones(len(self.nodes), dtype=bool))
        ids = [self.products.index(p) for p in products if p in self.products]
        return self.cached_mask(("product", products), lambda: np.isin(self.product_id, ids))

    def rows(self, placements: Sequence[Placement], gang: str | None = None) -> PlacementRows:
        """`placements` as node-index rows; placements on nodes the shape does not know are left out.
        With `gang` (a running gang's name) they are cached under it while they are the same tuple
        (a RunningGang's placements are immutable; a gang that moved has a new tuple)."""
        if gang is not None:
            hit = self._rows.get(gang)
            if hit is not None and hit[0] is placements:
                return hit[1]
        index = self.index
        spots = tuple((index[p.node], p.gpu_shares, p.cpu_milli, p.memory_mib) for p in placements if p.node in index)
        rows = PlacementRows(spots, tuple(s[0] for s in spots), tuple(x for s in spots for x in (s[0], s[2], s[3])),
                             tuple(x for s in spots for g, milli in s[1] for x in (s[0], g, milli)))
        if gang is not None and isinstance(placements, tuple):
            if len(self._rows) >= 250_000:  # gangs come and go: start again rather than grow without bound
                self._rows.clear()
            self._rows[gang] = (placements, rows)
        return rows

    def rows_of(self, gangs) -> list[PlacementRows]:
        """rows() of each running gang's placements (RunningGang), in order, cached by gang name:
        preemption asks it of every candidate (thousands), so the cache is read inline."""
        get, out = self._rows.get, []
        for g in gangs:
            placements, name = g.placements, g.gang.name
            hit = get(name)
            out.append(hit[1] if hit is not None and hit[0] is placements else self.rows(placements, name))
        return out

    @cached_property
    def every_node(self) -> np.ndarray:
        """[N] all True, read only: the one mask of filters that reject nothing (run_filters skips it)."""
        mask = np.ones(len(self.nodes), dtype=bool)
        mask.setflags(write=False)
        return mask

    @cached_property
    def node_product(self) -> dict[str, str | None]:
        """Node name -> its GPU product label: the one map every quota computation uses."""
        return {n.name: n.gpu_product for n in self.nodes}

    @cached_property
    def gpu_counts(self) -> list[int]:
        """gpu_count as Python ints (per-pod bookkeeping reads one at a time)."""
        return self.gpu_count.tolist()

    @cached_property
    def total_gpu_milli(self) -> int:
        return int(self.gpu_count.sum()) * GPU_MILLI

    def domain_ids(self, level: str) -> np.ndarray:
        """[N] int id of each node's topology domain at `level` (clique | rack | zone); -1 = unknown."""

        def build():
            values = [getattr(nd, level) for nd in self.nodes]
            names = {v: k for k, v in enumerate(sorted({v for v in values if v}))}
            return np.array([names[v] if v else -1 for v in values], dtype=np.int64).reshape(len(values))

        return self.cached_mask(("domain", level), build)

    def domain_names(self, level: str) -> tuple[str, ...]:
        """The names of the domains at `level`, indexed by domain_ids(level)."""
        key = ("domain-names", level)
        names = self._mask_cache.get(key)
        if names is None:
            names = self._mask_cache[key] = tuple(sorted({getattr(nd, level) for nd in self.nodes} - {""}))
        return names


class Snapshot:
    """Nodes plus their free capacity and the placements holding the rest.

    Arrays (read them, change them only through assume/forget):
      gpu_free [N, Gmax] milli free per GPU (0 in padding columns), cpu_free [N], mem_free [N],
      mig_free [N, P] free slices per profile (profiles in shape.mig_profiles).
    """

    __slots__ = ("shape", "gpu_free", "cpu_free", "mem_free", "mig_free", "placements", "version", "kind_counts",
                 "_whole", "_widest")

    def __init__(
        self, shape: ClusterShape, gpu_free, cpu_free, mem_free, mig_free, placements, version=None, kind_counts=None,
        whole=None, widest=None,
    ):
        self.shape = shape
        # kind_counts[i, k]: GPU pods of kind GPU_KINDS[k] placed on node i (GPU-clustering policies)
        self.kind_counts: np.ndarray = (
            np.zeros((len(shape.nodes), len(GPU_KINDS)), dtype=np.int64) if kind_counts is None else kind_counts
        )
        # version[i] changes whenever node i's free capacity changes (see _VERSIONS)
        self.version: np.ndarray = (
            np.fromiter(itertools.islice(_VERSIONS, len(shape.nodes)), dtype=np.int64, count=len(shape.nodes))
            if version is None
            else version
        )
        self.gpu_free: np.ndarray = gpu_free
        self.cpu_free: np.ndarray = cpu_free
        self.mem_free: np.ndarray = mem_free
        self.mig_free: np.ndarray = mig_free
        self.placements: Placements = placements if isinstance(placements, Placements) else Placements(dict(placements))
        # per node, kept up to date by assume/forget (every filter and room estimate reads them, and
        # reducing [N, G] each time cost more than the rest of a placement at 5,000 nodes)
        self._whole: np.ndarray = (gpu_free == GPU_MILLI).sum(axis=1) if whole is None else whole
        self._widest: np.ndarray = (
            (gpu_free.max(axis=1) if gpu_free.shape[1] else np.zeros(len(gpu_free), dtype=np.int64))
            if widest is None else widest)

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_nodes(cls, nodes, placements=()) -> Snapshot:
        """An empty cluster of `nodes`, then every placement in `placements` assumed (validated)."""
        shape = ClusterShape.from_nodes(nodes)
        snap = cls(
            shape,
            np.where(shape.gpu_exists, GPU_MILLI, 0).astype(np.int64),
            shape.cpu_cap.copy(),
            shape.mem_cap.copy(),
            shape.mig_cap.copy(),
            {},
        )
        for placement in placements:
            snap.assume(placement)
        return snap

    def copy(self) -> Snapshot:
        """Independent free capacity and placements; the static shape is shared."""
        return Snapshot(
            self.shape,
            self.gpu_free.copy(),
            self.cpu_free.copy(),
            self.mem_free.copy(),
            self.mig_free.copy(),
            self.placements.copy(),
            self.version.copy(),
            self.kind_counts.copy(),
            self._whole.copy(),
            self._widest.copy(),
        )

    # --- views ----------------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.shape.nodes

    def __len__(self) -> int:
        return len(self.shape.nodes)

    def node_index(self, name: str) -> int:
        try:
            return self.shape.index[name]
        except KeyError:
            raise KeyError(f"node {name!r} is not in the snapshot") from None

    def whole_free_gpus(self) -> np.ndarray:
        """[N] number of GPUs entirely free on each node (what a whole-GPU pod can take). Read only:
        the snapshot keeps it up to date."""
        return self._whole

    def max_gpu_free(self) -> np.ndarray:
        """[N] the largest free share on any one GPU of each node (what a shared pod can take). Read only."""
        return self._widest

    def _gpu_row_changed(self, i: int) -> None:
        row = self.gpu_free[i].tolist()
        self._whole[i] = row.count(GPU_MILLI)
        self._widest[i] = max(row, default=0)

    def allocated_gpu_milli(self) -> int:
        return self.shape.total_gpu_milli - int(self.gpu_free.sum())

    def gpu_allocation_ratio(self) -> float:
        total = self.shape.total_gpu_milli
        return self.allocated_gpu_milli() / total if total else 0.0

    # --- feasibility (resources only; labels/taints/products are filter plugins) ---------------
    def gpu_fit_mask(self, pod: PodRequest, nodes: Sequence[int] | None = None) -> np.ndarray:
        """[N] bool (or one per index of `nodes`): the node has the GPU form the pod asks for (whole
        GPUs, a share, a MIG slice)."""
        at = slice(None) if nodes is None else nodes
        if pod.mig_profile is not None:
            if pod.mig_profile not in self.shape.mig_profiles:
                return np.zeros(len(self) if nodes is None else len(nodes), dtype=bool)
            return self.mig_free[at, self.shape.mig_profiles.index(pod.mig_profile)] >= 1
        if pod.gpus > 0:
            return self.whole_free_gpus()[at] >= pod.gpus
        if pod.gpu_milli > 0:
            return self.max_gpu_free()[at] >= pod.gpu_milli
        return np.ones(len(self) if nodes is None else len(nodes), dtype=bool)

    def fit_mask(self, pod: PodRequest, nodes: Sequence[int] | None = None) -> np.ndarray:
        """[N] bool (or one per index of `nodes`): CPU, memory and the GPU form all fit in the free
        capacity."""
        at = slice(None) if nodes is None else nodes
        return ((self.cpu_free[at] >= pod.cpu_milli) & (self.mem_free[at] >= pod.memory_mib)
                & self.gpu_fit_mask(pod, nodes))

    def default_gpu_choice(self, pod: PodRequest, node: int) -> tuple[tuple[int, int], ...]:
        """GPU indices for `pod` on node `node` when no plugin chose: the lowest-index whole GPUs,
        or for a share the GPU with the least free milli that still fits (best fit)."""
        free = self.gpu_free[node]
        if pod.gpus > 0:
            idx = np.flatnonzero(free == GPU_MILLI)[: pod.gpus]
            if len(idx) < pod.gpus:
                raise OverCommitError(f"pod {pod.name}: node {self.nodes[node].name} lacks {pod.gpus} free GPUs")
            return tuple((int(i), GPU_MILLI) for i in idx)
        if pod.gpu_milli > 0:
            ok = np.flatnonzero(free >= pod.gpu_milli)
            if not len(ok):
                raise OverCommitError(
                    f"pod {pod.name}: no GPU on node {self.nodes[node].name} has {pod.gpu_milli} milli free"
                )
            best = ok[np.argmin(free[ok])]
            return ((int(best), pod.gpu_milli),)
        return ()

    def placement_for(self, pod: PodRequest, node: int, gpu_shares=None) -> Placement:
        """The Placement of `pod` on node index `node` (GPU shares default to default_gpu_choice)."""
        if gpu_shares is None:
            gpu_shares = self.default_gpu_choice(pod, node)
        return Placement(
            pod=pod.name,
            node=self.nodes[node].name,
            gpu_shares=tuple(gpu_shares),
            mig_profile=pod.mig_profile,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
        )

    # --- what-ifs without a copy ------------------------------------------------------------------
    @contextmanager
    def trial(self) -> Iterator[Trial]:
        """Assume placements for a what-if and undo them on exit (an undo log, kube-scheduler's
        assume/forget): a gang tried domain after domain costs its own pods, not a copy of every
        node's arrays per try. Versions are restored with the capacity, so score caches keyed on
        them stay valid for the nodes the what-if touched."""
        trial = Trial(self)
        try:
            yield trial
        finally:
            trial.undo()

    # --- reserve / release ----------------------------------------------------------------------
    def assume(self, placement: Placement) -> None:
        """Reserve what `placement` takes; raises OverCommitError (and changes nothing) if any part
        of it is not free."""
        if placement.pod in self.placements:
            raise OverCommitError(f"pod {placement.pod} is already placed on {self.placements[placement.pod].node}")
        # plain Python on one node's row: a cycle assumes every running pod (50,000 at scale), and
        # building numpy arrays per pod cost more than the arithmetic
        i, need, mig = self._parse(placement)
        row = self.gpu_free[i]
        problems = self._refusals(placement, i, need, mig, row.tolist() if need else (), self.cpu_free[i],
                                  self.mem_free[i])
        if problems:
            raise OverCommitError(f"pod {placement.pod} on node {placement.node}: " + "; ".join(problems))
        for g, m in need.items():
            row[g] -= m
        if need:
            self._gpu_row_changed(i)
        self.cpu_free[i] -= placement.cpu_milli
        self.mem_free[i] -= placement.memory_mib
        if mig is not None:
            self.mig_free[i, mig] -= 1
        if (kind := gpu_kind(placement.gpu_shares)) is not None:
            self.kind_counts[i, kind] += 1
        self.version[i] = next(_VERSIONS)
        self.placements[placement.pod] = placement

    def forget(self, placement: Placement | str) -> Placement:
        """Release a placement assumed before (by Placement or pod name); returns it."""
        name = placement if isinstance(placement, str) else placement.pod
        held = self.placements.get(name)
        if held is None:
            raise OverCommitError(f"pod {name} is not placed in this snapshot; nothing to release")
        if not isinstance(placement, str) and placement is not held and placement != held:
            raise OverCommitError(f"pod {name}: release of {placement} does not match the held {held}")
        # validated when it was assumed: no second parse (what-ifs forget hundreds of thousands of pods)
        i = self.shape.index[held.node]
        row = self.gpu_free[i]
        for g, m in held.gpu_shares:
            row[g] += m
        if held.gpu_shares:
            self._gpu_row_changed(i)
        mig = None if held.mig_profile is None else self.shape.mig_profiles.index(held.mig_profile)
        self.cpu_free[i] += held.cpu_milli
        self.mem_free[i] += held.memory_mib
        if mig is not None:
            self.mig_free[i, mig] += 1
        if (kind := gpu_kind(held.gpu_shares)) is not None:
            self.kind_counts[i, kind] -= 1
        self.version[i] = next(_VERSIONS)
        del self.placements[name]
        return held

    # --- many at once: what-ifs hold and release whole gangs (a 128-GPU gang of one-GPU members is
    # 128 pods on 16 nodes); the same result as one call per pod, the node arrays written once per node
    def assume_many(self, placements: Iterable[Placement]) -> list[Placement]:
        """assume() each placement in order; those that do not fit then (or whose pod is placed
        already) are returned and nothing of them is taken."""
        placements = placements if isinstance(placements, (list, tuple)) else list(placements)
        if len(placements) == 1:  # one pod: the plain call is cheaper than the bookkeeping
            try:
                self.assume(placements[0])
                return []
            except OverCommitError:
                return [placements[0]]
        rows: dict[int, list] = {}  # node -> [GPU row, CPU free, memory free, changed], as the placements so far leave it
        failed: list[Placement] = []
        kinds: dict[tuple[int, int], int] = {}
        placed = self.placements
        for p in placements:
            if p.pod in placed:
                failed.append(p)
                continue
            try:
                i, need, mig = self._parse(p)
            except OverCommitError:
                failed.append(p)
                continue
            row = rows.get(i)
            if row is None:
                row = rows[i] = [self.gpu_free[i].tolist(), int(self.cpu_free[i]), int(self.mem_free[i]), False]
            free = row[0]
            if self._refusals(p, i, need, mig, free, row[1], row[2]):
                failed.append(p)
                continue
            for g, m in need.items():
                free[g] -= m
            row[1] -= p.cpu_milli
            row[2] -= p.memory_mib
            row[3] = True
            if mig is not None:
                self.mig_free[i, mig] -= 1
            if (kind := gpu_kind(p.gpu_shares)) is not None:
                kinds[i, kind] = kinds.get((i, kind), 0) + 1
            placed[p.pod] = p
        self._write_rows(rows, kinds)
        return failed

    def forget_many(self, names: Iterable[str]) -> None:
        """forget() each pod (by name); every one must be placed (checked before anything changes)."""
        names = list(names)
        placed = self.placements
        helds = [placed.get(name) for name in names]
        if None in helds or len(set(names)) != len(names):
            missing = sorted({n for n, h in zip(names, helds) if h is None}) or sorted(
                n for n in set(names) if names.count(n) > 1)
            raise OverCommitError(f"pods {missing} are not placed in this snapshot (or named twice); nothing released")
        self._forget(helds)

    def forget_placed(self, placements: Iterable[Placement]) -> set[int]:
        """Forget the pods of `placements` that are placed here (by name: a pod the snapshot does not
        hold frees nothing, as when a gang is released that was held in part); the nodes touched."""
        placed = self.placements
        helds, seen = [], set()
        for p in placements:
            held = placed.get(p.pod)
            if held is not None and p.pod not in seen:
                seen.add(p.pod)
                helds.append(held)
        return self._forget(helds)

    def _forget(self, helds: Sequence[Placement]) -> set[int]:
        if len(helds) == 1:  # one pod: the plain call is cheaper than the bookkeeping
            self.forget(helds[0].pod)
            return {self.shape.index[helds[0].node]}
        rows: dict[int, list] = {}
        kinds: dict[tuple[int, int], int] = {}
        index, placed = self.shape.index, self.placements
        for held in helds:
            i = index[held.node]
            row = rows.get(i)
            if row is None:
                row = rows[i] = [self.gpu_free[i].tolist(), int(self.cpu_free[i]), int(self.mem_free[i]), True]
            free = row[0]
            for g, m in held.gpu_shares:
                free[g] += m
            row[1] += held.cpu_milli
            row[2] += held.memory_mib
            if held.mig_profile is not None:
                self.mig_free[i, self.shape.mig_profiles.index(held.mig_profile)] += 1
            if (kind := gpu_kind(held.gpu_shares)) is not None:
                kinds[i, kind] = kinds.get((i, kind), 0) - 1
            del placed[held.pod]
        self._write_rows(rows, kinds)
        return set(rows)

    def _refusals(self, placement: Placement, i: int, need: dict[int, int], mig: int | None, free, cpu_free,
                  mem_free) -> list[str]:
        """Why `placement` (parsed: node i, GPU milli needed per index, MIG profile index) does not fit
        the free capacity given (node i's GPU row, CPU, memory); [] when it fits."""
        if (placement.cpu_milli <= cpu_free and placement.memory_mib <= mem_free
                and all(m <= free[g] for g, m in need.items()) and (mig is None or self.mig_free[i, mig] >= 1)):
            return []  # the common case, without building the words
        problems = []
        if need:
            bad = sorted(g for g, m in need.items() if m > free[g])
            if bad:
                problems.append(f"GPU {bad} asks {[need[g] for g in bad]} milli, free {[free[g] for g in bad]}")
        if placement.cpu_milli > cpu_free:
            problems.append(f"cpu_milli {placement.cpu_milli} > free {int(cpu_free)}")
        if placement.memory_mib > mem_free:
            problems.append(f"memory_mib {placement.memory_mib} > free {int(mem_free)}")
        if mig is not None and self.mig_free[i, mig] < 1:
            problems.append(f"no free MIG slice {placement.mig_profile}")
        return problems

    def _write_rows(self, rows: dict[int, list], kinds: dict[tuple[int, int], int]) -> None:
        for i, (free, cpu, mem, changed) in rows.items():
            if not changed:
                continue
            self.gpu_free[i] = free
            self._whole[i] = free.count(GPU_MILLI)
            self._widest[i] = max(free, default=0)
            self.cpu_free[i] = cpu
            self.mem_free[i] = mem
            self.version[i] = next(_VERSIONS)
        for (i, kind), n in kinds.items():
            self.kind_counts[i, kind] += n

    def _parse(self, placement: Placement) -> tuple[int, dict[int, int], int | None]:
        """(node index, milli per GPU index, MIG profile index or None), validated."""
        i = self.node_index(placement.node)
        count = self.shape.gpu_counts[i]
        need: dict[int, int] = {}
        for g, milli in placement.gpu_shares:
            if not 0 <= g < count:
                raise OverCommitError(
                    f"pod {placement.pod}: GPU index out of range on node {placement.node} ({count} GPUs)"
                )
            if not 0 < milli <= GPU_MILLI:
                raise OverCommitError(f"pod {placement.pod}: each GPU share must be 1..{GPU_MILLI} milli")
            need[g] = need.get(g, 0) + milli
        if placement.cpu_milli < 0 or placement.memory_mib < 0:
            raise OverCommitError(f"pod {placement.pod}: cpu_milli and memory_mib must not be negative")
        mig = None
        if placement.mig_profile is not None:
            if placement.mig_profile not in self.shape.mig_profiles:
                raise OverCommitError(
                    f"pod {placement.pod}: MIG profile {placement.mig_profile!r} exists on no node"
                )
            mig = self.shape.mig_profiles.index(placement.mig_profile)
        return i, need, mig


class Trial:
    """The placements a what-if assumed on a snapshot, undone last first (Snapshot.trial)."""

    __slots__ = ("snap", "_log")

    def __init__(self, snap: Snapshot):
        self.snap = snap
        self._log: list[tuple[str, int, int]] = []  # (pod, node index, node version before)

    def assume(self, placement: Placement) -> None:
        i = self.snap.node_index(placement.node)
        before = int(self.snap.version[i])
        self.snap.assume(placement)
        self._log.append((placement.pod, i, before))

    def undo(self) -> None:
        while self._log:
            pod, i, before = self._log.pop()
            self.snap.forget(pod)
            self.snap.version[i] = before

"""Fragmentation Gradient Descent (FGD, USENIX ATC'23): place a pod where it raises the expected GPU
fragmentation of the node least, under the typical pod distribution learnt from the workload.

A node's fragmentation for one typical pod t is all its free GPU milli when t cannot run there (GPU
type, GPU count, CPU), else the free milli on GPUs too small for t. The node's fragmentation is the
frequency-weighted sum over typical pods (CPU-only typical pods count all free GPU milli, as in the
artifact). Score = int(sigmoid(-(after - before) / 1000) * 100), integer like the artifact, so ties
are common and resolved by the profile's tie order.

Speed: a pod's scores depend only on its shape and the node's state, so scores are cached per shape
and recomputed only for nodes whose Snapshot.version changed since (one node per placement).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from airflow_gpu.core.model import GPU_MILLI, PodRequest
from airflow_gpu.core.snapshot import ClusterShape, Snapshot

MAX_NODE_SCORE = 100


def pod_shape(pod: PodRequest) -> tuple[int, int, int, tuple[str, ...]]:
    """(cpu_milli, milli per GPU, GPU count, accepted products): what placement scores depend on."""
    if pod.gpus:
        return (pod.cpu_milli, GPU_MILLI, pod.gpus, pod.gpu_products)
    if pod.gpu_milli:
        return (pod.cpu_milli, pod.gpu_milli, 1, pod.gpu_products)
    return (pod.cpu_milli, 0, 0, pod.gpu_products)


@dataclass(frozen=True)
class TypicalPods:
    """The workload's most common pod shapes covering `coverage` of pods, with their frequencies."""

    cpu: np.ndarray  # [T]
    milli: np.ndarray  # [T] per GPU (0: CPU-only)
    count: np.ndarray  # [T] GPUs
    products: tuple[tuple[str, ...], ...]  # [T] accepted products (empty: any)
    freq: np.ndarray  # [T], sums to 1

    @classmethod
    def from_pods(cls, pods, coverage: float = 0.95) -> TypicalPods:
        """The artifact's GetTypicalPods (CPU pods included, popularity threshold 95 %, step 1)."""
        counts = Counter(pod_shape(p) for p in pods)
        if not counts:
            raise ValueError("typical pods: the workload is empty; FGD needs pods to learn from")
        # most frequent first; equal counts: larger (cpu, milli, count, products) first, as Go's
        # sort.Reverse over the artifact's Less orders them
        ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2], "|".join(kv[0][3])),
                         reverse=True)
        total = sum(counts.values())
        chosen, cum = [], 0
        for shape, n in ordered:
            if cum >= coverage * total:
                break
            chosen.append((shape, n))
            cum += n
        return cls(
            cpu=np.array([s[0] for s, _ in chosen], dtype=np.int64),
            milli=np.array([s[1] for s, _ in chosen], dtype=np.int64),
            count=np.array([s[2] for s, _ in chosen], dtype=np.int64),
            products=tuple(s[3] for s, _ in chosen),
            freq=np.array([n / cum for _, n in chosen], dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.freq)


# A GPU-pod class at least this frequent is "plentiful": a hole it fits is sure to be filled by it
# before the workload ends; rarer classes fill a proportional share of the holes they fit.
PLENTIFUL = 0.03


def final_waste_table(typical: TypicalPods, plentiful: float = PLENTIFUL) -> np.ndarray:
    """V[x], x = 0..1000: the expected GPU milli a GPU with x milli free still has free when the
    workload is over (a lookahead over the fills to come, not just the next pod).

    V[x] = (1 - q) x + q E[V[x - m] | m fits], over the typical GPU pods' per-GPU milli m, with
    q = min(1, F(x) / plentiful) and F(x) the frequency of GPU pods that fit in x. FGD's one-step
    measure calls a 530-milli hole useful (a 470 fits); V knows the 470 leaves 60 milli for good,
    and that a 190-milli hole mostly stays empty because the pods that fit it are rare."""
    gpu = typical.milli > 0
    milli, freq = typical.milli[gpu], typical.freq[gpu]
    table = np.arange(GPU_MILLI + 1, dtype=np.float64)
    if not len(milli):
        return table
    freq = freq / freq.sum()
    for x in range(GPU_MILLI + 1):
        fits = milli <= x
        fit_freq = freq[fits].sum()
        if fit_freq > 0:
            q = min(1.0, fit_freq / plentiful)
            table[x] = (1.0 - q) * x + q * (freq[fits] * table[x - milli[fits]]).sum() / fit_freq
    return table


class FragModel:
    """Vectorised node fragmentation for one cluster shape and one typical-pod distribution."""

    KNOWN = 200_000  # node states remembered by frag (then forgotten all at once)

    def __init__(
        self,
        shape: ClusterShape,
        typical: TypicalPods,
        stranding_weight: float = 0.0,
        waste_weight: float = 0.0,
        plentiful: float = PLENTIFUL,
    ):
        self.shape = shape
        self.typical = typical
        self.stranding_weight = stranding_weight
        self.waste_weight = waste_weight
        self.final_waste = final_waste_table(typical, plentiful) if waste_weight else None
        gpu = typical.milli * typical.count
        # CPU the workload's GPU pods bring per GPU milli (frequency-weighted)
        self.cpu_per_gpu_milli = (
            float((typical.freq * typical.cpu)[gpu > 0].sum() / (typical.freq * gpu)[gpu > 0].sum())
            if (gpu > 0).any()
            else 0.0
        )
        n = len(shape.nodes)
        # access[i, t]: typical pod t may run on node i (GPU product); CPU-only types never "fit" GPUs
        access = np.ones((n, len(typical)), dtype=bool)
        for t, products in enumerate(typical.products):
            if products:
                access[:, t] = shape.product_mask(products)
        access[:, typical.milli == 0] = False
        access &= (shape.gpu_count > 0)[:, None]
        self.access = access
        self.levels, self.level_of = np.unique(typical.milli, return_inverse=True)  # distinct milli sizes
        # per free milli v (0..1000) and size level m: (v >= level m) << 32 | v when it holds, else 0;
        # summed over a node's GPUs: how many GPUs hold level m (high half) and their free milli (low
        # half), in one gather and one sum instead of a [K, M, G] comparison reduced twice
        milli = np.arange(GPU_MILLI + 1, dtype=np.int64)[:, None]
        self.gpu_levels = np.where(milli >= self.levels[None, :], (1 << _HALF) + milli, 0)  # [1001, M]
        # a node's fragmentation depends on its free GPUs, free CPU and which typical pods it may
        # take: nodes with equal access rows share answers, and node states recur (what-ifs undo,
        # releases restore), so answers are kept per (access class, GPUs, CPU)
        _, self.access_class = np.unique(access, axis=0, return_inverse=True)
        self.access_class = self.access_class.ravel().tolist()
        self._known: dict[tuple, float] = {}

    def level_sums(self, free: np.ndarray) -> np.ndarray:
        """[K, M] packed per size level: GPUs big enough (<< 32) | their free milli (free [K, G] in 0..1000)."""
        return self.gpu_levels[free].sum(axis=1)

    def frag(self, free: np.ndarray, cpu: np.ndarray, nodes: np.ndarray, sums: np.ndarray | None = None) -> np.ndarray:
        """Fragmentation (GPU milli) of K node states: free [K, G], cpu [K], node index [K]; `sums`:
        their level_sums when the caller has them (exact integers: the result is the same).
        States seen before are answered from memory; the rest are worked out together."""
        known = self._known
        cls = self.access_class
        keys = [(cls[n], row.tobytes(), c) for n, row, c in zip(nodes.tolist(), free, cpu.tolist())]
        got = [known.get(k) for k in keys]
        missing = [i for i, v in enumerate(got) if v is None]
        if missing:
            if len(missing) < len(keys):
                idx = np.array(missing)
                fresh = self._frag(free[idx], cpu[idx], nodes[idx], None if sums is None else sums[idx])
            else:
                fresh = self._frag(free, cpu, nodes, sums)
            if len(known) > self.KNOWN:
                known.clear()
            for i, v in zip(missing, fresh.tolist()):
                known[keys[i]] = got[i] = v
        return np.array(got, dtype=np.float64)

    def _frag(self, free: np.ndarray, cpu: np.ndarray, nodes: np.ndarray, sums: np.ndarray | None = None) -> np.ndarray:
        t = self.typical
        total = free.sum(axis=1)
        if sums is None:
            sums = self.level_sums(free)
        cnt = (sums >> _HALF)[:, self.level_of]  # [K, T] GPUs big enough for t
        small = (total[:, None] - (sums & _LOW))[:, self.level_of]  # [K, T] free milli on GPUs too small for t
        ok = self.access[nodes] & (cnt >= t.count[None, :]) & (cpu[:, None] >= t.cpu[None, :])
        frag = np.where(ok, small, total[:, None]) @ t.freq
        if self.stranding_weight and self.cpu_per_gpu_milli:
            frag = frag + self.stranding_weight * self._stranded(total, cpu)
        if self.final_waste is not None:
            frag = frag + self.waste_weight * self.final_waste[free].sum(axis=1)
        return frag

    def stranded(self, free: np.ndarray, cpu: np.ndarray) -> np.ndarray:
        """GPU milli the node's free CPU cannot feed at the workload's CPU-per-GPU ratio: the
        fragmentation FGD misses, because it asks whether ONE typical pod fits, not how many do."""
        return self._stranded(free.sum(axis=1), cpu)

    def _stranded(self, total: np.ndarray, cpu: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, total - np.maximum(cpu, 0) / self.cpu_per_gpu_milli)


_HALF = 32  # FragModel.gpu_levels: the count of GPUs in the high half, their milli in the low one
_LOW = (1 << _HALF) - 1


def _score(delta: np.ndarray, divisor: float = 1000.0) -> np.ndarray:
    """int(sigmoid(-delta/divisor) * 100), delta = fragmentation after - before (GPU milli)."""
    return np.floor(MAX_NODE_SCORE / (1.0 + np.exp(delta / divisor))).astype(np.int64)


class FGDScore:
    """Score plugin and GPU chooser: the artifact's FGDScore with its per-GPU choice for shares.

    Options beyond the artifact (all off by default, i.e. the published FGD):
    stranding_weight: add FragModel.stranded (CPU-bound GPU milli) to the fragmentation;
    waste_weight: add the GPUs' expected final waste (final_waste_table), a lookahead over fills;
    divisor: the sigmoid's scale (the artifact: 1000 milli);
    exact_gpu_choice: pick the share's GPU by the exact fragmentation, not the integer score.
    """

    name = "FGD"
    whole_gpus_lowest_first = True  # choose_gpus: as default_gpu_choice for whole GPUs

    def __init__(
        self,
        typical: TypicalPods | None,
        stranding_weight: float = 0.0,
        divisor: float = 1000.0,
        exact_gpu_choice: bool = False,
        waste_weight: float = 0.0,
    ):
        # typical None: learn it online from the pods this plugin is asked to place (a live
        # scheduler has no trace); relearnt whenever the pods seen grew by a tenth
        self.typical = typical
        self._learning = typical is None
        self._seen: dict[str, PodRequest] = {}
        self._learnt_at = 0
        self.stranding_weight = stranding_weight
        self.divisor = divisor
        self.exact_gpu_choice = exact_gpu_choice
        self.waste_weight = waste_weight
        self._model: FragModel | None = None
        self._before: tuple[np.ndarray, np.ndarray] | None = None  # (frag [N], version [N])
        self._cache: dict = {}  # shape -> (score [N], gpu [N], version [N])

    def _learn(self, pod: PodRequest) -> None:
        if pod.name not in self._seen:
            if len(self._seen) >= 100_000:  # bounded memory for a long-running scheduler
                self._seen.clear()
                self._learnt_at = 0
            self._seen[pod.name] = pod
        if len(self._seen) >= max(1, int(self._learnt_at * 1.1)):
            self.typical = TypicalPods.from_pods(self._seen.values())
            self._learnt_at = len(self._seen)
            self._model = None  # new distribution: drop the model and every cached score

    def _bind(self, snap: Snapshot) -> FragModel:
        if self._model is None or self._model.shape is not snap.shape:
            self._model = FragModel(snap.shape, self.typical, self.stranding_weight, self.waste_weight)
            n = len(snap)
            self._before = (np.zeros(n), np.full(n, -1, dtype=np.int64))
            self._cache = {}
        return self._model

    def node_frag(self, snap: Snapshot) -> np.ndarray:
        """[N] current fragmentation of every node (cached by node version)."""
        model = self._bind(snap)
        frag, ver = self._before
        stale = np.flatnonzero(ver != snap.version)
        if len(stale):
            frag[stale] = model.frag(snap.gpu_free[stale], snap.cpu_free[stale], stale)
            ver[stale] = snap.version[stale]
        return frag

    def _entry(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray):
        if self._learning:
            self._learn(pod)
        model = self._bind(snap)
        key = pod_shape(pod)
        entry = self._cache.get(key)
        if entry is None:
            n = len(snap)
            entry = (np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))
            self._cache[key] = entry
        score, gpu, ver = entry
        if 4 * len(nodes) < len(ver):  # a few nodes (the chosen one, a gang's domain): gather those
            stale = nodes[ver[nodes] != snap.version[nodes]]
        else:  # most of the cluster: one comparison, one gather
            stale = nodes[(ver != snap.version)[nodes]]
        if len(stale):
            before = self.node_frag(snap)[stale]
            free = snap.gpu_free[stale]
            cpu_after = snap.cpu_free[stale] - pod.cpu_milli
            if pod.gpu_milli:  # a share: try every GPU it fits on, keep the best (first on ties)
                k, g = free.shape
                fits = free >= pod.gpu_milli
                after = np.repeat(free[:, None, :], g, axis=1)  # [K, G(choice), G]
                after[:, np.arange(g), np.arange(g)] -= pod.gpu_milli
                # level sums of every choice from the node's: the chosen GPU's entry swapped (exact;
                # a choice that does not fit is never picked, its row only keeps the batch's shape)
                levels = model.gpu_levels
                sums = (model.level_sums(free)[:, None, :] - levels[free]
                        + levels[np.maximum(free - pod.gpu_milli, 0)]).reshape(k * g, -1)
                frag_after = model.frag(after.reshape(k * g, g), np.repeat(cpu_after, g), np.repeat(stale, g), sums)
                delta = frag_after.reshape(k, g) - before[:, None]
                s = np.where(fits, _score(delta, self.divisor), np.iinfo(np.int64).min)
                score[stale] = s.max(axis=1)
                if self.exact_gpu_choice:
                    gpu[stale] = np.where(fits, delta, np.inf).argmin(axis=1)
                else:
                    gpu[stale] = s.argmax(axis=1)
            else:
                after = free
                if pod.gpus:  # whole GPUs: any fully free ones (fragmentation ignores which)
                    whole = free == GPU_MILLI
                    take = whole & (np.cumsum(whole, axis=1) <= pod.gpus)
                    after = np.where(take, 0, free)
                score[stale] = _score(model.frag(after, cpu_after, stale) - before, self.divisor)
            ver[stale] = snap.version[stale]
        return score, gpu

    def score(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        return self._entry(snap, pod, nodes)[0][nodes]

    def score_run(self, snap: Snapshot, pod: PodRequest, nodes: np.ndarray, depth: int) -> np.ndarray | None:
        """[len(nodes), depth]: the score of one more `pod` on each node with m = 0..depth-1 of them
        placed there already (lowest-index whole GPUs first, as default_gpu_choice and choose_gpus
        place them): what `score` says member after member of a pod set, at once. Whole-GPU pods
        only, and not while learning (each member scored would be learnt); None otherwise."""
        if self._learning or pod.gpus <= 0 or pod.gpu_milli or pod.mig_profile is not None:
            return None
        out = np.empty((len(nodes), depth), dtype=np.int64)
        out[:, 0] = self.score(snap, pod, nodes)  # m = 0 from the per-version cache, as `score`
        if depth == 1:
            return out
        free = snap.gpu_free[nodes]
        whole = free == GPU_MILLI
        m = np.arange(depth + 1)
        # after m pods: the first m x gpus whole GPUs taken; states m = 0..depth
        taken = whole[:, None, :] & (np.cumsum(whole, axis=1)[:, None, :] <= (m * pod.gpus)[None, :, None])
        rows = np.where(taken, 0, free[:, None, :]).astype(free.dtype, copy=False)
        cpu = snap.cpu_free[nodes][:, None] - m[None, :] * pod.cpu_milli
        frag = self._bind(snap).frag(rows.reshape(-1, free.shape[1]), cpu.reshape(-1),
                                     np.repeat(nodes, depth + 1)).reshape(len(nodes), depth + 1)
        out[:, 1:] = _score(frag[:, 2:] - frag[:, 1:-1], self.divisor)
        return out

    def choose_gpus(self, snap: Snapshot, pod: PodRequest, node: int) -> tuple[tuple[int, int], ...]:
        if pod.gpu_milli:
            _, gpu = self._entry(snap, pod, np.array([node]))
            return ((int(gpu[node]), pod.gpu_milli),)
        return snap.default_gpu_choice(pod, node)

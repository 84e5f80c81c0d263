"""An upper bound on the GPU any placement could allocate for an arrived pod multiset (inflation mode).

A mixed-integer program over pod types x node types, solved with HiGHS (scipy.optimize.milp):
x[p, n] = how many pods of type p go to nodes of type n (integer), maximise the GPU milli placed.
A type is everything placement depends on: a pod's (CPU, memory, whole GPUs or per-GPU milli,
accepted GPU models), a node's (CPU, memory, GPU count, model).

Every constraint below holds for every real placement (summed over the nodes of a type), so the
optimum is at least what any placement, online or offline, can allocate: a true upper bound.
1. Each pod individually fits one node of its type: GPU model, CPU, memory, GPU count (whole GPUs)
   or one GPU (a share); incompatible (p, n) pairs have no variable.
2. Pods of a type placed <= pods of that type arrived (a pod may fail: it is simply not counted).
3. Per node type, summed: CPU, memory, GPU milli (whole pods x 1000 + shares) within capacity.
4. Per-GPU share packing, as size-class cuts: a GPU holds at most j shares larger than 1000/(j+1)
   milli, and none on a GPU a whole-GPU pod took, so per node type
   sum(shares > 1000/(j+1)) + j x (whole GPUs taken) <= j x GPUs, for j = 1..SIZE_CLASSES.
5. Per-node CPU and memory, as size-class cuts: a node holds at most j pods using more than 1/(j+1)
   of its CPU (or memory), so those pods number at most j x nodes of the type.
What the relaxation drops, and why the bound can sit above the true optimum: the split of a node
type's summed CPU / memory / GPU capacity into its individual nodes (beyond the cuts in 5), and the
exact bin packing of shares into GPUs (beyond the cuts in 4). The LP relaxation is solved first: when
it already reaches the cluster's capacity there is nothing tighter to prove. Otherwise the integer
program; if HiGHS stops at its time limit the value is its proven dual bound, still an upper bound.
CPU-only pods allocate no GPU; leaving them out only loosens the bound, so they are left out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from airflow_gpu.core.model import GPU_MILLI, Node, PodRequest

SIZE_CLASSES = 4  # j = 1..4 in the cuts above: shares > 500, > 333, > 250, > 200 milli
TIME_LIMIT_S = 30.0


@dataclass(frozen=True)
class AllocationBound:
    gpu_milli: int  # the bound, GPU milli
    total_gpu_milli: int
    method: str  # "lp": the LP relaxation already reaches the capacity (nothing tighter to prove);
    # "milp": the integer program solved; "milp-time-limit": HiGHS's proven dual bound at its limit
    pod_types: int
    node_types: int
    seconds: float

    @property
    def pct(self) -> float:
        return 100.0 * self.gpu_milli / self.total_gpu_milli if self.total_gpu_milli else 0.0

    @property
    def unallocated_gpus(self) -> float:
        return (self.total_gpu_milli - self.gpu_milli) / GPU_MILLI


def _pod_key(p: PodRequest) -> tuple:
    return (p.cpu_milli, p.memory_mib, p.gpus, p.gpu_milli, tuple(sorted(p.gpu_products)))


def _node_key(n: Node) -> tuple:
    return (n.cpu_milli, n.memory_mib, n.gpu_count, n.gpu_product)


def allocation_bound(nodes, pods, time_limit: float = TIME_LIMIT_S) -> AllocationBound:
    """The most GPU milli any placement of `pods` (each placed at most once) on `nodes` could take."""
    import time

    from scipy.optimize import LinearConstraint, milp
    from scipy.sparse import coo_array

    start = time.perf_counter()
    for p in pods:
        if p.mig_profile is not None:
            raise ValueError(f"allocation bound: pod {p.name} asks a MIG slice; the bound models gpus/gpu_milli only")
    demand = Counter(_pod_key(p) for p in pods if p.gpus or p.gpu_milli)
    supply = Counter(_node_key(n) for n in nodes if n.gpu_count)
    ptypes, ntypes = list(demand), list(supply)
    total = sum(n.gpu_count for n in nodes) * GPU_MILLI
    # variables: one per compatible (pod type, node type) pair
    pairs = []
    for a, (cpu, mem, gpus, milli, products) in enumerate(ptypes):
        for b, (ncpu, nmem, ngpu, model) in enumerate(ntypes):
            if products and model not in products:
                continue
            if cpu > ncpu or mem > nmem or max(gpus, 1) > ngpu:
                continue
            pairs.append((a, b))
    if not pairs:
        return AllocationBound(0, total, "lp", len(ptypes), len(ntypes), time.perf_counter() - start)
    pa = np.array([a for a, _ in pairs])
    nb = np.array([b for _, b in pairs])
    p_cpu = np.array([t[0] for t in ptypes], dtype=float)[pa]
    p_mem = np.array([t[1] for t in ptypes], dtype=float)[pa]
    p_whole = np.array([t[2] for t in ptypes], dtype=float)[pa]
    p_share = np.array([t[3] if not t[2] else 0 for t in ptypes], dtype=float)[pa]
    value = p_whole * GPU_MILLI + p_share
    count = np.array([supply[t] for t in ntypes], dtype=float)
    n_cpu = np.array([t[0] for t in ntypes], dtype=float)
    n_mem = np.array([t[1] for t in ntypes], dtype=float)
    n_gpu = np.array([t[2] for t in ntypes], dtype=float)

    rows, cols, vals, upper = [], [], [], []
    var = np.arange(len(pairs))

    def add(row_of_var, coef, ub):
        """One constraint per node type (row_of_var = its node type) or per pod type."""
        keep = coef != 0
        base = len(upper)
        rows.append(base + row_of_var[keep])
        cols.append(var[keep])
        vals.append(coef[keep])
        upper.extend(ub)

    add(pa, np.ones(len(pairs)), [float(demand[t]) for t in ptypes])  # 2
    add(nb, p_cpu, count * n_cpu)  # 3
    add(nb, p_mem, count * n_mem)
    add(nb, value, count * n_gpu * GPU_MILLI)
    for j in range(1, SIZE_CLASSES + 1):
        big_share = (p_share > GPU_MILLI / (j + 1)).astype(float)  # 4
        add(nb, big_share + j * p_whole, j * count * n_gpu)
        add(nb, (p_cpu > n_cpu[nb] / (j + 1)).astype(float), j * count)  # 5
        add(nb, (p_mem > n_mem[nb] / (j + 1)).astype(float), j * count)
    matrix = coo_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(upper), len(pairs))
    ).tocsr()
    common = dict(
        c=-value,
        constraints=LinearConstraint(matrix, -np.inf, np.array(upper)),
        bounds=(0, np.array([float(demand[ptypes[a]]) for a in pa])),
    )
    lp = milp(**common, options={"time_limit": time_limit, "disp": False})
    if lp.status != 0:
        raise RuntimeError(f"allocation bound: HiGHS failed on the LP relaxation ({lp.status}: {lp.message})")
    bound, method = -lp.fun, "lp"
    if bound < total - 0.5:
        res = milp(**common, integrality=np.ones(len(pairs)),
                   options={"time_limit": time_limit, "disp": False, "mip_rel_gap": 1e-6})
        dual = getattr(res, "mip_dual_bound", None)
        if res.status not in (0, 1) or dual is None or not np.isfinite(dual):
            raise RuntimeError(f"allocation bound: HiGHS found no proven bound ({res.status}: {res.message})")
        # the proven dual bound, not the incumbent: "optimal" stops within mip_rel_gap, and only
        # the dual bound is certain to be >= the optimum
        bound, method = min(bound, -dual), "milp" if res.status == 0 else "milp-time-limit"
    return AllocationBound(
        gpu_milli=int(min(total, np.floor(bound + 1e-6))),
        total_gpu_milli=total,
        method=method,
        pod_types=len(ptypes),
        node_types=len(ntypes),
        seconds=time.perf_counter() - start,
    )

"""Inflation mode: the FGD artifact's allocation experiment on the same core/ placement code.

Method (the artifact's Simulate with shufflePod and workloadTuningConfig, seeds 42..51):
1. typical pods are learnt from the whole trace (before tuning);
2. the trace pods, sorted by name, are shuffled with the seed;
3. tuning appends pods sampled with replacement from the trace until the summed GPU request would
   pass ratio x cluster GPU capacity. Quirk kept on purpose: the stop test adds the candidate's
   per-GPU milli while the running total adds milli x GPU count (so a multi-GPU pod can overshoot);
4. nodes get a seeded random order that breaks score ties (consistent first fit among equals);
   (the seed feeds numpy, not Go's math/rand: per-seed sequences differ from the artifact's, the
   distribution over seeds is the same)
5. pods are placed one by one, never removed; a pod that fits nowhere fails and is skipped.
   Beyond the artifact, only as an experiment (hold > 0, core/hold.py; the scheduler does not hold
   placements by default, so the default is 0): a share that strands capacity stays provisional for
   at most hold_seconds, and a pod that fits nowhere may take the room of held pods of smaller GPU
   demand; a displaced pod is placed again where it fits, else it fails. Such a result names the
   experiment (InflationResult.experiment).
   The method has no clock: pod k of the sequence arrives at k / arrival_rate seconds (the CLI uses
   the trace's mean arrival rate, trace_arrival_rate: openb default 8,152 pods in 149 days, one per
   1,583 s), which is what a hold of hold_seconds means here.
The curve records allocated GPU milli against arrived (attempted) GPU milli, both over capacity.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from airflow_gpu.core.framework import place_pod
from airflow_gpu.core.hold import PlacementHold, experiment_label
from airflow_gpu.core.model import GPU_MILLI, Node, Placement, PodRequest
from airflow_gpu.core.plugins.fgd import TypicalPods
from airflow_gpu.core.policies import make_profile
from airflow_gpu.core.snapshot import Snapshot

DEFAULT_RATIO = 1.3


@dataclass
class InflationResult:
    policy: str
    seed: int
    ratio: float
    total_gpu_milli: int
    arrived: np.ndarray  # [P] cumulative arrived GPU milli after each pod
    allocated: np.ndarray  # [P] allocated GPU milli after each pod
    failed_pods: list[str]
    placements: list[Placement]
    seconds: float
    pods: list[PodRequest] = field(repr=False, default_factory=list)
    hold: float = 0.0  # budget of held placements (fraction of GPU capacity; 0: none, as the scheduler)
    displaced: int = 0  # held pods that gave their room to a larger pod and then fit nowhere
    hold_seconds: float = math.inf  # the longest a pod stayed held (with hold > 0)
    arrival_rate: float | None = None  # pods per second: pod k arrived at k / arrival_rate

    @property
    def experiment(self) -> str | None:
        """What this run did that the scheduler does not (None: the scheduler's own placement)."""
        return experiment_label(self.hold, self.hold_seconds) if self.hold else None

    @property
    def gpu_allocation_pct(self) -> float:
        return 100.0 * float(self.allocated[-1]) / self.total_gpu_milli if len(self.allocated) else 0.0

    @property
    def unallocated_gpus(self) -> float:
        return (self.total_gpu_milli - float(self.allocated[-1] if len(self.allocated) else 0)) / GPU_MILLI

    def allocation_at(self, arrived_pct: float) -> float:
        """Allocation (%) after the last pod whose arrival keeps demand <= arrived_pct of capacity."""
        limit = arrived_pct / 100.0 * self.total_gpu_milli
        k = int(np.searchsorted(self.arrived, limit, side="right")) - 1
        return 100.0 * float(self.allocated[k]) / self.total_gpu_milli if k >= 0 else 0.0

    def curve(self, step_pct: float = 0.5) -> list[list[float]]:
        """[[arrived_pct, allocated_pct], ...]: one point per `step_pct` of arrived demand, plus the end."""
        arrived = 100.0 * self.arrived / self.total_gpu_milli
        allocated = 100.0 * self.allocated / self.total_gpu_milli
        out, next_mark = [], 0.0
        for a, b in zip(arrived.tolist(), allocated.tolist()):
            if a >= next_mark:
                out.append([round(a, 3), round(b, 3)])
                next_mark = (int(a / step_pct) + 1) * step_pct
        if len(arrived) and (not out or out[-1][0] != round(arrived[-1], 3)):
            out.append([round(float(arrived[-1]), 3), round(float(allocated[-1]), 3)])
        return out


def inflate(pods: list[PodRequest], nodes: list[Node], ratio: float, rng: np.random.Generator) -> list[PodRequest]:
    """The arrival sequence: shuffled trace pods, then tuning pods sampled until ratio x capacity."""
    ordered = sorted(pods, key=lambda p: p.name)
    order = rng.permutation(len(ordered))
    seq = [ordered[i] for i in order]
    capacity = sum(n.gpu_count for n in nodes) * GPU_MILLI
    target = ratio * capacity
    total = sum(p.gpu_milli_total for p in ordered)
    if ratio <= 0 or total == target:
        return seq
    if total > target:  # the artifact's tuneDownPods: drop random pods until under the target
        while total > target and seq:
            victim = seq.pop(int(rng.integers(len(seq))))
            total -= victim.gpu_milli_total
        return seq
    i = 0
    while True:
        src = ordered[int(rng.integers(len(ordered)))]
        per_gpu = GPU_MILLI if src.gpus else src.gpu_milli  # the stop test's per-GPU milli (quirk)
        if total + per_gpu > target:
            break
        total += src.gpu_milli_total
        seq.append(_renamed(src, f"{src.name}-tuned-{i}"))
        i += 1
    return seq


def trace_arrival_rate(creation_times: list[int | None], scale: int = 1) -> float | None:
    """Pods per second over the trace's creation times (x `scale` for a scaled trace: as many copies
    in the same span), or None without two distinct times."""
    times = [t for t in creation_times if t is not None]
    if len(times) < 2 or max(times) == min(times):
        return None
    return len(times) * scale / (max(times) - min(times))


def scaled(nodes: list[Node], pods: list[PodRequest], factor: int) -> tuple[list[Node], list[PodRequest]]:
    """The node list and the trace pods each repeated `factor` times (copies renamed `<name>-x<k>`;
    copy 0 keeps its names): a cluster `factor` times larger with the same node and pod mix, for the
    simulator at scale (issue 16). factor 1 returns the lists unchanged."""
    if factor < 1:
        raise ValueError(f"scale: the factor must be a whole number >= 1, got {factor}")
    if factor == 1:
        return list(nodes), list(pods)
    out_nodes = [n if k == 0 else replace(n, name=f"{n.name}-x{k}") for k in range(factor) for n in nodes]
    out_pods = [p if k == 0 else _renamed(p, f"{p.name}-x{k}") for k in range(factor) for p in pods]
    return out_nodes, out_pods


def _renamed(pod: PodRequest, name: str) -> PodRequest:
    return PodRequest(
        name=name,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpus=pod.gpus,
        gpu_milli=pod.gpu_milli,
        mig_profile=pod.mig_profile,
        gpu_products=pod.gpu_products,
        node_selector=pod.node_selector,
        tolerations=pod.tolerations,
        capacity_types=pod.capacity_types,
    )


def run_inflation(
    nodes: list[Node],
    pods: list[PodRequest],
    policy: str,
    seed: int,
    ratio: float = DEFAULT_RATIO,
    progress=None,
    hold: float = 0.0,
    hold_seconds: float = math.inf,
    arrival_rate: float | None = None,
) -> InflationResult:
    """One inflation run. `progress(done, total)` is called now and then (for a progress bar).
    hold: the experiment of held placements (core/hold.py), its budget as a fraction of GPU capacity:
    shares that strand capacity stay provisional and a pod that fits nowhere may displace them;
    0 (default) = off, as the scheduler places (and the artifact's method). hold_seconds: the
    longest a pod stays held, pod k arriving at k / arrival_rate s (needed unless unbounded)."""
    if not pods:
        raise ValueError("inflation: the pod list is empty")
    if hold and not math.isinf(hold_seconds) and not (arrival_rate and arrival_rate > 0):
        raise ValueError(f"inflation: a hold of at most {hold_seconds:g} s needs arrival_rate > 0 (pods per "
                         f"second, e.g. the trace's: trace_arrival_rate), got {arrival_rate}")
    start = time.perf_counter()
    # one stream each for the arrival sequence, the node tie order and the policy (random), so a
    # run at a smaller ratio is exactly the first part of a run at a larger one
    seq_rng, tie_rng, policy_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    typical = TypicalPods.from_pods(pods)
    seq = inflate(pods, nodes, ratio, seq_rng)
    snap = Snapshot.from_nodes(sorted(nodes, key=lambda n: n.name))
    tie_rank = tie_rng.permutation(len(snap))
    profile = make_profile(policy, typical=typical, rng=policy_rng, tie_rank=tie_rank, prefer_products=False)
    arrived = np.zeros(len(seq), dtype=np.int64)
    allocated = np.zeros(len(seq), dtype=np.int64)
    failed: list[str] = []
    placed: dict[str, Placement] = {}
    held = PlacementHold(typical, snap.shape.total_gpu_milli, hold, hold_seconds) if hold else None
    displaced = 0
    got = come = 0
    for k, pod in enumerate(seq):
        come += pod.gpu_milli_total
        now = k / arrival_rate if arrival_rate else float(k)  # unbounded hold: only the order matters
        if held is not None:
            held.expire(now)
        placement, _ = place_pod(snap, pod, profile)
        if placement is not None:
            snap.assume(placement)
            placed[pod.name] = placement
            got += pod.gpu_milli_total
            if held is not None:
                held.offer(snap, pod, placement, now)
        elif held is not None and (room := held.make_room(snap, pod, profile, now)) is not None:
            placed[pod.name] = room.placement
            got += pod.gpu_milli_total
            for again in room.moved:
                placed[again.pod] = again
            for gone in room.displaced:  # held, and now fits nowhere: it fails as if it never fit
                del placed[gone.name]
                failed.append(gone.name)
                got -= gone.gpu_milli_total
            displaced += len(room.displaced)
        else:
            failed.append(pod.name)
        arrived[k] = come
        allocated[k] = got
        if progress is not None and (k % 200 == 0 or k == len(seq) - 1):
            progress(k + 1, len(seq))
    return InflationResult(
        policy=policy,
        seed=seed,
        ratio=ratio,
        total_gpu_milli=snap.shape.total_gpu_milli,
        arrived=arrived,
        allocated=allocated,
        failed_pods=failed,
        placements=list(placed.values()),
        seconds=time.perf_counter() - start,
        pods=seq,
        hold=hold,
        displaced=displaced,
        hold_seconds=hold_seconds,
        arrival_rate=arrival_rate,
    )

"""Gang decision time on a 1,000-node snapshot (target: a 64-pod gang in <= 50 ms).

Cluster: 1,000 nodes x 8 GPUs (half H100, half A100), NVLink cliques of 16 nodes, racks of 32, zones
of 250, about 60 % of the GPUs held by running gangs of 1..8 GPUs. Side by side in one run:
- `admit` of 64-pod gangs (all or nothing, topology domains) in several shapes;
- the same 64 pods placed one by one with `place_pod` + `assume`, as a pod-at-a-time scheduler would
  (no all-or-nothing, no topology): the floor a gang decision is compared against;
- `plan_preemption` for a 64-pod production gang on a full cluster of lower-priority gangs;
- one `schedule_cycle` over 100 pending gangs;
- k independent heads of line (teams each preempting their own lower-priority gangs): cycles and
  time until every one has its plan (one plan per cycle; the next cycle sees the plan held).
Median (and min) of repeated runs; seconds move on a shared machine, the ratios less.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from airflow_gpu.core.framework import place_pod
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.gang import admit
from airflow_gpu.core.model import Gang, Node, PodRequest, RunningGang, TopologyLevel, TopologyRequirement
from airflow_gpu.core.policies import DEFAULT_POLICY, make_profile
from airflow_gpu.core.preemption import plan_preemption
from airflow_gpu.core.queue import schedule_cycle
from airflow_gpu.core.snapshot import Snapshot

NODES = 1000
REPEAT = 7


def build_cluster(fill: float, seed: int = 7, background: str = "random"):
    rng = np.random.default_rng(seed)
    nodes = [
        Node(f"node-{i:04d}", cpu_milli=128_000, memory_mib=1_024_000, gpu_count=8,
             gpu_product="H100" if i < NODES // 2 else "A100", clique=f"clique-{i // 16}", rack=f"rack-{i // 32}",
             zone=f"zone-{i // 250}")
        for i in range(NODES)
    ]
    snap = Snapshot.from_nodes(nodes)
    # background load placed by `background` (random spreads it, bestfit packs it); decisions: bestfit
    spread = make_profile(background, rng=np.random.default_rng(seed))
    profile = make_profile("bestfit")
    running: list[RunningGang] = []
    target = fill * NODES * 8 * 1000
    k = 0
    while snap.allocated_gpu_milli() < target:
        workers, gpus = int(rng.integers(1, 3)), int(rng.choice([1, 2, 4, 8]))
        g = gang(f"bg-{k}", workers, gpus, priority=int(rng.integers(0, 3)), checkpointable=bool(rng.random() < 0.5))
        k += 1
        d = admit(snap, g, spread)
        if not d.admitted:
            break
        for p in d.placements:
            snap.assume(p)
        start = float(rng.uniform(0, 3600))
        running.append(RunningGang(g, d.placements, start, last_checkpoint_at=start + float(rng.uniform(0, 600))))
    return snap, running, profile


def gang(name: str, workers: int, gpus: int, priority: int = 0, level=TopologyLevel.CLIQUE, hard=False,
         products=(), **kw) -> Gang:
    members = tuple(PodRequest(f"{name}-{r}", cpu_milli=4000, memory_mib=32_000, gpus=gpus, gpu_products=products)
                    for r in range(workers))
    return Gang(name, "team", "production-training", priority, members, TopologyRequirement(level, hard), **kw)


def timed(fn):
    times, out = [], None
    for _ in range(REPEAT):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000, min(times) * 1000, out


def pod_at_a_time(snap, g, profile):
    work = snap.copy()
    for m in g.members:
        p, _ = place_pod(work, m, profile)
        if p is None:
            return False
        work.assume(p)
    return True


def main() -> None:
    t = time.perf_counter()
    snap, running, profile = build_cluster(0.6)
    print(f"cluster: {NODES} nodes, {NODES * 8} GPUs, {snap.gpu_allocation_ratio():.0%} allocated by "
          f"{len(running)} running gangs (built in {time.perf_counter() - t:.1f} s)")
    shapes = [
        ("64 x 1 GPU, soft clique", gang("g1", 64, 1)),
        ("64 x 2 GPU H100, hard clique", gang("g2", 64, 2, level=TopologyLevel.CLIQUE, hard=True, products=("H100",))),
        ("64 x 8 GPU, soft clique (widens)", gang("g8", 64, 8)),
        ("64 x 8 GPU, hard clique (no fit)", gang("g8h", 64, 8, hard=True)),
    ]
    # bestfit and the project's default policy (what the scheduler runs), side by side
    for policy in ("bestfit", DEFAULT_POLICY):
        prof = make_profile(policy)
        print(f"policy {policy}")
        print(f"  {'64-pod gang':36} {'admit ms':>9} {'min':>6} {'pod-at-a-time ms':>17} {'ratio':>6}  outcome")
        for label, g in shapes:
            med, low, d = timed(lambda: admit(snap, g, prof))
            base, _, _ = timed(lambda: pod_at_a_time(snap, g, prof))
            outcome = d.domain if d.admitted else d.reason
            print(f"  {label:36} {med:9.1f} {low:6.1f} {base:17.1f} {med / base:6.2f}  {outcome}")

    full, full_running, _ = build_cluster(0.97, seed=11, background="bestfit")
    prod = gang("prod", 64, 4, priority=10)
    med, low, (plan, why) = timed(lambda: plan_preemption(CycleState.build(full, full_running), prod, profile, now=7200.0))
    what = (f"{len(plan.victims)} victims of {len(full_running)} running, {plan.lost_gpu_seconds:.0f} GPU-s lost"
            if plan else why)
    print(f"plan_preemption, 64 x 4 GPU at {full.gpu_allocation_ratio():.0%} full: {med:.1f} ms (min {low:.1f}); {what}")

    rng = np.random.default_rng(3)
    pending = [gang(f"q-{i}", int(rng.integers(1, 9)), int(rng.choice([1, 2, 4, 8])), priority=int(rng.integers(0, 5)),
                    created_at=float(i), expected_duration=float(rng.uniform(60, 7200))) for i in range(100)]
    for s, r in ((snap, running), (full, full_running)):
        label = f"{s.gpu_allocation_ratio():.0%}"
        med, low, res = timed(lambda: schedule_cycle(CycleState.build(s, r), pending, profile, now=3600.0))
        print(f"schedule_cycle, 100 pending gangs, cluster {label} full: {med:.1f} ms (min {low:.1f}); "
              f"{len(res.admitted)} admitted, "
              f"{len(res.preemptions)} preemption plan(s), reservation: "
              f"{res.reservation.gang.name if res.reservation else 'none'}")

    heads_until_planned(full, full_running, profile)


def heads_until_planned(snap: Snapshot, running: list[RunningGang], profile, k: int = 4) -> None:
    """k heads of line at once on the full cluster: each cycle plans one; its plan is then held (here
    with its victims already gone), so the next cycle serves the next head."""
    heads = [gang(f"head-{i}", 16, 8, priority=10, created_at=float(i)) for i in range(k)]
    state = CycleState.build(snap, running)
    cycles, planned, admitted = 0, [], []
    t0 = time.perf_counter()
    while len(planned) + len(admitted) < k and cycles < 2 * k:
        res = schedule_cycle(state, [h for h in heads if h.name not in planned + admitted], profile, now=7200.0)
        cycles += 1
        for d in res.admitted:
            state.hold(d.gang.team, d.placements)
            admitted.append(d.gang.name)
        for plan in res.preemptions:
            for v in plan.victims:
                state.remove(v)
            state.hold(plan.gang.team, plan.placements)
            planned.append(plan.gang.name)
    ms = (time.perf_counter() - t0) * 1000
    print(f"{k} heads of line (16 x 8 GPU each) at {snap.gpu_allocation_ratio():.0%} full: {len(admitted)} "
          f"admitted, {len(planned)} with a preemption plan, in {cycles} cycles, {ms:.0f} ms in all")


if __name__ == "__main__":
    main()

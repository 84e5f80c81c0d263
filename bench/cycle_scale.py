"""The scheduler's cycle at 5,000 nodes x 8 GPUs, 50,000 running pods, 1,000 pending gangs.

Targets (issue 16): p50 <= 500 ms, p99 <= 2 s per cycle. One cycle here is what the scheduler's
loop does in core/ every cycle:
1. the cycle's state: the live state (core.live) kept from cycle to cycle, this cycle's deltas
   applied, then copied; for comparison, in the same run, the rebuild it replaces (every running
   pod assumed on an empty snapshot, every running gang's quota summed by CycleState.build);
2. schedule_cycle over the pending gangs: admission in queue order, at most one preemption plan,
   one reservation.
Synthetic cluster (seeded): 5,000 nodes (H100 / A100 halves), NVLink cliques of 16, racks of 32,
zones of 1,250; running pods of 1, 2, 4 and 8 whole GPUs, GPU shares and CPU-only pods in gangs of
1..4 members, about 90 % of the GPUs taken, four teams; pending gangs of 1..8 members x 1..8 GPUs,
priorities 0..4, a tenth of them high priority (preemption). Policy: the scheduler's default.
Per step: median and p99 over CYCLES cycles (each on the same state, as a quiet cluster repeats its
cycle), wall clock and, for the whole cycle, the process's CPU time (on this shared machine wall
clock is CPU time stretched by the load: the load average is printed with it), then the profile's
top five costs (own CPU time, by function) over one cycle.

`python -m bench cycle_scale` (env BENCH_CYCLE_NODES, BENCH_CYCLE_PODS, BENCH_CYCLE_GANGS,
BENCH_CYCLE_CYCLES, BENCH_CYCLE_REBUILDS, BENCH_CYCLE_CHURN to scale it down or up).

Decisions: every run prints a digest (SHA-256) of the cycle's admissions, placements, preemptions,
wait reasons and reservation. `BENCH_CYCLE_DIGEST=1 python -m bench cycle_scale` prints only the
digests of DIGEST_RUNS: four synthetic clusters, each run for several cycles in which the admitted
gangs and preemption plans start, the victims and some running gangs end and the clock moves, so
the cycles see different states. A speed change must leave every digest as it was (compare the
output of main and the branch).
"""

from __future__ import annotations

import cProfile
import hashlib
import io
import os
import pstats
import time
from dataclasses import dataclass

import numpy as np

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.live import LiveState
from airflow_gpu.core.model import Gang, Node, Placement, PodRequest, RunningGang, TopologyLevel, TopologyRequirement
from airflow_gpu.core.plugins.fgd import TypicalPods
from airflow_gpu.core.policies import DEFAULT_POLICY, make_profile
from airflow_gpu.core.queue import schedule_cycle
from airflow_gpu.core.quota import QuotaBook
from airflow_gpu.core.snapshot import OverCommitError, Snapshot

NODES = int(os.environ.get("BENCH_CYCLE_NODES", 5000))
RUNNING_PODS = int(os.environ.get("BENCH_CYCLE_PODS", 50_000))
PENDING_GANGS = int(os.environ.get("BENCH_CYCLE_GANGS", 1000))
CYCLES = int(os.environ.get("BENCH_CYCLE_CYCLES", 7))
REBUILD_CYCLES = int(os.environ.get("BENCH_CYCLE_REBUILDS", 3))  # the rebuild, for comparison
CHURN = int(os.environ.get("BENCH_CYCLE_CHURN", 100))  # gangs ended and started per cycle (live state)
TEAMS = ("vision", "language", "speech", "research")
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class _Team:  # shaped like airflow_gpu.config.Team for QuotaBook.from_teams
    name: str
    quota: dict
    borrowing_limit: dict | None = None
    lending_limit: dict | None = None


def build_nodes(n: int = NODES) -> list[Node]:
    return [
        Node(f"node-{i:05d}", cpu_milli=128_000, memory_mib=1_024_000, gpu_count=GPUS_PER_NODE,
             gpu_product="H100" if i < n // 2 else "A100", clique=f"clique-{i // 16}", rack=f"rack-{i // 32}",
             zone=f"zone-{i // 1250}")
        for i in range(n)
    ]


def build_running(nodes: list[Node], pods: int = RUNNING_PODS, seed: int = 16):
    """Running gangs with their placements, filled node by node (about 90 % of GPUs taken)."""
    rng = np.random.default_rng(seed)
    per_node = pods / len(nodes)
    placements: list[tuple[PodRequest, Placement]] = []
    for node in nodes:
        k = int(per_node) + (rng.random() < per_node - int(per_node))
        free = [1000] * GPUS_PER_NODE
        cpu = node.cpu_milli
        for j in range(k):
            name = f"{node.name}-p{j}"
            kind = rng.random()
            whole = [g for g, f in enumerate(free) if f == 1000]
            if kind < 0.45 and whole:
                size = int(min(len(whole), rng.choice([1, 1, 2, 4, 8])))
                req = PodRequest(name, cpu_milli=4000 * size, memory_mib=32_000 * size, gpus=size)
                shares = tuple((g, 1000) for g in whole[:size])
            elif kind < 0.9:
                milli = int(rng.choice([250, 500]))
                fits = [g for g, f in enumerate(free) if f >= milli]
                if not fits:
                    req, shares = PodRequest(name, cpu_milli=1000, memory_mib=4_000), ()
                else:
                    req = PodRequest(name, cpu_milli=2000, memory_mib=16_000, gpu_milli=milli)
                    shares = ((fits[0], milli),)
            else:
                req, shares = PodRequest(name, cpu_milli=1000, memory_mib=4_000), ()
            if req.cpu_milli > cpu:
                break
            cpu -= req.cpu_milli
            for g, m in shares:
                free[g] -= m
            placements.append((req, Placement(name, node.name, shares, None, req.cpu_milli, req.memory_mib)))
    order = rng.permutation(len(placements))
    running: list[RunningGang] = []
    i = 0
    while i < len(order):
        size = int(rng.integers(1, 5))
        chunk = [placements[k] for k in order[i:i + size]]
        i += size
        team = TEAMS[int(rng.integers(len(TEAMS)))]
        gang = Gang(f"run-{len(running)}", team, "best-effort-training", int(rng.integers(0, 3)),
                    tuple(r for r, _ in chunk), TopologyRequirement(TopologyLevel.ANY), checkpointable=bool(rng.random() < 0.5))
        start = float(rng.uniform(0, 3600))
        running.append(RunningGang(gang, tuple(p for _, p in chunk), start,
                                   last_checkpoint_at=start + float(rng.uniform(0, 600))))
    return running


def build_pending(gangs: int = PENDING_GANGS, seed: int = 17) -> list[Gang]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(gangs):
        workers, gpus = int(rng.integers(1, 9)), int(rng.choice([1, 2, 4, 8]))
        high = rng.random() < 0.1
        team = TEAMS[int(rng.integers(len(TEAMS)))]
        members = tuple(PodRequest(f"q{i}-{r}", cpu_milli=4000, memory_mib=32_000, gpus=gpus) for r in range(workers))
        out.append(Gang(f"q{i}", team, "production-training" if high else "best-effort-training",
                        10 if high else int(rng.integers(0, 5)), members, created_at=float(i),
                        expected_duration=float(rng.uniform(60, 7200))))
    return out


def quota_book(total_gpus: int) -> QuotaBook:
    share = total_gpus // len(TEAMS)
    return QuotaBook.from_teams([_Team(t, {"H100": share // 2, "A100": share // 2}) for t in TEAMS])


class Cycle:
    """One scheduler cycle's core work, step by step, on fixed inputs.

    Two ways to get the cycle's state, measured side by side:
    - rebuild (what the scheduler did before issue 16): the empty snapshot copied, every running pod
      assumed, CycleState.build sums every running gang's quota;
    - live (core.live.LiveState, kept from cycle to cycle): this cycle's deltas applied (CHURN gangs
      ended and CHURN started, as the informer reports pods gone and bound), then one copy."""

    def __init__(self, nodes, running, pending, profile, book, churn: int = CHURN):
        self.empty = Snapshot.from_nodes(nodes)
        self.running, self.pending, self.profile, self.book = running, pending, profile, book
        self.live = LiveState.from_nodes(nodes, book)
        for rg in running:
            self.live.start(rg)
        self.churn = running[:churn]

    def snapshot(self) -> Snapshot:
        snap = self.empty.copy()
        for rg in self.running:
            for p in rg.placements:
                snap.assume(p)
        return snap

    def state(self, snap: Snapshot) -> CycleState:
        return CycleState.build(snap, self.running, self.book)

    def deltas(self) -> None:
        """The informer's deltas of one cycle: gangs ended, gangs bound (the same ones, so every cycle
        sees the same cluster)."""
        for rg in self.churn:
            self.live.end(rg.gang.name)
        for rg in self.churn:
            self.live.start(rg)

    def run(self, live: bool = True):
        c0 = time.process_time()
        t0 = time.perf_counter()
        if live:
            self.deltas()
            t1 = time.perf_counter()
            state = self.live.cycle_state()
        else:
            snap = self.snapshot()
            t1 = time.perf_counter()
            state = self.state(snap)
        t2 = time.perf_counter()
        result = schedule_cycle(state, self.pending, self.profile, now=7200.0)
        t3 = time.perf_counter()
        return (t1 - t0, t2 - t1, t3 - t2, t3 - t0, time.process_time() - c0), result


def _placements_text(placements) -> str:
    return ";".join(f"{p.pod}@{p.node}{list(p.gpu_shares)}{p.mig_profile or ''}" for p in placements)


def digest(result) -> str:
    """SHA-256 of every decision of one cycle: admissions (placements, domain, borrowed), preemption
    plans (victims, placements), wait reasons, deferrals and the reservation."""
    lines = [f"admit {d.gang.name} {d.domain} {d.borrowed} {_placements_text(d.placements)}" for d in result.admitted]
    lines += [f"preempt {p.gang.name} {p.victim_names} {p.lost_gpu_seconds:.3f} {p.borrowed} {p.reclaim} "
              f"{_placements_text(p.placements)}" for p in result.preemptions]
    lines += [f"wait {name}: {reason}" for name, reason in result.waiting.items()]
    lines += [f"deferred {name}" for name in result.deferred]
    res = result.reservation
    if res is not None:
        lines.append(f"reserve {res.gang.name} {sorted(res.nodes)} {res.start} {res.by_preemption} "
                     f"{_placements_text(res.placements)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# (nodes, running pods, pending gangs, seed, cycles): the clusters whose decisions must not change
DIGEST_RUNS = ((400, 4_000, 200, 1, 6), (800, 8_000, 300, 2, 6), (1_200, 12_000, 400, 3, 5), (5_000, 50_000, 1_000, 16, 3))


def evolving_digest(nodes_n: int, pods_n: int, gangs_n: int, seed: int, cycles: int) -> tuple[str, str]:
    """Cycles on a changing cluster: after each, the admitted gangs and the preemption plan start
    (the victims end first), a seeded 1 % of the running gangs end, time moves on.
    Returns (digest over every cycle, a summary of what the cycles did)."""
    nodes = build_nodes(nodes_n)
    running = build_running(nodes, pods_n, seed=seed)
    pending = build_pending(gangs_n, seed=seed + 1)
    pods = [r for rg in running for r in rg.gang.members]
    profile = make_profile(DEFAULT_POLICY, typical=TypicalPods.from_pods(pods))
    live = LiveState.from_nodes(nodes, quota_book(nodes_n * GPUS_PER_NODE))
    for rg in running:
        live.start(rg)
    rng = np.random.default_rng(seed)
    h = hashlib.sha256()
    admitted = planned = 0
    now = 7200.0
    for _ in range(cycles):
        result = schedule_cycle(live.cycle_state(), pending, profile, now=now)
        h.update(digest(result).encode())
        started = set()
        for plan in result.preemptions:
            for v in plan.victims:
                live.end(v.gang.name)
        for d in list(result.admitted) + [p for p in result.preemptions]:
            rg = RunningGang(d.gang, d.placements, now)
            try:
                live.start(rg)
                started.add(d.gang.name)
            except OverCommitError:
                pass
        admitted += len(result.admitted)
        planned += len(result.preemptions)
        pending = [g for g in pending if g.name not in started]
        names = sorted(live.running)
        for k in rng.choice(len(names), size=max(1, len(names) // 100), replace=False).tolist():
            live.end(names[k])
        now += 60.0
    return h.hexdigest(), f"{admitted} admitted, {planned} preemption plan(s) over {cycles} cycles"


def _pct(values, q):
    return float(np.percentile(np.array(values) * 1000, q))


def top_costs(fn, n: int = 5) -> str:
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(n)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    head = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return "\n".join(lines[head:head + n + 1])


def main() -> None:
    if os.environ.get("BENCH_CYCLE_DIGEST"):
        for run in DIGEST_RUNS:
            c0 = time.process_time()
            h, what = evolving_digest(*run)
            print(f"digest {run[0]:>5} nodes, seed {run[3]:>2}: {h[:16]}  ({what}; {time.process_time() - c0:.1f} s CPU)",
                  flush=True)
        return
    t = time.perf_counter()
    nodes = build_nodes()
    running = build_running(nodes)
    pending = build_pending()
    pods = [r for rg in running for r in rg.gang.members]
    profile = make_profile(DEFAULT_POLICY, typical=TypicalPods.from_pods(pods))
    cycle = Cycle(nodes, running, pending, profile, quota_book(len(nodes) * GPUS_PER_NODE))
    snap = cycle.snapshot()
    print(f"cluster: {len(nodes)} nodes x {GPUS_PER_NODE} GPUs, {len(pods)} running pods in {len(running)} gangs, "
          f"{snap.gpu_allocation_ratio():.1%} of GPUs allocated; {len(pending)} pending gangs; policy "
          f"{DEFAULT_POLICY} (built in {time.perf_counter() - t:.1f} s)")
    rebuild = [cycle.run(live=False)[0] for _ in range(REBUILD_CYCLES)]
    times, result = [], None
    for _ in range(CYCLES):
        step, result = cycle.run()
        times.append(step)
    print(f"last cycle: {len(result.admitted)} admitted, {len(result.preemptions)} preemption plan(s), "
          f"{len(result.waiting)} waiting, reservation: {result.reservation.gang.name if result.reservation else 'none'}; "
          f"decisions digest {digest(result)[:16]}")
    print(f"{'step':34s} {'p50 ms':>9s} {'p99 ms':>9s}")
    rows = [("rebuild: snapshot (every pod)", rebuild, 0), ("rebuild: CycleState.build (quota)", rebuild, 1),
            (f"live: deltas ({CHURN} gangs out, {CHURN} in)", times, 0), ("live: cycle_state copy", times, 1),
            ("schedule_cycle", times, 2), ("whole cycle (live)", times, 3), ("whole cycle (live), CPU time", times, 4)]
    for label, col, k in rows:
        values = [s[k] for s in col]
        print(f"{label:34s} {_pct(values, 50):9.1f} {_pct(values, 99):9.1f}   ({len(values)} cycles)")
    for k, what in ((3, "wall clock"), (4, "CPU time")):
        whole = [s[k] for s in times]
        ok = _pct(whole, 50) <= 500 and _pct(whole, 99) <= 2000
        print(f"target p50 <= 500 ms, p99 <= 2000 ms ({what}): {'OK' if ok else 'MISSED'}")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs: wall clock exceeds CPU time when the machine is "
          f"shared; the CPU time is what one cycle costs on an idle core")
    print("\ntop five costs of one cycle (cProfile, by own CPU time):")
    print(top_costs(cycle.run))


if __name__ == "__main__":
    main()

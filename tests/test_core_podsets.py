"""Gangs of pod sets (launcher + workers, mixed products and MIG profiles) and replacements of a
partly bound gang pinned to its domain (issue 9, items 5 and 6), in the shape of coscheduling's
unit tests: the nodes, the PodGroup's pods, the expected placement or refusal."""

from __future__ import annotations

from fixtures.core_gang import cluster, gang, profile, start

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.gang import admit
from airflow_gpu.core.model import Gang, Node, PodRequest, TopologyLevel, TopologyRequirement
from airflow_gpu.core.queue import schedule_cycle
from airflow_gpu.core.quota import QuotaBook, TeamQuota
from airflow_gpu.core.snapshot import Snapshot


def launcher_job(name: str, workers: int, gpus: int, launcher_gpus: int = 0, level=TopologyLevel.CLIQUE,
                 hard=False, **worker_kw) -> Gang:
    launcher = PodRequest(f"{name}-launcher", cpu_milli=2000, memory_mib=4096, gpus=launcher_gpus)
    pods = tuple(PodRequest(f"{name}-w{i}", cpu_milli=6000, memory_mib=32768, gpus=gpus, **worker_kw)
                 for i in range(workers))
    return Gang(name, "t", "best-effort-training", 0, (launcher,) + pods, TopologyRequirement(level, hard))


def test_cpu_launcher_and_eight_one_gpu_workers_fit_one_eight_gpu_node():
    snap = Snapshot.from_nodes(cluster(1))
    d = admit(snap, launcher_job("mpi", 8, 1), profile())
    assert d.admitted, d.reason
    assert len(d.placements) == 9 and {p.node for p in d.placements} == {"n0000"}


def test_launcher_and_two_eight_gpu_workers_on_two_nodes():
    snap = Snapshot.from_nodes(cluster(2))
    d = admit(snap, launcher_job("torchrun", 2, 8), profile())
    assert d.admitted, d.reason
    assert sorted(p.node for p in d.placements if p.gpu_shares) == ["n0000", "n0001"]


def test_one_gpu_launcher_plus_eight_workers_is_refused_with_a_true_count():
    snap = Snapshot.from_nodes(cluster(1))
    d = admit(snap, launcher_job("mpi", 8, 1, launcher_gpus=1, level=TopologyLevel.NODE, hard=True), profile())
    assert not d.admitted
    assert d.reason == "needs 9 GPUs on one node (8 pods x 1 + 1 pods x 1); largest free block is 8"


def test_members_on_different_products_and_a_cpu_pool():
    cpu = Node("cpu-0", cpu_milli=32_000, memory_mib=128_000, labels=(("pool", "cpu"),), clique="c0")
    nodes = [cpu] + cluster(2, product="H100")
    for i, n in enumerate(nodes[1:]):
        nodes[i + 1] = Node(n.name, n.cpu_milli, n.memory_mib, n.gpu_count, n.gpu_product, clique="c0")
    launcher = PodRequest("j-launcher", cpu_milli=1000, memory_mib=1024, node_selector=(("pool", "cpu"),))
    workers = tuple(PodRequest(f"j-w{i}", cpu_milli=8000, memory_mib=1024, gpus=8, gpu_products=("H100",))
                    for i in range(2))
    g = Gang("j", "t", "best-effort-training", 0, (launcher,) + workers)
    d = admit(Snapshot.from_nodes(nodes), g, profile())
    assert d.admitted, d.reason
    assert {p.pod: p.node for p in d.placements}["j-launcher"] == "cpu-0"


def test_mig_and_whole_gpu_members_and_quota_per_product():
    a100 = Node("a100-0", 64_000, 512_000, gpu_count=0, gpu_product="A100", mig_slices=(("1g.10gb", 7),), clique="c0")
    h100 = Node("h100-0", 64_000, 512_000, gpu_count=8, gpu_product="H100", clique="c0")
    evaluator = PodRequest("e-eval", cpu_milli=1000, memory_mib=1024, mig_profile="1g.10gb", gpu_products=("A100",))
    trainer = tuple(PodRequest(f"e-w{i}", cpu_milli=1000, memory_mib=1024, gpus=4, gpu_products=("H100",))
                    for i in range(2))
    g = Gang("e", "t", "best-effort-training", 0, (evaluator,) + trainer)
    snap = Snapshot.from_nodes([a100, h100])
    d = admit(snap, g, profile())
    assert d.admitted, d.reason
    qb = QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": 8}, mig_quota={"A100": {"1g.10gb": 1}})})
    d = admit(snap, g, profile(), qb, CycleState.build(snap, [], qb).usage)
    assert d.admitted and not d.borrowed, d.reason
    qb = QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": 4}, mig_quota={"A100": {"1g.10gb": 1}})})
    assert not admit(snap, g, profile(), qb, CycleState.build(snap, [], qb).usage).admitted


def test_replacement_member_stays_in_its_gangs_hard_clique():
    # coscheduling: 3 of 4 members run in clique nc0; the 4th is replaced. Free room exists only in
    # clique nc1 and on the last node of nc0.
    snap = Snapshot.from_nodes(cluster(8, clique=4))
    running = start(snap, gang("g", 3, 8, level=TopologyLevel.CLIQUE, hard=True), profile())
    bound_nodes = {p.node for p in running.placements}
    assert bound_nodes == {"n0000", "n0001", "n0002"}
    replacement = Gang("g", "t", "best-effort-training", 0, (PodRequest("g-3", cpu_milli=1000, memory_mib=1024, gpus=8),),
                       TopologyRequirement(TopologyLevel.CLIQUE, True), pinned=tuple(sorted(bound_nodes)))
    d = admit(snap, replacement, profile())
    assert d.admitted and d.placements[0].node == "n0003", d
    # the last node of nc0 taken: the replacement waits rather than leave the clique
    snap.assume(snap.placement_for(PodRequest("o-0", gpus=8), snap.node_index("n0003")))
    d = admit(snap, replacement, profile())
    assert not d.admitted and "bound members" in d.reason, d
    res = schedule_cycle(CycleState.build(snap, [running]), [replacement], profile(), 0.0)
    assert res.admitted == []
    # soft: it prefers the clique, then widens
    soft = Gang("g", "t", "best-effort-training", 0, replacement.members, TopologyRequirement(TopologyLevel.CLIQUE),
                pinned=replacement.pinned)
    d = admit(snap, soft, profile())
    assert d.admitted and d.placements[0].node.startswith("n000") and d.placements[0].node >= "n0004"


def test_min_member_places_at_least_that_many_together_and_the_rest_later():
    # coscheduling: PodGroup minMember 4 of 6 pods, 4 nodes of 8 GPUs free in one clique
    snap = Snapshot.from_nodes(cluster(4, clique=4))
    g = gang("pg", 6, 8, level=TopologyLevel.CLIQUE, hard=True)
    assert not admit(snap, g, profile()).admitted
    d = admit(snap, Gang(g.name, g.team, g.tier, 0, g.members, g.topology, min_member=4), profile())
    assert d.admitted and sorted(p.pod for p in d.placements) == ["pg-0", "pg-1", "pg-2", "pg-3"]
    assert not admit(snap, Gang(g.name, g.team, g.tier, 0, g.members, g.topology, min_member=5), profile()).admitted

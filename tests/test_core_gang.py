"""Gang admission (core.gang): all members or none, topology domains, quota, wait reasons."""

from __future__ import annotations

import numpy as np
from fixtures.core_gang import cluster, gang, profile, start
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu.core.gang import BLOCKED_CAPACITY, BLOCKED_QUOTA, admit
from airflow_gpu.core.model import Gang, Node, Placement, PodRequest, TopologyLevel, TopologyRequirement
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, TeamQuota, demand_of_placements
from airflow_gpu.core.snapshot import Snapshot


def arrays(snap: Snapshot):
    return [a.copy() for a in (snap.gpu_free, snap.cpu_free, snap.mem_free, snap.mig_free)]


def test_gang_that_fits_on_one_node_goes_to_one_node():
    snap = Snapshot.from_nodes(cluster(8))
    d = admit(snap, gang("g", 4, 2), profile())
    assert d.admitted and len({p.node for p in d.placements}) == 1
    assert sorted(p.pod for p in d.placements) == [f"g-{r}" for r in range(4)]


def test_multi_node_gang_takes_the_fewest_nodes_in_one_clique():
    snap = Snapshot.from_nodes(cluster(8, clique=4))
    start(snap, gang("busy", 1, 6), profile())  # leaves 2 GPUs on one node of clique nc0
    d = admit(snap, gang("g", 16, 1), profile())
    assert d.admitted
    nodes = {p.node for p in d.placements}
    assert len(nodes) == 2 and len({snap.nodes[snap.node_index(n)].clique for n in nodes}) == 1
    assert d.domain.startswith("clique")


def test_hard_clique_gang_waits_with_the_largest_free_block_and_holds_nothing():
    snap = Snapshot.from_nodes(cluster(8, clique=2, product="H100"))
    start(snap, gang("x", 1, 8), profile())  # one node of the first clique taken
    before = arrays(snap)
    d = admit(snap, gang("big", 2, 8, level=TopologyLevel.CLIQUE, hard=True, products=("H100",)), profile())
    assert d.admitted  # three cliques still have both nodes free
    g3 = gang("big3", 3, 8, level=TopologyLevel.CLIQUE, hard=True, products=("H100",))
    d = admit(snap, g3, profile())
    assert not d.admitted and d.placements == () and d.blocked_by == BLOCKED_CAPACITY
    assert d.reason == "needs 24 x H100 in one NVLink clique (3 pods x 8); largest free block is 16"
    assert all((a == b).all() for a, b in zip(before, arrays(snap)))  # input untouched


def test_soft_requirement_widens_to_rack_then_anywhere():
    snap = Snapshot.from_nodes(cluster(8, clique=2, rack=4, zone=8))
    d = admit(snap, gang("g", 3, 8), profile())
    assert d.admitted and d.domain.startswith("rack")
    d = admit(snap, gang("g", 3, 8, level=TopologyLevel.RACK, hard=True), profile())
    assert d.admitted
    d = admit(snap, gang("g", 9, 8), profile())
    assert not d.admitted and "needs 72 GPUs in the cluster" in d.reason and d.reason.endswith("; 64 free")


def test_single_pod_reason_is_the_filter_diagnosis():
    snap = Snapshot.from_nodes(cluster(2, gpus=4))
    d = admit(snap, gang("solo", 1, 8), profile())
    assert not d.admitted and "0/2 nodes are available: 2 insufficient nvidia.com/gpu" in d.reason


def test_quota_blocks_with_the_team_numbers_and_prefers_a_product_with_room():
    nodes = cluster(2, product="a100-80gb", prefix="a") + cluster(2, product="h100", prefix="h")
    snap = Snapshot.from_nodes(nodes)
    qb = QuotaBook({"ml-research": TeamQuota.from_gpus("ml-research", {"a100-80gb": 8, "h100": 4})})
    usage = QuotaUsage({"ml-research": {("a100-80gb", None): 8000}})
    g = gang("g", 2, 2, team="ml-research", products=("a100-80gb", "h100"))
    d = admit(snap, g, profile(), qb, usage)
    assert d.admitted and {snap.nodes[snap.node_index(p.node)].gpu_product for p in d.placements} == {"h100"}
    g = gang("g", 1, 1, team="ml-research", products=("a100-80gb",))
    d = admit(snap, g, profile(), qb, usage)
    assert not d.admitted and d.blocked_by == BLOCKED_QUOTA
    assert d.reason.startswith("team quota: ml-research uses 8 of 8 a100-80gb")


def test_normalised_quota_charges_an_h100_at_its_weight():
    nodes = cluster(1, product="A100", prefix="a") + cluster(1, product="H100", prefix="h")
    snap = Snapshot.from_nodes(nodes)
    qb = QuotaBook({"t": TeamQuota.from_gpus("t", {"units": 10})}, aliases={"A100": "units", "H100": "units"},
                   weights={"H100": 2.5})
    usage = QuotaUsage()
    d = admit(snap, gang("h", 1, 4, products=("H100",)), profile(), qb, usage)
    assert d.admitted and d.quota.fits  # 4 x 2.5 = 10 units
    assert not admit(snap, gang("h", 1, 5, products=("H100",)), profile(), qb, usage).admitted
    d = admit(snap, gang("any", 1, 6, products=("H100", "A100")), profile(), qb, usage)
    assert d.admitted and d.placements[0].node.startswith("a")  # 6 H100 = 15 units: only A100 fits quota
    node_product = {n.name: n.gpu_product for n in nodes}
    assert demand_of_placements(d.placements, node_product, qb) == {("units", None): 6000}


def test_reserved_nodes_are_not_used():
    snap = Snapshot.from_nodes(cluster(4))
    exclude = np.array([True, True, True, False])
    d = admit(snap, gang("g", 2, 4), profile(), exclude=exclude)
    assert d.admitted and {p.node for p in d.placements} == {"n0003"}
    assert not admit(snap, gang("g", 3, 4), profile(), exclude=exclude).admitted


# --- property: never partially placed ---------------------------------------------------------

@st.composite
def scenes(draw):
    n = draw(st.integers(1, 10))
    nodes = [
        Node(f"n{i}", cpu_milli=draw(st.sampled_from([4000, 16000, 64000])), memory_mib=65536,
             gpu_count=draw(st.integers(0, 8)), gpu_product=draw(st.sampled_from(["A", "B"])),
             clique=draw(st.sampled_from(["", "c0", "c1", "c2"])), rack=draw(st.sampled_from(["r0", "r1"])),
             zone="z0")
        for i in range(n)
    ]
    snap = Snapshot.from_nodes(nodes)
    for i, node in enumerate(nodes):  # random occupation
        used = draw(st.integers(0, node.gpu_count))
        if used:
            snap.assume(Placement(f"bg{i}", node.name, tuple((g, 1000) for g in range(used)), cpu_milli=1000))
    workers = draw(st.integers(1, 8))
    form = draw(st.sampled_from(["gpus", "milli", "cpu"]))
    members = tuple(
        PodRequest(f"m{r}", cpu_milli=draw(st.sampled_from([500, 4000, 12000])), memory_mib=1024,
                   gpus=draw(st.integers(1, 4)) if form == "gpus" else 0,
                   gpu_milli=draw(st.integers(100, 900)) if form == "milli" else 0,
                   gpu_products=draw(st.sampled_from([(), ("A",), ("B", "A")])))
        for r in range(workers)
    )
    topo = TopologyRequirement(draw(st.sampled_from(list(TopologyLevel))), draw(st.booleans()))
    return snap, Gang("g", "t", "x", 0, members, topo)


@settings(max_examples=120, deadline=None)
@given(scenes())
def test_gangs_are_never_partially_placed(scene):
    snap, g = scene
    before = arrays(snap)
    d = admit(snap, g, profile())
    assert all((a == b).all() for a, b in zip(before, arrays(snap)))
    if not d.admitted:
        assert d.placements == () and d.reason
        return
    assert sorted(p.pod for p in d.placements) == sorted(m.name for m in g.members)
    trial = snap.copy()
    for p in d.placements:
        trial.assume(p)  # raises on any over-commit
    nodes = [snap.nodes[snap.node_index(p.node)] for p in d.placements]
    if g.topology.hard and len({n.name for n in nodes}) > 1:  # one node is tighter than any level
        level = g.topology.level
        if level is TopologyLevel.NODE:
            assert len({n.name for n in nodes}) == 1
        elif level is not TopologyLevel.ANY:
            values = {getattr(n, level.value) for n in nodes}
            assert len(values) == 1 and "" not in values


def test_gang_preemption_quota_and_queue_import_nothing_impure():
    import subprocess
    import sys

    code = ("import sys, airflow_gpu.core.gang, airflow_gpu.core.preemption, airflow_gpu.core.quota, "
            "airflow_gpu.core.queue; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('airflow', 'kubernetes', 'kubernetes_asyncio', 'boto3', 'botocore', 'pydantic', 'yaml', 'requests', "
            "'httpx') or m.startswith('airflow_gpu.config'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_hard_rack_is_kept_when_a_clique_spans_racks():
    """Found by the property above: topology labels need not nest, so a clique across two racks
    is no answer to a hard rack requirement."""
    nodes = [Node("n0", cpu_milli=4000, memory_mib=65536, gpu_count=2, gpu_product="A", clique="c1", rack="r0"),
             Node("n1", cpu_milli=4000, memory_mib=65536, gpu_count=2, gpu_product="A", clique="c1", rack="r1")]
    members = (PodRequest("m0", cpu_milli=500, memory_mib=1024, gpus=1),
               PodRequest("m1", cpu_milli=500, memory_mib=1024, gpus=2))
    hard_rack = Gang("g", "t", "x", 0, members, TopologyRequirement(TopologyLevel.RACK, hard=True))
    d = admit(Snapshot.from_nodes(nodes), hard_rack, profile())
    assert not d.admitted and d.placements == ()
    soft = Gang("g", "t", "x", 0, members, TopologyRequirement(TopologyLevel.RACK, hard=False))
    assert admit(Snapshot.from_nodes(nodes), soft, profile()).admitted

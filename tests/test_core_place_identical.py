"""framework.place_identical: a pod set's members placed at once give exactly the placements of
place_pod member after member (each with the earlier ones held), on random clusters, under every
policy that can say its scores pod after pod, with tie ranks, capacity preferences, a gang domain
and product preferences; and it declines (None) where it cannot be exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu.constants import CAPACITY_ON_DEMAND, CAPACITY_SPOT
from airflow_gpu.core.framework import place_identical, place_pod
from airflow_gpu.core.gang import restricted
from airflow_gpu.core.model import Node, Placement, PodRequest
from airflow_gpu.core.plugins.fgd import TypicalPods
from airflow_gpu.core.policies import make_profile
from airflow_gpu.core.snapshot import Snapshot


def _cluster(rng: np.random.Generator, n: int) -> Snapshot:
    nodes = [Node(f"n{i}", cpu_milli=int(rng.choice([32_000, 64_000, 128_000])), memory_mib=262_144,
                  gpu_count=8, gpu_product=str(rng.choice(["A100", "H100"])),
                  capacity_type=str(rng.choice([CAPACITY_ON_DEMAND, CAPACITY_SPOT]))) for i in range(n)]
    snap = Snapshot.from_nodes(nodes)
    for i, node in enumerate(nodes):  # some GPUs taken whole, some in part, some CPU
        for g in range(8):
            u = rng.random()
            if u < 0.3:
                snap.assume(Placement(f"busy-{i}-{g}", node.name, gpu_shares=((g, 1000),), cpu_milli=2000))
            elif u < 0.45:
                snap.assume(Placement(f"share-{i}-{g}", node.name, gpu_shares=((g, int(rng.choice([250, 500]))),)))
    return snap


def _one_by_one(snap: Snapshot, pods: list[PodRequest], profile) -> list[Placement] | None:
    out = []
    with snap.trial() as trial:
        for pod in pods:
            placement, _ = place_pod(snap, pod, profile)
            if placement is None:
                return None
            trial.assume(placement)
            out.append(placement)
    return out


TYPICAL = TypicalPods.from_pods([PodRequest("t1", gpus=1, cpu_milli=4000), PodRequest("t8", gpus=8, cpu_milli=32000),
                                 PodRequest("ts", gpu_milli=500, cpu_milli=2000)])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(2, 40), gpus=st.sampled_from([1, 2, 4, 8]),
       cpu=st.sampled_from([0, 2000, 8000]), policy=st.sampled_from(["fgd-lookahead", "fgd"]),
       ties=st.booleans(), prefer=st.booleans(), domain=st.booleans(),
       capacity=st.sampled_from([(), (CAPACITY_SPOT, CAPACITY_ON_DEMAND), (CAPACITY_ON_DEMAND,)]),
       products=st.sampled_from([(), ("H100", "A100"), ("A100",)]))
def test_placed_at_once_is_placed_one_by_one(seed, count, gpus, cpu, policy, ties, prefer, domain, capacity, products):
    rng = np.random.default_rng(seed)
    snap = _cluster(rng, int(rng.integers(3, 30)))
    profile = make_profile(policy, typical=TYPICAL, tie_rank=rng.permutation(len(snap)) if ties else None,
                           prefer_products=prefer)
    if domain:
        profile = restricted(profile, rng.random(len(snap)) < 0.7, "outside")
    pods = [PodRequest(f"w{i}", gpus=gpus, cpu_milli=cpu, capacity_types=capacity, gpu_products=products)
            for i in range(count)]
    before = (snap.gpu_free.copy(), snap.cpu_free.copy(), snap.version.copy())
    fast = place_identical(snap, pods, profile)
    assert all(np.array_equal(a, b) for a, b in zip(before, (snap.gpu_free, snap.cpu_free, snap.version)))
    slow = _one_by_one(snap, pods, profile)
    if fast is None:
        assert slow is None, "declined although every member fits"
    else:
        assert fast == slow


@pytest.mark.parametrize("pod, profile", [
    (PodRequest("w", gpu_milli=500), make_profile("fgd", typical=TYPICAL)),  # a share: its GPU is chosen by score
    (PodRequest("w", gpus=1), make_profile("fgd")),  # learning: each member scored is learnt
    (PodRequest("w", gpus=1), make_profile("bestfit")),  # a score that reads more than its node's row
])
def test_it_declines_where_it_cannot_be_exact(pod, profile):
    snap = _cluster(np.random.default_rng(1), 6)
    assert place_identical(snap, [pod, pod], profile) is None

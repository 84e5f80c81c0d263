"""core/hold.py: which placements are held, how a pod that fits nowhere takes held room (moving or
displacing the held pods), the budget, and that nothing else changes when no room can be made."""

from __future__ import annotations

import math

import numpy as np
import pytest

from airflow_gpu.core.hold import PlacementHold
from airflow_gpu.core.model import Node, Placement, PodRequest
from airflow_gpu.core.plugins.fgd import TypicalPods
from airflow_gpu.core.policies import make_profile
from airflow_gpu.core.snapshot import Snapshot


def node(name, gpus=1, cpu=32_000, mem=65_536, product="A100") -> Node:
    return Node(name, cpu_milli=cpu, memory_mib=mem, gpu_count=gpus, gpu_product=product)


def share(name, milli=810, cpu=3000, **kw) -> PodRequest:
    return PodRequest(name, cpu_milli=cpu, memory_mib=4096, gpu_milli=milli, **kw)


def whole(name, gpus=1, cpu=8000, **kw) -> PodRequest:
    return PodRequest(name, cpu_milli=cpu, memory_mib=8192, gpus=gpus, **kw)


# a workload of 810-milli shares and whole GPUs: a lone 810 strands 190 milli nothing fills
TYPICAL = TypicalPods.from_pods([share(f"s{i}") for i in range(3)] + [whole(f"w{i}") for i in range(7)])


def setup(nodes, budget=0.5, seconds=math.inf):
    snap = Snapshot.from_nodes(nodes)
    return snap, PlacementHold(TYPICAL, snap.shape.total_gpu_milli, budget, seconds), make_profile(
        "fgd-lookahead", typical=TYPICAL, prefer_products=False)


def put(snap, hold, pod, node_name, gpu=0, now=0.0):
    shares = ((gpu, pod.gpu_milli),) if pod.gpu_milli else tuple((g, 1000) for g in range(gpu, gpu + pod.gpus))
    placement = Placement(pod.name, node_name, shares, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)
    snap.assume(placement)
    hold.offer(snap, pod, placement, now)
    return placement


def test_only_shares_that_strand_capacity_are_held():
    snap, hold, _ = setup([node("a", gpus=4)])
    put(snap, hold, whole("w"), "a", gpu=0)
    put(snap, hold, share("s"), "a", gpu=1)  # 810 alone: 190 milli left that no typical pod fits
    put(snap, hold, share("t", milli=190), "a", gpu=1)  # fills the hole: lowers the expected waste
    assert "s" in hold and "w" not in hold and "t" not in hold and hold.held_milli == 810


def test_a_whole_gpu_pod_displaces_a_held_share_which_fails_when_it_fits_nowhere():
    snap, hold, profile = setup([node("a"), node("b")])
    put(snap, hold, share("s"), "a")
    put(snap, hold, whole("w0"), "b")
    room = hold.make_room(snap, whole("w1"), profile)
    assert room is not None and room.placement.node == "a" and room.placement.gpu_shares == ((0, 1000),)
    assert [p.name for p in room.displaced] == ["s"] and room.moved == ()
    assert set(snap.placements) == {"w0", "w1"} and len(hold) == 0
    assert snap.gpu_free[:, 0].tolist() == [0, 0]


def test_a_displaced_share_moves_to_where_it_still_fits():
    snap, hold, profile = setup([node("a"), node("b")])
    put(snap, hold, share("s"), "a")
    snap.assume(Placement("small", "b", ((0, 150),), cpu_milli=1000, memory_mib=1024))  # 850 free on b
    room = hold.make_room(snap, whole("w"), profile)
    assert room is not None and room.displaced == ()
    assert [(p.pod, p.node) for p in room.moved] == [("s", "b")]
    assert snap.placements["w"].node == "a" and snap.placements["s"].node == "b"
    assert snap.gpu_free[:, 0].tolist() == [0, 40]


def test_a_multi_gpu_pod_takes_several_held_shares_on_one_node():
    snap, hold, profile = setup([node("a", gpus=2), node("b", gpus=2)], budget=1.0)
    put(snap, hold, share("s0"), "a", gpu=0)
    put(snap, hold, share("s1"), "a", gpu=1)
    put(snap, hold, share("s2"), "b", gpu=0)
    put(snap, hold, whole("w", gpus=1), "b", gpu=1)
    room = hold.make_room(snap, whole("big", gpus=2), profile)
    assert room is not None and room.placement.node == "a"
    assert sorted(p.name for p in room.displaced) == ["s0", "s1"] and "s2" in hold


def test_no_room_leaves_everything_as_it_was():
    snap, hold, profile = setup([node("a", cpu=8000), node("b", cpu=8000, product="T4")], budget=1.0)
    put(snap, hold, share("s"), "a")
    put(snap, hold, share("t"), "b")
    before = (snap.gpu_free.copy(), snap.cpu_free.copy(), dict(snap.placements))
    assert hold.make_room(snap, share("u"), profile) is None  # equal demand: nothing to gain
    assert hold.make_room(snap, whole("cpu-heavy", cpu=9000), profile) is None  # CPU is short on both even empty
    assert hold.make_room(snap, whole("v100", gpu_products=("V100",)), profile) is None  # the product filter
    assert np.array_equal(snap.gpu_free, before[0]) and np.array_equal(snap.cpu_free, before[1])
    assert dict(snap.placements) == before[2] and len(hold) == 2


def test_the_budget_releases_the_oldest_held_pod():
    snap, hold, profile = setup([node(f"n{i}") for i in range(4)], budget=0.5)  # 2,000 milli
    for i in range(3):
        put(snap, hold, share(f"s{i}"), f"n{i}")
    assert "s0" not in hold and "s1" in hold and "s2" in hold and hold.held_milli == 1620
    put(snap, hold, whole("w"), "n3")
    room = hold.make_room(snap, whole("late"), profile)
    assert room is not None and room.placement.node == "n1"  # s0 is bound for good


def test_the_budget_must_be_a_fraction():
    with pytest.raises(ValueError, match="budget_fraction must be in"):
        PlacementHold(TYPICAL, 1000, 1.5)


def test_a_held_pod_is_released_at_its_reserved_place_when_its_time_is_up():
    snap, hold, profile = setup([node(f"n{i}") for i in range(3)], budget=1.0, seconds=60)
    s0 = put(snap, hold, share("s0"), "n0", now=0)
    put(snap, hold, share("s1"), "n1", now=30)
    assert hold.until("s0") == 60 and [p.name for p, _, _ in hold.held()] == ["s0", "s1"]
    assert hold.expire(59.9) == [] and len(hold) == 2
    assert hold.expire(60) == [s0] and "s0" not in hold and "s1" in hold
    assert snap.placements["s0"] == s0  # released means bound where it was: the snapshot keeps it
    put(snap, hold, whole("w"), "n2")
    room = hold.make_room(snap, whole("late"), profile, now=61)
    assert room is not None and room.placement.node == "n1"  # s0 is bound for good, s1 still held


def test_offer_returns_what_to_bind_now():
    snap, hold, _ = setup([node("a", gpus=4)], budget=0.3)  # 1,200 milli
    w = Placement("w", "a", ((0, 1000),), cpu_milli=8000, memory_mib=8192)
    snap.assume(w)
    assert hold.offer(snap, whole("w"), w) == [w]  # not held: bound at once
    s0 = Placement("s0", "a", ((1, 810),), cpu_milli=3000, memory_mib=4096)
    snap.assume(s0)
    assert hold.offer(snap, share("s0"), s0) == []  # held
    s1 = Placement("s1", "a", ((2, 810),), cpu_milli=3000, memory_mib=4096)
    snap.assume(s1)
    assert hold.offer(snap, share("s1"), s1) == [s0]  # past the budget: the oldest is bound


def test_a_moved_share_is_bound_where_it_moved_so_its_wait_stays_bounded():
    snap, hold, profile = setup([node("a"), node("b")], seconds=60)
    put(snap, hold, share("s"), "a")
    snap.assume(Placement("small", "b", ((0, 150),), cpu_milli=1000, memory_mib=1024))
    room = hold.make_room(snap, whole("w"), profile, now=50)
    assert room is not None and [p.pod for p in room.moved] == ["s"]
    assert "s" in [p.pod for p in room.released] and "s" not in hold


def test_hold_seconds_must_be_positive():
    with pytest.raises(ValueError, match="hold_seconds must be > 0"):
        PlacementHold(TYPICAL, 1000, 0.1, 0)

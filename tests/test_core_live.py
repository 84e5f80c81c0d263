"""The live state (core.live): capacity and quota kept by deltas equal a rebuild, and cycles decide alike."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.core_gang import cluster, gang, profile, start

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.live import LiveState
from airflow_gpu.core.model import Placement, RunningGang
from airflow_gpu.core.queue import schedule_cycle
from airflow_gpu.core.quota import QuotaBook, TeamQuota
from airflow_gpu.core.snapshot import OverCommitError, Snapshot

BOOK = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 24}, {"H100": 8}),
                  "b": TeamQuota.from_gpus("b", {"H100": 24}, {"H100": 8})})


def _running(nodes):
    snap = Snapshot.from_nodes(nodes)
    out = []
    for i in range(12):
        out.append(start(snap, gang(f"r{i}", 1 + i % 3, 2, priority=i % 2, team="ab"[i % 2]), profile(), at=float(i)))
    return out


def _same_capacity(a: Snapshot, b: Snapshot) -> None:
    assert np.array_equal(a.gpu_free, b.gpu_free)
    assert np.array_equal(a.cpu_free, b.cpu_free) and np.array_equal(a.mem_free, b.mem_free)
    assert set(a.placements) == set(b.placements)


def _rebuilt(nodes, running) -> CycleState:
    snap = Snapshot.from_nodes(nodes)
    for rg in running:
        for p in rg.placements:
            snap.assume(p)
    return CycleState.build(snap, running, BOOK)


def test_deltas_give_the_rebuilt_state_and_the_same_cycle():
    nodes = cluster(8)
    running = _running(nodes)
    live = LiveState.from_nodes(nodes, BOOK)
    for rg in running:
        live.start(rg)
    gone = [running[1], running[4], running[7]]
    for rg in gone:
        live.end(rg.gang.name)
    live.start(running[4])  # ended and bound again: the informer's delete then add
    kept = [rg for rg in running if rg not in (running[1], running[7])]
    state, rebuilt = live.cycle_state(), _rebuilt(nodes, kept)
    _same_capacity(state.snap, rebuilt.snap)
    assert {t: {k: v for k, v in d.items() if v} for t, d in state.usage.used.items()} == \
           {t: {k: v for k, v in d.items() if v} for t, d in rebuilt.usage.used.items()}
    assert {rg.gang.name for rg in state.running} == {rg.gang.name for rg in kept}

    pending = [gang("big", 4, 8, priority=5, team="a"), gang("small", 1, 2, team="b"), gang("mid", 2, 4, team="a")]
    one = schedule_cycle(state, pending, profile(), now=100.0)
    two = schedule_cycle(rebuilt, pending, profile(), now=100.0)
    assert [(d.gang.name, d.placements) for d in one.admitted] == [(d.gang.name, d.placements) for d in two.admitted]
    assert [(p.gang.name, set(p.victim_names)) for p in one.preemptions] == \
           [(p.gang.name, set(p.victim_names)) for p in two.preemptions]
    assert one.waiting == two.waiting
    assert one.admitted or one.preemptions  # the cycle decided something: the comparison can fail


def test_cycle_state_is_a_copy_and_terminating_gangs_are_no_candidates():
    nodes = cluster(8)
    running = _running(nodes)[:4]
    live = LiveState.from_nodes(nodes, BOOK)
    for rg in running:
        live.start(rg)
    before = live.snap.gpu_free.copy()
    state = live.cycle_state(terminating=["r0"])
    state.remove(state.running[0])
    state.hold("a", [Placement("extra", nodes[3].name, ((7, 1000),), None, 1000, 1024)])
    assert np.array_equal(live.snap.gpu_free, before)
    assert "r0" not in {rg.gang.name for rg in state.running}
    assert live.usage.of("a", ("H100", None)) == sum(2000 * len(rg.placements) for rg in running if rg.gang.team == "a")


def test_a_gang_that_does_not_fit_holds_nothing_and_names_are_checked():
    nodes = cluster(1)
    live = LiveState.from_nodes(nodes, BOOK)
    one = RunningGang(gang("x", 1, 8, team="a"), (Placement("x-0", nodes[0].name, tuple((g, 1000) for g in range(8)),
                                                             None, 1000, 1024),), 0.0)
    live.start(one)
    clash = RunningGang(gang("y", 2, 1, team="b"), (Placement("y-0", nodes[0].name, (), None, 1000, 1024),
                                                     Placement("y-1", nodes[0].name, ((0, 1000),), None, 1000, 1024)), 0.0)
    with pytest.raises(OverCommitError):
        live.start(clash)
    assert "y-0" not in live.snap.placements and "y" not in live.running
    assert live.usage.of("b", ("H100", None)) == 0
    with pytest.raises(ValueError, match="running already"):
        live.start(one)
    with pytest.raises(KeyError, match="not running"):
        live.end("y")
    live.end("x")
    assert int(live.snap.whole_free_gpus()[0]) == 8 and live.usage.of("a", ("H100", None)) == 0


def _usage(state: CycleState) -> dict:
    return {t: {k: v for k, v in d.items() if v} for t, d in state.usage.used.items() if any(d.values())}


def test_the_quota_ledger_kept_by_deltas_counts_as_a_rebuild_with_plans_and_nominations():
    from airflow_gpu.core.live import QuotaLedger

    nodes = cluster(8)
    running = _running(nodes)
    snap = _rebuilt(nodes, running).snap
    ledger = QuotaLedger(BOOK, snap.shape.node_product)
    ledger.sync(running)
    # next cycle: r1 gone, r2 back as a new object with an equal placements tuple, r3 moved to another team
    moved = RunningGang(gang("r3", 1 + 3 % 3, 2, team="a"), running[3].placements, 3.0)
    again = RunningGang(running[2].gang, tuple(running[2].placements), 2.0)
    now = [rg for rg in running if rg.gang.name not in ("r1", "r2", "r3")] + [again, moved]
    ledger.sync(now)
    for p in running[1].placements:
        snap.forget(p.pod)
    victims = [rg for rg in now if rg.gang.name in ("r5", "r6")]
    terminating = [rg for rg in now if rg.gang.name == "r0"]
    candidates = [rg for rg in now if rg not in victims and rg not in terminating]
    plan = [Placement("nom-0", nodes[7].name, ((7, 1000),), None, 1000, 1024)]
    held = [("b", [Placement("bind-0", nodes[6].name, ((7, 1000),), None, 1000, 1024)])]
    nominated = [("a", plan, victims)]
    kept = ledger.cycle_state(snap, candidates, held=held, nominated=nominated)
    rebuilt = CycleState.build(snap, candidates, BOOK, held=held, terminating=terminating, nominated=nominated)
    assert _usage(kept) == _usage(rebuilt)
    assert _usage(kept)["a"][("H100", None)] > 0 and _usage(kept)["b"][("H100", None)] > 0
    assert [rg.gang.name for rg in kept.running] == [rg.gang.name for rg in rebuilt.running]
    # the ledger's own usage is not changed by the cycle's plans, and a demand is served from its cache
    kept.usage.add("a", {("H100", None): 1000})
    assert _usage(ledger.cycle_state(snap, candidates, held=held, nominated=nominated)) == _usage(rebuilt)
    assert kept.demand_of(again) is ledger._gangs["r2"][2]
    ledger.sync([])
    assert not any(v for d in ledger.usage.used.values() for v in d.values())

"""Two GPU generations in one cluster (issue 29), in the shape of Kueue's scheduler tests (ClusterQueue =
team, cohort = cohort, ResourceFlavor = GPU product): pod sets stay on one product, flavor fungibility
(whenCanBorrow, whenCanPreempt), the nominal-quota rule for preemption, the platform's product order."""

from __future__ import annotations

from dataclasses import replace

from fixtures.core_gang import cluster, gang, profile, start

from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.gang import admit
from airflow_gpu.core.preemption import plan_preemption
from airflow_gpu.core.queue import schedule_cycle
from airflow_gpu.core.quota import TRY_NEXT_FLAVOR, QuotaBook, TeamQuota
from airflow_gpu.core.snapshot import Snapshot

BOTH = ("H100", "A100")


def two_generations(h100_gpus: int = 10, a100_gpus: int = 10) -> Snapshot:
    return Snapshot.from_nodes(cluster(1, gpus=h100_gpus, product="H100", prefix="h")
                               + cluster(1, gpus=a100_gpus, product="A100", prefix="a"))


def products_of(snap: Snapshot, placements) -> set[str]:
    return {snap.shape.node_product[p.node] for p in placements}


def fill(snap: Snapshot, name: str, gpus: int, product: str, team: str = "filler", priority: int = 0):
    return start(snap, gang(name, 1, gpus, priority=priority, team=team, products=(product,)), profile())


# --- 1. pod sets stay on one product ------------------------------------------------------------

def test_a_gang_is_not_split_across_products_unless_it_opts_in():
    # 5 free H100 + 5 free A100; the gang of 6 x 1 GPU accepts both: it used to be admitted as 3 + 3
    snap = two_generations()
    fill(snap, "h-fill", 5, "H100")
    fill(snap, "a-fill", 5, "A100")
    six = gang("six", 6, 1, products=BOTH)
    d = admit(snap, six, profile())
    assert not d.admitted
    assert d.reason.startswith("H100: ") and "; A100: " in d.reason, d.reason  # each product and why
    mixed = admit(snap, replace(six, products_mixed=True), profile())
    assert mixed.admitted and products_of(snap, mixed.placements) == {"H100", "A100"}
    # with a quota book, the same: the quota path never mixes either
    qb = QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": 16, "A100": 16})})
    assert not admit(snap, six, profile(), qb).admitted
    assert admit(snap, replace(six, products_mixed=True), profile(), qb).admitted


def test_a_gang_that_fits_on_its_second_product_takes_only_that_one():
    snap = two_generations(a100_gpus=16)
    fill(snap, "h-fill", 5, "H100")
    d = admit(snap, gang("six", 6, 1, products=BOTH), profile())
    assert d.admitted and products_of(snap, d.placements) == {"A100"}
    # a gang naming no product is kept to one product as well
    d = admit(snap, gang("any", 12, 1), profile())
    assert d.admitted and products_of(snap, d.placements) == {"A100"}


# --- 2. flavor fungibility ----------------------------------------------------------------------

def test_prefer_reclamation_over_cq_priority_based_preemption():
    # Kueue TestSchedule "prefer reclamation over cq priority based preemption": alpha has 10 of each
    # product, beta none. a1 (alpha, 50) holds 5 H100 of alpha's; b1 (beta, 50) borrows 5 A100. The
    # preemptor (alpha, 100, 6 GPUs) would preempt a1 on H100 or reclaim on A100: it reclaims b1.
    qb = QuotaBook({"alpha": TeamQuota.from_gpus("alpha", {"H100": 10, "A100": 10}),
                    "beta": TeamQuota.from_gpus("beta", {"H100": 0, "A100": 0}, {"H100": 10, "A100": 10})})
    snap = two_generations()
    running = [fill(snap, "a1", 5, "H100", team="alpha", priority=50),
               fill(snap, "b1", 5, "A100", team="beta", priority=50)]
    preemptor = gang("preemptor", 6, 1, priority=100, team="alpha", products=BOTH)
    # before issue 29 it was admitted as 3 + 3 without taking anything back
    res = schedule_cycle(CycleState.build(snap, running, qb), [preemptor], profile(), 0.0)
    assert res.admitted == []
    (plan,) = res.preemptions
    assert plan.victim_names == ("b1",) and plan.reclaim
    assert products_of(snap, plan.placements) == {"A100"}


def test_when_can_preempt_try_next_flavor_moves_to_the_next_product():
    # H100 (first choice) is full of the team's own lower-priority work; A100 is free: Kueue's default
    # whenCanPreempt: TryNextFlavor admits on A100 and preempts nothing
    qb = QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": 8, "A100": 8})})
    snap = two_generations(h100_gpus=8, a100_gpus=8)
    running = [fill(snap, "low", 8, "H100", team="t", priority=0)]
    high = gang("high", 2, 4, priority=100, team="t", products=BOTH)
    res = schedule_cycle(CycleState.build(snap, running, qb), [high], profile(), 0.0)
    assert res.preemptions == []
    (d,) = res.admitted
    assert products_of(snap, d.placements) == {"A100"}
    # the test can fail: on H100 alone it preempts
    res = schedule_cycle(CycleState.build(snap, running, qb), [replace(high, members=tuple(
        replace(m, gpu_products=("H100",)) for m in high.members))], profile(), 0.0)
    assert [p.victim_names for p in res.preemptions] == [("low",)]


def test_when_can_borrow_may_stop_search_by_default_try_next_flavor_on_request():
    # t has no H100 quota of its own (borrows it from u) and 8 A100; the gang prefers H100
    def book(policy: str | None) -> QuotaBook:
        kw = {"when_can_borrow": policy} if policy else {}
        return QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": 0, "A100": 8}, {"H100": 8}, **kw),
                          "u": TeamQuota.from_gpus("u", {"H100": 8})})

    snap = two_generations(h100_gpus=8, a100_gpus=8)
    g = gang("g", 1, 8, team="t", products=BOTH)
    d = admit(snap, g, profile(), book(None))  # Kueue's default: MayStopSearch
    assert d.admitted and d.borrowed and products_of(snap, d.placements) == {"H100"}
    d = admit(snap, g, profile(), book(TRY_NEXT_FLAVOR))
    assert d.admitted and not d.borrowed and products_of(snap, d.placements) == {"A100"}
    # TryNextFlavor comes back to the borrowing product when no other fits
    fill(snap, "a-full", 8, "A100", team="u")
    d = admit(snap, g, profile(), book(TRY_NEXT_FLAVOR))
    assert d.admitted and d.borrowed and products_of(snap, d.placements) == {"H100"}


def test_the_platform_order_wins_over_the_authors():
    snap = two_generations()
    g = gang("g", 1, 4, team="t", products=BOTH)
    teams = {"t": TeamQuota.from_gpus("t", {"H100": 10, "A100": 10})}
    assert products_of(snap, admit(snap, g, profile(), QuotaBook(teams)).placements) == {"H100"}
    ranked = QuotaBook(teams, product_rank={"A100": 0, "H100": 1})
    assert products_of(snap, admit(snap, g, profile(), ranked).placements) == {"A100"}


# --- 3. the nominal-quota rule ------------------------------------------------------------------

def test_a_gang_may_preempt_only_if_it_fits_within_nominal_quota():
    # Kueue TestSchedule "A workload is only eligible to do preemptions if it fits fully within
    # nominal quota": alpha and beta have 2 each in one cohort; a1 (alpha, -1) and b1 (beta, -1) use
    # 1 each; incoming (alpha, 1) asks 3: it may not preempt a1 to borrow
    def book(beyond: bool = False) -> QuotaBook:
        return QuotaBook({"alpha": TeamQuota.from_gpus("alpha", {"H100": 2}, {"H100": 2},
                                                       preempt_beyond_nominal=beyond),
                          "beta": TeamQuota.from_gpus("beta", {"H100": 2}, {"H100": 2})})

    snap = Snapshot.from_nodes(cluster(1, gpus=4))
    running = [start(snap, gang("a1", 1, 1, priority=-1, team="alpha"), profile()),
               start(snap, gang("b1", 1, 1, priority=-1, team="beta"), profile())]
    incoming = gang("incoming", 3, 1, priority=1, team="alpha")
    plan, why = plan_preemption(CycleState.build(snap, running, book()), incoming, profile(), 0.0)
    assert plan is None and "nominal quota" in why, why
    res = schedule_cycle(CycleState.build(snap, running, book()), [incoming], profile(), 0.0)
    assert res.preemptions == [] and res.admitted == []
    # the team's documented option keeps the older behaviour: it preempts its own a1 to borrow
    plan, why = plan_preemption(CycleState.build(snap, running, book(beyond=True)), incoming, profile(), 0.0)
    assert plan is not None and plan.victim_names == ("a1",) and plan.borrowed, why


def test_the_nominal_rule_keeps_preemption_to_the_products_within_it():
    # t: 8 H100, 2 A100 nominal; both full of t's own low-priority work. A gang of 4 fits the nominal
    # quota on H100 only: it preempts there even though A100 is its first choice.
    qb = QuotaBook({"t": TeamQuota.from_gpus("t", {"H100": 8, "A100": 2}, {"A100": 8})})
    snap = two_generations(h100_gpus=8, a100_gpus=8)
    running = [fill(snap, "low-h", 8, "H100", team="t"), fill(snap, "low-a", 8, "A100", team="t")]
    g = gang("g", 1, 4, priority=100, team="t", products=("A100", "H100"))
    plan, why = plan_preemption(CycleState.build(snap, running, qb), g, profile(), 0.0)
    assert plan is not None and plan.victim_names == ("low-h",) and plan.gang is g, why
    assert products_of(snap, plan.placements) == {"H100"}

"""core.visibility / core.estimate.estimate_starts: the queue as the scheduler publishes it, computed
from its own cycle (profile, quota book, reservation): positions, reasons and estimated starts."""

from __future__ import annotations

from dataclasses import replace

from fixtures.core_gang import cluster, gang, profile, start, state_of

from airflow_gpu.core.preemption import PreemptionPolicy
from airflow_gpu.core.estimate import NOTE_NEVER, NOTE_NO_END, NOTE_NOT_ESTIMATED, NOTE_PREEMPTING, estimate_starts
from airflow_gpu.core.reservation import estimate_start
from airflow_gpu.core.queue import schedule_cycle
from airflow_gpu.core.quota import QuotaBook, TeamQuota
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.visibility import cluster_picture, waiting_entries

NOW = 1000.0


def timed(g, seconds):
    return replace(g, expected_duration=seconds)


def cycle(snap, running, pending, book=None, policy=PreemptionPolicy()):
    state = state_of(snap, running, book)
    result = schedule_cycle(state, pending, profile(), NOW, policy)
    return state, result


def test_a_quota_blocked_gang_starts_when_its_own_teams_gang_ends_not_when_capacity_frees():
    snap = Snapshot.from_nodes(cluster(4, gpus=8))
    book = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}), "b": TeamQuota.from_gpus("b", {"H100": 32})},
                     )
    # team a uses its 8 GPUs until t=5000; team b's work ends at 2000 (capacity frees first)
    a_run = start(snap, timed(gang("a-run", 1, 8, team="a", created_at=1), 4000), profile(), at=NOW)
    b_run = start(snap, timed(gang("b-run", 1, 8, team="b", created_at=2), 1000), profile(), at=NOW)
    b_two = start(snap, timed(gang("b-two", 2, 8, team="b", created_at=3), 1000), profile(), at=NOW)
    blocked = timed(gang("a-next", 1, 8, team="a", created_at=10), 100)
    state, result = cycle(snap, [a_run, b_run, b_two], [blocked], book)
    assert "quota" in result.waiting["a-next"]
    # capacity-only estimate (what the page used to show): when b's gangs end
    assert estimate_start(state.snap, blocked, state.running, profile(), NOW).start == 2000.0
    est = estimate_starts(state, [blocked], result, profile(), NOW)["a-next"]
    assert est.start == 5000.0 and est.note == "" and len(est.nodes) == 1


def test_head_reservation_is_the_cycles_and_the_gangs_behind_respect_it_conservatively():
    snap = Snapshot.from_nodes(cluster(2, gpus=8))
    r1 = start(snap, timed(gang("r1", 1, 8, created_at=1), 1000), profile(), at=NOW)  # ends 2000
    r2 = start(snap, timed(gang("r2", 1, 8, created_at=2), 3000), profile(), at=NOW)  # ends 4000
    head = timed(gang("head", 2, 8, created_at=10), 500)  # both nodes: at 4000, until 4500
    short = timed(gang("short", 1, 8, created_at=11), 1500)  # 2000 + 1500 <= 4000: backfills at 2000
    long = timed(gang("long", 1, 8, created_at=12), 5000)  # would delay the head: after it, at 4500
    state, result = cycle(snap, [r1, r2], [head, short, long])
    assert result.reservation.gang.name == "head" and result.reservation.start == 4000.0
    est = estimate_starts(state, [head, short, long], result, profile(), NOW)
    assert est["head"].start == 4000.0 and est["head"].nodes == ("n0000", "n0001")
    assert est["short"].start == 2000.0
    assert est["long"].start == 4500.0


def test_notes_unknown_end_never_fits_limit_and_preempting():
    snap = Snapshot.from_nodes(cluster(1, gpus=8))
    forever = start(snap, gang("forever", 1, 8, created_at=1), profile(), at=NOW)  # no expected duration
    waits = gang("waits", 1, 8, created_at=10)
    huge = gang("huge", 1, 16, created_at=11)
    third = gang("third", 1, 4, created_at=12)
    state, result = cycle(snap, [forever], [waits, huge, third])
    est = estimate_starts(state, [waits, huge, third], result, profile(), NOW, limit=2)
    assert (est["waits"].start, est["waits"].note) == (None, NOTE_NO_END)
    assert (est["huge"].start, est["huge"].note) == (None, NOTE_NEVER)
    assert est["third"].note == NOTE_NOT_ESTIMATED.format(limit=2)
    # a higher-priority gang preempts the running one: it starts now, once its victims are gone
    snap = Snapshot.from_nodes(cluster(1, gpus=8))
    victim = start(snap, replace(gang("victim", 1, 8, created_at=1), preemptible=True), profile(), at=NOW)
    urgent = gang("urgent", 1, 8, priority=100, created_at=10, tier="production-training")
    state, result = cycle(snap, [victim], [urgent])
    assert [p.gang.name for p in result.preemptions] == ["urgent"]
    (entry,) = waiting_entries(state, [urgent], result, profile(), NOW)
    assert (entry.estimated_start, entry.estimate_note, entry.nodes) == (NOW, NOTE_PREEMPTING, ("n0000",))
    assert entry.reason.startswith(result.waiting["urgent"][:20])


def test_entries_positions_per_cluster_and_team_and_deferred_reasons_and_the_picture():
    snap = Snapshot.from_nodes(cluster(2, gpus=8))
    run = start(snap, timed(gang("run", 1, 8, created_at=1), 100), profile(), at=NOW)
    pending = [gang("a1", 1, 8, team="a", created_at=10), gang("b1", 1, 8, team="b", created_at=11),
               gang("a2", 1, 8, team="a", created_at=12), gang("fits", 1, 8, team="b", priority=9, created_at=13)]
    state, result = cycle(snap, [run], pending)
    assert [d.gang.name for d in result.admitted] == ["fits"]  # admitted: not in the published queue
    result.waiting.pop("b1")
    result.deferred.append("b1")  # skipped in back-off: its last reason stands
    rows = waiting_entries(state, pending, result, profile(), NOW, reasons={"b1": "earlier reason"})
    assert [(r.gang, r.cluster_position, r.position) for r in rows] == [("a1", 1, 1), ("b1", 2, 1), ("a2", 3, 2)]
    assert rows[1].reason == "earlier reason" and rows[0].estimated_start == NOW + 100
    # a1 takes the node at 1100 for ever (no duration): the rest after unknown work
    assert rows[2].estimated_start is None and rows[2].estimate_note == NOTE_NO_END
    pic = cluster_picture(state.snap, ["n0000"], [m for g in pending for m in g.members])
    assert pic["gpus_total"] == 16 and pic["allocation_ratio"] == 0.5 and pic["nodes"][0]["held"]
    assert pic["nodes"][0]["gpus"] == [0] * 8 and not pic["nodes"][1]["held"]


def test_a_quota_blocked_gang_ahead_of_the_head_is_kept_off_the_heads_reserved_nodes():
    """The scheduler keeps every other gang off the head's reservation, gangs ahead of it in the queue
    too (a quota-blocked gang is never head): the estimate holds the reservation first."""
    snap = Snapshot.from_nodes(cluster(3, gpus=8))
    book = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}), "b": TeamQuota.from_gpus("b", {"H100": 32})})
    a_run = start(snap, timed(gang("a-run", 1, 8, team="a", created_at=1), 1000), profile(), at=NOW)  # ends 2000
    b_one = start(snap, timed(gang("b-one", 1, 8, team="b", created_at=2), 1000), profile(), at=NOW)  # ends 2000
    b_two = start(snap, timed(gang("b-two", 1, 8, team="b", created_at=3), 3000), profile(), at=NOW)  # ends 4000
    a_next = timed(gang("a-next", 1, 8, team="a", created_at=10), 100)  # quota: at 2000, when a-run ends
    head = timed(gang("b-head", 2, 8, team="b", created_at=11), 100)  # capacity: two nodes at 2000
    state, result = cycle(snap, [a_run, b_one, b_two], [a_next, head], book)
    assert "quota" in result.waiting["a-next"] and result.reservation.gang.name == "b-head"
    assert result.reservation.start == 2000.0
    est = estimate_starts(state, [a_next, head], result, profile(), NOW)
    assert est["b-head"].start == 2000.0 and set(est["b-head"].nodes) == set(result.reservation.nodes)
    # not on the head's nodes while it runs (2000-2100; the third node frees at 4000): after it, at 2100
    assert est["a-next"].start == 2100.0


def test_a_gang_accepting_two_products_is_published_with_the_product_it_is_expected_to_start_on():
    """Issue 29: the queue says on which product a waiting multi-product gang is expected to start (the
    product of the nodes of its estimate: its pod sets stay on one product)."""
    snap = Snapshot.from_nodes(cluster(1, gpus=8, product="H100", prefix="h")
                               + cluster(1, gpus=8, product="A100", prefix="a"))
    on_h100 = start(snap, timed(gang("h-run", 1, 8, created_at=1, products=("H100",)), 4000), profile(), at=NOW)
    on_a100 = start(snap, timed(gang("a-run", 1, 8, created_at=2, products=("A100",)), 1000), profile(), at=NOW)
    both = timed(gang("both", 1, 8, created_at=10, products=("H100", "A100")), 500)  # H100 preferred
    only_h100 = timed(gang("only-h100", 1, 8, created_at=11, products=("H100",)), 500)
    state, result = cycle(snap, [on_h100, on_a100], [both, only_h100])
    rows = {r.gang: r for r in waiting_entries(state, [both, only_h100], result, profile(), NOW)}
    # the A100 node frees first (2000): the gang that accepts both starts there, not on its first product
    assert (rows["both"].estimated_start, rows["both"].expected_products) == (2000.0, ("A100",))
    assert rows["both"].products == ("A100", "H100")
    assert (rows["only-h100"].estimated_start, rows["only-h100"].expected_products) == (5000.0, ("H100",))
    assert rows["both"].as_dict()["expected_products"] == ["A100"]


def test_gangs_ending_together_are_released_together_and_the_queue_behind_follows_them():
    """A sweep: four running gangs started together with one duration end at 2000, four more at
    3000. The estimates release each group at once (core.estimate._ShapeRoom.span): the first four
    waiting gangs start at 2000 on the room the first group leaves, the next two at 3000, the gangs
    ahead held where they start (conservative backfilling)."""
    snap = Snapshot.from_nodes(cluster(4, gpus=8))
    running = [start(snap, timed(gang(f"sweep-{i}", 1, 4, created_at=i), 1000 if i < 4 else 2000), profile(), at=NOW)
               for i in range(8)]
    waiting = [timed(gang(f"next-{i}", 1, 4, created_at=100 + i), 10_000) for i in range(6)]
    state, result = cycle(snap, running, waiting)
    assert not result.admitted
    est = estimate_starts(state, waiting, result, profile(), NOW)
    assert [est[g.name].start for g in waiting] == [2000.0] * 4 + [3000.0] * 2
    first = {r.placements[0].node for r in running[:4]}
    assert {n for g in waiting[:4] for n in est[g.name].nodes} == first

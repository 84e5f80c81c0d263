"""core/holding.py composed as the replay's cycle composes it (reserve -> the queue's cycle ->
after): a lone share that strands capacity is held (reserved, not bound), bound at its reserved place when its time is up, displaced by a whole-GPU pod that
fits nowhere (then pending again), never held when it is a gang member or when the budget is 0."""

from __future__ import annotations

from airflow_gpu.core.backoff import Backoff
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.model import Gang, Node, PodRequest
from airflow_gpu.core.plugins.fgd import TypicalPods
from airflow_gpu.core.policies import make_profile
from airflow_gpu.core.preemption import PreemptionPolicy
from airflow_gpu.core.queue import Queue
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.holding import PlacementHolds


def share(name: str, milli: int = 810) -> PodRequest:
    return PodRequest(name, cpu_milli=3000, memory_mib=4096, gpu_milli=milli)


def whole(name: str) -> PodRequest:
    return PodRequest(name, cpu_milli=8000, memory_mib=8192, gpus=1)


def lone(pod: PodRequest, at: float = 0.0, priority: int = 0) -> Gang:
    return Gang(pod.name, "t", "inference", priority, (pod,), created_at=at)


# a workload of 810-milli shares and whole GPUs: a lone 810 strands 190 milli nothing fills
TYPICAL = TypicalPods.from_pods([share(f"s{i}") for i in range(3)] + [whole(f"w{i}") for i in range(7)])
NODES = [Node(n, cpu_milli=32_000, memory_mib=65_536, gpu_count=1, gpu_product="A100") for n in ("a", "b")]


class Harness:
    """Bound pods stay in `running` (a placement each); every cycle builds its state from them."""

    def __init__(self, budget: float = 0.5, seconds: float = 60.0):
        self.profile = make_profile("fgd-lookahead", typical=TYPICAL, prefer_products=False)
        self.queue = Queue(self.profile, PreemptionPolicy(), Backoff(0.001, 0.001))
        self.holds = PlacementHolds(budget, seconds)
        self.holds.typical = TYPICAL
        self.running = {}

    def cycle(self, pending: list[Gang], now: float, lone_names=None):
        snap = Snapshot.from_nodes(NODES)
        for p in self.running.values():
            snap.assume(p)
        state = CycleState(snap, node_product=snap.shape.node_product)
        pending = [g for g in pending if g.members[0].name not in self.running]
        units = {g.name for g in pending} if lone_names is None else set(lone_names)
        queued, holds = self.holds.reserve(state, pending, now)
        result = self.queue.cycle(state, queued, now)
        holds = self.holds.after(state, result.admitted, [g for g in queued if g.name in result.waiting],
                                 units, self.profile, now, holds)
        bound = [d.placements[0] for d in result.admitted if d.gang.name not in holds.kept]
        bound += [h.placement for h in holds.bind]
        for p in bound:
            self.running[p.pod] = p
        return {p.pod: p.node for p in bound}, holds


def test_a_stranding_share_is_held_then_bound_where_it_was_reserved_at_its_time():
    h = Harness()
    s = lone(share("s"))
    bound, holds = h.cycle([s], now=1000.0)
    assert bound == {} and holds.kept == {"s"} and [x.gang.name for x in holds.held] == ["s"]
    assert holds.held[0].until == 1060.0  # 1000 + 60 s
    node = holds.held[0].placement.node
    bound, holds = h.cycle([s], now=1059.0)  # still held: its room stays reserved, nothing else is placed
    assert bound == {} and "s" in h.holds
    bound, holds = h.cycle([s], now=1060.0)
    assert bound == {"s": node} and holds.held == [] and "s" not in h.holds


def test_a_whole_gpu_pod_that_fits_nowhere_displaces_the_held_share_which_queues_again():
    h = Harness()
    s, w0, w1 = lone(share("s")), lone(whole("w0")), lone(whole("w1"))
    h.cycle([s], now=0.0)
    held_on = next(iter(h.holds._held.values())).placement.node
    bound, holds = h.cycle([s, w0], now=10.0)  # w0 takes the other node; s keeps its reserved room
    assert set(bound) == {"w0"} and bound["w0"] != held_on and "s" in h.holds
    bound, holds = h.cycle([s, w1], now=20.0)  # w1 fits nowhere but where s is held
    assert bound == {"w1": held_on} and [x.gang.name for x in holds.displaced] == ["s"] and "s" not in h.holds
    bound, holds = h.cycle([s], now=30.0)  # s is pending again, and there is no room left for it
    assert bound == {} and holds.held == []


def test_gang_members_are_never_held_and_a_zero_budget_holds_nothing():
    h = Harness()
    bound, holds = h.cycle([lone(share("s"))], now=0.0, lone_names=())  # not a lone pod: a gang's member
    assert set(bound) == {"s"} and holds.kept == set()
    off = Harness(budget=0.0)
    bound, holds = off.cycle([lone(share("s"))], now=0.0)
    assert set(bound) == {"s"} and holds.kept == set() and not off.holds.enabled


def test_a_held_pod_no_longer_pending_is_forgotten():
    h = Harness()
    h.cycle([lone(share("s"))], now=0.0)
    bound, holds = h.cycle([], now=5.0)  # deleted (or bound by someone else) while held
    assert bound == {} and holds.held == [] and "s" not in h.holds


def test_a_pod_of_lower_priority_does_not_displace_a_held_one():
    h = Harness()
    s, w0, w1 = lone(share("s"), priority=10), lone(whole("w0")), lone(whole("w1"))
    h.cycle([s], now=0.0)
    h.cycle([s, w0], now=10.0)
    bound, holds = h.cycle([s, w1], now=20.0)  # w1 (priority 0) fits nowhere but s (10) keeps its room
    assert bound == {} and holds.displaced == [] and "s" in h.holds

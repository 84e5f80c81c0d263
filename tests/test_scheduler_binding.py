"""The binding cycle off the scheduling cycle (issue 31; scheduler/binding.py): a cycle returns before
its Bindings are answered and the next neither decides the gang again nor places another gang on
its assumed GPUs; a failed Binding is forgotten and the plan completed or rolled back as after a
crash; a late wait reason never lands after the bound annotations; stop() waits for bindings in
flight. The writes' ordering and bound as units (no cluster), the rest on the local cluster with
the Bindings held back by a slow wrapper of the scheduler's Api (the API server itself is real)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from contextlib import contextmanager

from kubernetes import client
from kubernetes.client.rest import ApiException
from test_scheduler_gangs import _quota_config
from test_scheduler_semantics import api, kube_spec  # noqa: F401 - fixtures: the same cluster, 2 nodes x 8 GPUs

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.devtools import gangs as G
from airflow_gpu.scheduler.actions import Api
from airflow_gpu.scheduler.binding import Writes
from airflow_gpu.scheduler.loop import Scheduler, Settings
from airflow_gpu.scheduler.state import Plan


# --- the writes' ordering and bound, without a cluster --------------------------------------------
def _recorder():
    done: list[str] = []
    return done, lambda what: (lambda: done.append(what))


def test_a_wait_reason_queued_before_a_binding_is_dropped_and_the_latest_value_wins():
    writes = Writes(write_workers=1, gang_workers=1)
    done, record = _recorder()
    hold = threading.Event()
    writes.write("status", "ns/other", 1, hold.wait)  # the one write worker is busy: the rest queue
    writes.write("reason", "ns/g", "waiting 1", record("g waiting 1"))
    writes.write("reason", "ns/g", "waiting 2", record("g waiting 2"))  # replaces the queued one
    writes.write("reason", "ns/h", "waiting", record("h waiting"))
    writes.write("reason", "ns/h", "waiting", record("h duplicate"))  # the same value is queued once
    writes.write("status", "ns/g", "Pending", record("g pending"))
    # g is admitted: its binding tells the owner as a wait reason is written
    writes.bind("ns/g", lambda: writes.write("bound", "ns/g", "bound", record("g bound")))
    hold.set()
    writes.shutdown()
    assert done == ["h waiting", "g bound"]  # g's queued reason and status were decided before it was admitted


def test_bound_annotations_land_after_a_wait_reason_being_written():
    writes = Writes(write_workers=2, gang_workers=1)
    done, record = _recorder()
    entered, release = threading.Event(), threading.Event()

    def slow_wait():
        entered.set()
        release.wait(10)
        done.append("waiting")

    writes.write("reason", "ns/g", "waiting", slow_wait)
    assert entered.wait(5)
    writes.bind("ns/g", lambda: writes.write("bound", "ns/g", "bound", record("bound")))
    time.sleep(0.3)
    assert done == [] and writes.binding() == frozenset()  # bound, and its annotations wait for the write
    release.set()
    writes.shutdown()
    assert done == ["waiting", "bound"]


def test_bindings_in_flight_are_bounded_and_one_more_waits_for_room():
    writes = Writes(write_workers=1, gang_workers=1, max_binding=2)
    release = threading.Event()
    writes.bind("ns/a", lambda: release.wait(10))
    writes.bind("ns/b", lambda: None)  # queued behind a: two in flight
    third = threading.Thread(target=writes.bind, args=("ns/c", lambda: None))
    third.start()
    third.join(0.3)
    assert third.is_alive() and writes.binding() == {"ns/a", "ns/b"}
    release.set()
    third.join(5)
    assert not third.is_alive()
    writes.shutdown()
    assert writes.binding() == frozenset()


def test_room_counts_the_bindings_in_flight_and_wait_room_returns_once_there_is_enough():
    writes = Writes(write_workers=1, gang_workers=1, max_binding=2)
    release = threading.Event()
    writes.bind("ns/a", lambda: release.wait(10))
    assert writes.room() == 1 and not writes.wait_room(2, 0.2)
    release.set()
    assert writes.wait_room(2, 5) and writes.room() == 2
    writes.shutdown()


def test_a_binding_that_raises_still_ends():
    writes = Writes(write_workers=1, gang_workers=1, max_binding=1)
    writes.bind("ns/a", lambda: 1 / 0)
    writes.bind("ns/b", lambda: None)  # would wait forever if a's slot were not given back
    writes.shutdown()
    assert writes.binding() == frozenset()


# --- on the local cluster ---------------------------------------------------------------------------
class SlowBinds:
    """The scheduler's Bindings held until `gate` is set (a loaded API server answering late), each
    sent Binding counted; `fail` answers a pod's next Binding with that status instead."""

    def __init__(self, api: Api, delay: float = 0.0):
        self.real, self.delay = api.bind, delay
        self.gate = threading.Event()
        self.calls: Counter[str] = Counter()
        self.answered: list[float] = []
        self.fail: dict[str, int] = {}
        api.bind = self

    def __call__(self, pod_key: str, node: str, uid: str | None = None) -> str:
        self.calls[pod_key] += 1
        self.gate.wait(30)
        time.sleep(self.delay)
        try:
            if pod_key in self.fail:
                raise ApiException(status=self.fail.pop(pod_key), reason="injected by the test")
            return self.real(pod_key, node, uid)
        finally:
            self.answered.append(time.monotonic())


@contextmanager
def cycles(kube_cluster, name: str, config=None, max_binding: int | None = None):
    """A Scheduler whose cycles the test runs one by one (its cache started, nothing else)."""
    s = Scheduler(G.api_client(kube_cluster.kubeconfig), config, Settings(), identity=name)
    if max_binding is not None:
        s.writes = Writes(write_workers=Settings().bind_workers, max_binding=max_binding)
    s.cache.start()
    assert s.cache.wait_synced(30)
    try:
        yield s
    finally:
        if isinstance(s.api.bind, SlowBinds):
            s.api.bind.gate.set()
        s.writes.shutdown()
        s._pool.shutdown(wait=True)
        s.cache.stop()


def _seen(s: Scheduler, ns: str, *names: str) -> None:
    """The pods in the scheduler's cache, and their PodGroups: each kind has its own watch, and a
    loaded machine can deliver a pod before its group (the gang then waits for its PodGroup)."""
    def seen() -> bool:
        view = s.cache.view()
        pods = [view.pods.get(f"{ns}/{n}") for n in names]
        groups = {(p["metadata"].get("labels") or {}).get(C.LABEL_COSCHEDULING_POD_GROUP) for p in pods if p}
        return all(pods) and all(f"{ns}/{g}" in view.podgroups for g in groups if g)
    G.wait_until(seen, 10, interval=0.02, what="pods and their PodGroups in the scheduler's cache")


def _settled(s: Scheduler) -> None:
    G.wait_until(lambda: not s.writes.binding(), 30, interval=0.02, what="bindings ended")


def _records(api, ns: str) -> dict[str, Plan]:
    resp = client.CoreV1Api(api).list_namespaced_config_map(
        "default", label_selector=f"{C.LABEL_PLAN_OF}={C.DEFAULT_SCHEDULER_NAME}", _preload_content=False)
    plans = [Plan.from_json(cm["data"][C.PLAN_DATA_KEY]) for cm in json.loads(resp.data)["items"]]
    return {p.owner_key: p for p in plans if p.owner_key.startswith(f"{ns}/")}


def _clean(api, ns: str, s: Scheduler | None = None) -> None:
    """Delete the namespace's pods; with `s`, until its cache has seen them go too (a loaded machine
    delivers the watch's DELETED events later than the API answers)."""
    client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    G.wait_until(lambda: not G.list_pods(api, ns), 30, what="pods deleted")
    if s is not None:
        G.wait_until(lambda: not any(k.startswith(f"{ns}/") for k in s.cache.view().pods), 30, interval=0.02,
                     what="pods gone from the scheduler's cache")


def _evicted(api, ns: str, name: str) -> bool:
    pod = {p["metadata"]["name"]: p for p in G.list_pods(api, ns)}.get(name)
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


def _nodes(api, ns: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in G.list_pods(api, ns)}


def test_a_cycle_returns_before_its_bindings_are_answered_and_the_next_never_decides_the_gang_again(
        kube_cluster, api):
    ns = "bind-slow"
    G.ensure_namespace(api, ns)
    try:
        with cycles(kube_cluster, "bind-slow") as s:
            binds = SlowBinds(s.api)
            a = G.create_gang(api, ns, "a", 2, 8, sim_seconds=120)  # every GPU of the cluster
            _seen(s, ns, *a)
            t0 = time.monotonic()
            s.cycle()
            assert time.monotonic() - t0 < 15  # the Bindings wait 30 s for the gate
            assert s.writes.binding() == {f"{ns}/a"}
            G.wait_until(lambda: sum(binds.calls.values()) == 2, 10, interval=0.02, what="both Bindings sent")
            assert not any(_nodes(api, ns).values())  # none answered yet
            b = G.create_gang(api, ns, "b", 1, 8, sim_seconds=120)
            _seen(s, ns, *b)
            for _ in range(3):
                s.cycle()
            # a is not decided again, b is not placed on a's assumed GPUs, a's plan record is its
            # binding's (a cycle that took it for a finished one would have closed it)
            assert set(binds.calls) == {f"{ns}/{p}" for p in a}
            assert list(_records(api, ns)) == [f"{ns}/a"]
            binds.gate.set()
            _settled(s)
            s.cycle()
            _settled(s)
            state = G.gang_binding_state(G.list_pods(api, ns))
            assert state == {f"{ns}/a": (2, 2), f"{ns}/b": (0, 1)}, state
            assert binds.calls == Counter({f"{ns}/{p}": 1 for p in a})
            assert _records(api, ns) == {} and G.overcommitted_nodes(api) == {}
            G.wait_until(lambda: (G.get_podgroup(api, ns, "b")["metadata"].get("annotations") or {})
                         .get(C.ANNOTATION_WAIT_REASON), 10, what="b's wait reason written")
            assert s.metrics.registry.get_sample_value("airflow_gpu_bindings_total") == 2
    finally:
        _clean(api, ns)


def test_a_failed_binding_is_forgotten_and_the_plan_completed_or_rolled_back(kube_cluster, api):
    ns = "bind-fail"
    G.ensure_namespace(api, ns)
    core = client.CoreV1Api(api)
    try:
        with cycles(kube_cluster, "bind-fail") as s:
            binds = SlowBinds(s.api)
            binds.gate.set()
            a = G.create_gang(api, ns, "a", 2, 8, sim_seconds=120)
            _seen(s, ns, *a)
            binds.fail[f"{ns}/{a[1]}"] = 500  # a transient failure of one member's Binding
            s.cycle()
            _settled(s)
            assert f"{ns}/{a[1]}" not in s.cache.view().assumed  # forgotten: pending again
            planned = _records(api, ns)[f"{ns}/a"].placements[f"{ns}/{a[1]}"].node
            assert G.gang_binding_state(G.list_pods(api, ns))[f"{ns}/a"] == (1, 2)
            s.cycle()  # completes the plan: the member binds where it said
            _settled(s)
            assert _nodes(api, ns)[a[1]] == planned
            assert G.gang_binding_state(G.list_pods(api, ns))[f"{ns}/a"] == (2, 2) and _records(api, ns) == {}
            get = s.metrics.registry.get_sample_value
            assert get("airflow_gpu_partial_gang_recoveries_total", {"action": "completed"}) == 1
            _clean(api, ns, s)

            # the same failure, then the member's planned GPUs taken by a pod of another scheduler:
            # the plan cannot be completed, so the bound member is evicted and the gang waits whole
            c = G.create_gang(api, ns, "c", 2, 8, sim_seconds=120)
            _seen(s, ns, *c)
            binds.fail[f"{ns}/{c[1]}"] = 500
            s.cycle()
            _settled(s)
            planned = _records(api, ns)[f"{ns}/c"].placements[f"{ns}/{c[1]}"].node
            core.create_namespaced_pod(ns, G.pod_manifest("foreign", ns, 8, scheduler_name="other-scheduler",
                                                           sim_seconds=120), _preload_content=False).data
            Api(api, "test", "other-scheduler").bind(f"{ns}/foreign", planned)
            _seen(s, ns, "foreign")
            G.wait_until(lambda: s.cache.view().pods[f"{ns}/foreign"]["spec"].get("nodeName"), 10, interval=0.02,
                         what="the foreign pod's binding in the cache")
            s.cycle()
            _settled(s)
            G.wait_until(lambda: _evicted(api, ns, c[0]), 20, what="the bound member of the plan that cannot be "
                                                                   "completed evicted")
            assert get("airflow_gpu_partial_gang_recoveries_total", {"action": "rolled_back"}) == 1
            assert _records(api, ns) == {}
            assert ("c", "RolledBack") in {(e["involvedObject"]["name"], e["reason"]) for e in G.events_for(api, ns)}
    finally:
        _clean(api, ns)


def test_a_late_wait_reason_never_lands_after_the_bound_annotations(kube_cluster, api):
    """w's wait reason is being written (held by the test) when room appears and w is admitted: its
    binding writes "bound" after the late "waiting", never before."""
    ns = "bind-race"
    G.ensure_namespace(api, ns)
    try:
        with cycles(kube_cluster, "bind-race") as s:
            entered, release = threading.Event(), threading.Event()
            real = s.api.patch_podgroup_annotations

            def slow_wait_reason(key, annotations):
                if annotations.get(C.ANNOTATION_WAIT_REASON) and key == f"{ns}/w":
                    entered.set()
                    release.wait(20)
                return real(key, annotations)

            s.api.patch_podgroup_annotations = slow_wait_reason
            x = G.create_gang(api, ns, "x", 2, 8, sim_seconds=120)
            _seen(s, ns, *x)
            s.cycle()
            _settled(s)
            w = G.create_gang(api, ns, "w", 1, 8, sim_seconds=120)
            _seen(s, ns, *w)
            s.cycle()  # w does not fit: its wait reason goes out, and is held
            assert entered.wait(10)
            client.CoreV1Api(api).delete_namespaced_pod(x[0], ns, grace_period_seconds=0)
            G.wait_until(lambda: f"{ns}/{x[0]}" not in s.cache.view().pods, 10, interval=0.02, what="x-0 gone")
            s.cycle()  # w is admitted on x-0's GPUs while its wait reason is still being written
            assert s.writes.binding() == {f"{ns}/w"}
            G.wait_until(lambda: _nodes(api, ns).get(w[0]), 10, interval=0.02, what="w bound")
            release.set()
            _settled(s)
            s.writes.shutdown()  # every write done
            annotations = G.get_podgroup(api, ns, "w")["metadata"].get("annotations") or {}
            assert C.ANNOTATION_WAIT_REASON not in annotations, annotations
            assert annotations.get(C.ANNOTATION_SCHEDULED) == "1/1", annotations
    finally:
        _clean(api, ns)


class Elector:
    """Leadership as the test says (the Lease's own tests are test_scheduler_recovery and _leader_load)."""

    renew_deadline = 0.1

    def __init__(self):
        self.leading = True

    def is_leader(self) -> bool:
        return self.leading

    def wait_renewed(self, timeout: float) -> bool:
        return self.leading


def test_a_binding_is_refused_by_the_fence_once_leadership_is_lost_and_a_standby_starts_none(kube_cluster, api):
    ns = "bind-fence"
    G.ensure_namespace(api, ns)
    try:
        with cycles(kube_cluster, "bind-fence") as s:
            s.elector = elector = Elector()
            entered, release = threading.Event(), threading.Event()
            real = s.api.write_plan

            def slow_plan(*args):
                entered.set()
                release.wait(20)
                return real(*args)

            s.api.write_plan = slow_plan
            a = G.create_gang(api, ns, "a", 2, 8, sim_seconds=120)
            _seen(s, ns, *a)
            s.cycle()
            assert entered.wait(10)  # the binding is writing its plan record...
            elector.leading = False  # ...when the Lease is lost: its Bindings meet the fence
            release.set()
            _settled(s)
            get = s.metrics.registry.get_sample_value
            assert get("airflow_gpu_scheduler_fence_refusals_total") == 2
            assert not any(_nodes(api, ns).values())
            assert not (set(s.cache.view().assumed) & {f"{ns}/{p}" for p in a})  # forgotten
            for _ in range(2):
                s.cycle()  # a standby: decides nothing, starts no binding
                assert s.writes.binding() == frozenset()
            assert not any(_nodes(api, ns).values())
            elector.leading = True
            s.cycle()  # the leader again: the plan record is completed where it said
            _settled(s)
            assert G.gang_binding_state(G.list_pods(api, ns))[f"{ns}/a"] == (2, 2)
            assert get("airflow_gpu_partial_gang_recoveries_total", {"action": "completed"}) is None  # none was bound
    finally:
        _clean(api, ns)


def test_stop_waits_for_the_bindings_in_flight(kube_cluster, api):
    ns = "bind-stop"
    G.ensure_namespace(api, ns)
    s = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(bind_workers=1), identity="bind-stop")
    binds = SlowBinds(s.api, delay=1.0)  # one Binding at a time, each answered a second late
    binds.gate.set()
    runner = threading.Thread(target=s.run, daemon=True)
    runner.start()
    try:
        a = G.create_gang(api, ns, "a", 2, 8, sim_seconds=120)
        G.wait_until(lambda: binds.calls, 20, interval=0.02, what="the first Binding sent")
        s.stop()
        runner.join(30)
        returned = time.monotonic()
        assert not runner.is_alive()
        assert len(binds.answered) == 2 and max(binds.answered) <= returned  # run() returned after both
        assert G.gang_binding_state(G.list_pods(api, ns))[f"{ns}/a"] == (2, 2)  # never cut in half
        assert _records(api, ns) == {} and s.writes.binding() == frozenset()
        assert a
    finally:
        s.stop()
        runner.join(10)
        _clean(api, ns)


def test_a_cycle_admits_no_more_than_can_bind_and_leaves_the_rest_of_the_queue_to_the_next(kube_cluster, api, tmp_path):
    """The most gangs binding at once are binding: the cycle's queue stops at its admission limit
    (the room: here none) and the cycle does not wait: the gang that fits stays pending (nothing
    assumed, nothing written) and the gang behind it plans no preemption; the next cycles with room
    do both."""
    ns = "bind-full"
    G.ensure_namespace(api, ns)
    cfg = load_config(_quota_config(tmp_path, [{"name": "t", "namespace": ns, "quota": {"h100": 16}}]))
    production, best_effort = "airflow-gpu-production-training", "airflow-gpu-best-effort-training"
    try:
        with cycles(kube_cluster, "bind-full", cfg, max_binding=1) as s:
            binds = SlowBinds(s.api)
            binds.gate.set()
            low = G.create_gang(api, ns, "low", 1, 8, priority_class=best_effort, sim_seconds=300)
            _seen(s, ns, *low)
            s.cycle()
            _settled(s)
            G.wait_until(lambda: _nodes(api, ns).get(low[0]), 10, what="low bound")
            binds.gate.clear()  # from here a binding waits: the one slot is taken
            a = G.create_gang(api, ns, "a", 1, 4, priority_class=best_effort, sim_seconds=300)
            _seen(s, ns, *a)
            s.cycle()
            assert s.writes.binding() == {f"{ns}/a"}
            b = G.create_gang(api, ns, "b", 1, 4, priority_class=production, sim_seconds=300)
            h = G.create_gang(api, ns, "h", 1, 8, priority_class=production, sim_seconds=300)  # only by preempting low
            _seen(s, ns, *b, *h)
            t0 = time.monotonic()
            s.cycle()
            assert time.monotonic() - t0 < 15  # did not wait for a's binding (held 30 s)
            get = s.metrics.registry.get_sample_value
            assert f"{ns}/{b[0]}" not in s.cache.view().assumed and s.writes.binding() == {f"{ns}/a"}
            time.sleep(1)
            assert not _evicted(api, ns, low[0]) and get("airflow_gpu_evicted_pods_total") in (None, 0)
            for name in ("b", "h"):  # not tried: no wait reason either
                annotations = G.get_podgroup(api, ns, name)["metadata"].get("annotations") or {}
                assert C.ANNOTATION_WAIT_REASON not in annotations, (name, annotations)
            binds.gate.set()
            _settled(s)
            for _ in range(2):  # room for one: b, then h's preemption
                s.cycle()
                _settled(s)
            G.wait_until(lambda: _evicted(api, ns, low[0]), 20, what="low preempted for h")
            G.wait_until(lambda: _nodes(api, ns).get(b[0]), 20, what="b bound")
            assert set(binds.calls) == {f"{ns}/{p}" for p in low + a + b}  # b once, when there was room
            assert G.overcommitted_nodes(api) == {}
    finally:
        _clean(api, ns)


def test_a_podgroup_that_arrived_in_a_failed_cycle_still_gets_its_status(kube_cluster, api, monkeypatch):
    """The cycle looks at a PodGroup's status only where its unit changed since the World before; a
    cycle that failed before the statuses leaves its changes unseen, so the next one looks at every
    PodGroup again."""
    ns = "status-missed"
    G.ensure_namespace(api, ns)
    try:
        with cycles(kube_cluster, "status-missed") as s:
            first = G.create_gang(api, ns, "first", 3, 8)  # more GPUs than the cluster has: it waits
            _seen(s, ns, *first)
            s.cycle()
            G.wait_until(lambda: (G.get_podgroup(api, ns, "first").get("status") or {}).get("phase"), 10,
                         interval=0.05, what="first's PodGroup status written")
            G.wait_until(lambda: ((s.cache.view().podgroups.get(f"{ns}/first") or {}).get("status") or {})
                         .get("phase"), 10, interval=0.02, what="the status in the scheduler's cache")
            s.cycle()
            assert f"{ns}/first" in s._settled  # from here a cycle looks only at what changed
            big = G.create_gang(api, ns, "big", 3, 8)
            _seen(s, ns, *big)
            with monkeypatch.context() as m:
                m.setattr(s, "_handle_plans", lambda *a: (_ for _ in ()).throw(RuntimeError("a bad cycle")))
                try:
                    s.cycle()
                except RuntimeError:
                    pass
                else:
                    raise AssertionError("the cycle was to fail")
            assert not (G.get_podgroup(api, ns, "big").get("status") or {}).get("phase")
            s.cycle()  # nothing of `big` changed since the failed cycle
            G.wait_until(lambda: (G.get_podgroup(api, ns, "big").get("status") or {}).get("phase"), 10,
                         interval=0.05, what="big's PodGroup status written")
    finally:
        _clean(api, ns)

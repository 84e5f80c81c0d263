"""The scheduler against the local cluster (real API server, real pod processes): a 16-GPU gang is
never partially bound and is not starved by a stream of 1-GPU jobs; a production gang preempts the
whole best-effort gang that loses the least work, whose pods get SIGTERM and their grace period;
reclaim preempts a borrowing team."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.devtools import gangs as G
from airflow_gpu.scheduler.access import REQUIRED, access_of
from airflow_gpu.scheduler.loop import Scheduler, Settings

REPO = Path(__file__).resolve().parents[1]
PRODUCT = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "sched-gangs", "pools": [{"name": "h100", "count": 2, "cliques": ["c1"],
                                              "gpu": {"product": PRODUCT, "count": 8}}]}


@pytest.fixture(scope="module")
def api(kube_cluster):
    api = G.api_client(kube_cluster.kubeconfig)
    G.install_priority_classes(api)  # the tiers' PriorityClasses, as deploy/ installs them (best-effort: Never)
    return api


@pytest.fixture
def namespace(api):
    """A fresh namespace per test; its pods are deleted afterwards so the next test has the GPUs."""
    made = []

    def make(name: str) -> str:
        G.ensure_namespace(api, name)
        made.append(name)
        return name

    yield make
    core = client.CoreV1Api(api)
    for ns in made:
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    G.wait_until(lambda: not [p for ns in made for p in G.list_pods(api, ns)], 30, what="pods deleted")


BINDING_IN_FLIGHT = 2.0  # seconds a gang's parallel Bindings may be seen half done


def _bound_at(pods: list[dict]) -> dict[str, bool]:
    return {p["metadata"]["name"]: bool(p["spec"].get("nodeName")) for p in pods}


def test_16_gpu_gang_is_never_partial_and_not_starved_by_small_jobs(kube_cluster, api, namespace, tmp_path):
    ns = namespace("starve")
    core = client.CoreV1Api(api)
    # 4 + 4 GPUs busy for a few seconds (pinned to each node by hostname)
    for i in range(8):
        node = f"h100-{i % 2}"
        core.create_namespaced_pod(ns, G.pod_manifest(f"filler-{i}", ns, 1, sim_seconds=2.0 + 0.3 * i,
                                                      node_selector={"kubernetes.io/hostname": node}))
    sched = G.scheduler_process(kube_cluster.kubeconfig, tmp_path / "scheduler.log", identity="s1").start()
    try:
        G.wait_until(lambda: all(_bound_at(G.list_pods(api, ns)).values()), 30, what="fillers bound")
        G.create_gang(api, ns, "big", 2, 8, sim_seconds=2.0)
        gang_created = time.time()
        samples, stream, stop, small_reasons = [], [], threading.Event(), set()
        fillers_done = None

        def small_jobs():
            i = 0
            while not stop.is_set():
                core.create_namespaced_pod(ns, G.pod_manifest(f"small-{i}", ns, 1, sim_seconds=1.0))
                stream.append((f"small-{i}", time.time()))
                i += 1
                stop.wait(0.25)

        producer = threading.Thread(target=small_jobs, daemon=True)
        producer.start()
        gang_bound_at = None
        deadline = time.time() + 40
        while time.time() < deadline:
            pods = G.list_pods(api, ns)
            state = G.gang_binding_state(pods)[f"{ns}/big"]
            now = time.time()
            samples.append((now, state, {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods
                                         if p["metadata"]["name"].startswith("small-")}))
            if fillers_done is None and all(p["status"].get("phase") == "Succeeded" for p in pods
                                            if p["metadata"]["name"].startswith("filler-")):
                fillers_done = now  # the 16 GPUs are free from here on
            small_reasons.update((p["metadata"].get("annotations") or {}).get(C.ANNOTATION_WAIT_REASON, "")
                                 for p in pods if p["metadata"]["name"].startswith("small-"))
            if state[0] == 2 and gang_bound_at is None:
                gang_bound_at = now
            if gang_bound_at and now > gang_bound_at + 1.0:
                break
            time.sleep(0.1)
        stop.set()
        producer.join()
        assert gang_bound_at is not None, f"gang never bound:\n{sched.log_tail()}"
        # A gang's Bindings go out in parallel (as kube-scheduler's binding cycles do), so a list taken
        # between them sees it half bound; that lasts milliseconds, a few hundred on a loaded machine.
        # What must never happen is a half-bound gang that stays so: every sample of it is right
        # before the sample that sees it whole.
        partial = [s for s in samples if s[1][0] not in (0, 2)]
        lasting = [(round(gang_bound_at - s[0], 3), s[1]) for s in partial
                   if not s[0] < gang_bound_at <= s[0] + BINDING_IN_FLIGHT]
        assert not lasting, f"gang seen partially bound (seconds before it was whole, state): {lasting[:3]}"
        # no small job was bound while the gang waited: the freed GPUs were held for it
        before = [s for s in samples if s[0] < gang_bound_at]
        jumped = {name for _, _, small in before for name, node in small.items() if node}
        assert not jumped, f"small jobs took GPUs the gang was waiting for: {sorted(jumped)}"
        assert len(stream) >= 8  # the stream really ran while the gang waited
        # a waiting lone pod says why on itself (annotation the UI reads, and its Events)
        assert any(r.startswith(f"would delay {ns}/big") for r in small_reasons), small_reasons

        # the wait reason, in words, where users look
        pg = G.get_podgroup(api, ns, "big")
        reasons = [e for e in G.events_for(api, ns, "big") if e["reason"] == "FailedScheduling"]
        assert reasons and "needs 16 GPUs" in reasons[0]["message"], reasons
        described = kube_cluster.kubectl("describe", "podgroup", "big", "-n", ns).stdout
        assert "needs 16 GPUs" in described and "FailedScheduling" in described, described
        assert pg["status"]["phase"] in ("Running", "Scheduled", "Finished")
        assert C.ANNOTATION_WAIT_REASON not in (pg["metadata"].get("annotations") or {})  # cleared once bound
        print(f"\n16-GPU gang: waited {gang_bound_at - gang_created:.1f} s; bound {gang_bound_at - fillers_done:.2f} s "
              f"after the last filler was seen finished (0.1 s polls); {len(stream)} small jobs arrived meanwhile")
        # after the gang, the small jobs run too (nothing starves the other way either)
        G.wait_until(lambda: all(_bound_at([p for p in G.list_pods(api, ns)
                                            if p["metadata"]["name"] in dict(stream)]).values()),
                     30, what="small jobs bound after the gang")
    finally:
        sched.stop()


# The victims report over UDP to the test (MARKER=host:port): a pod's files stay in its own view.
SIGTERM_SCRIPT = r"""
import os, signal, socket, sys, time
host, port = os.environ["MARKER"].rsplit(":", 1)
out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def say(line):
    out.sendto(line.encode(), (host, int(port)))
def on_term(signum, frame):
    say(f"sigterm {time.time()}")
    time.sleep(1.0)  # checkpointing
    say(f"saved {time.time()}")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
say("started")
while True:
    time.sleep(0.1)
"""


class Marker:
    """Collects what SIGTERM_SCRIPT pods say; `address` goes into their MARKER env."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        while not self._stop.is_set():
            try:
                self._lines.append(self.sock.recv(4096).decode())
            except OSError:
                continue

    def lines(self) -> list[str]:
        return list(self._lines)

    def started(self, pods: int = 1) -> bool:
        """`pods` of them run their SIGTERM handler (a pod still starting Python would die unheard)."""
        return self._lines.count("started") >= pods

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()



def _quota_config(tmp_path: Path, teams: list[dict], preempting_tiers: tuple[str, ...] = ()) -> Path:
    seed = yaml.safe_load((REPO / "examples" / "seed-quotas.yaml").read_text())
    for tier in seed["tiers"]:
        if tier["name"] in preempting_tiers:
            tier.pop("preemption_policy", None)
    cfg = {"version": 1,
           "products": [{"name": "h100", "memory_gb": 80, "node_label": PRODUCT,
                         "price_per_gpu_hour": {"on_demand": 9.0, "spot": 3.0}}],
           "tiers": seed["tiers"], "teams": teams}
    path = tmp_path / "quotas.yaml"
    path.write_text(yaml.safe_dump(cfg))
    load_config(path)  # fail here, not in the scheduler, if the test config is wrong
    return path


class Recorder:
    """Every request the in-process scheduler makes, as RBAC terms."""

    def __init__(self, api_client: client.ApiClient):
        self.seen: set[tuple[str, str, str]] = set()
        original = api_client.rest_client.request

        def request(method, url, *a, **kw):
            self.seen.add(access_of(method, url))
            return original(method, url, *a, **kw)

        api_client.rest_client.request = request


def test_production_gang_preempts_the_whole_gang_losing_least_work(kube_cluster, api, namespace, tmp_path):
    ns = namespace("prod")
    cfg_path = _quota_config(tmp_path, [{"name": "ml", "namespace": ns, "quota": {"h100": 16}}])
    sched_client = G.api_client(kube_cluster.kubeconfig)
    recorder = Recorder(sched_client)
    from airflow_gpu.scheduler.leader import LeaseElector

    elector = LeaseElector(sched_client, "default", "sched-prod", "inproc", 3.0, 2.0, 0.5).start()
    scheduler = Scheduler(sched_client, load_config(cfg_path), Settings(), elector=elector, identity="inproc")
    runner = threading.Thread(target=scheduler.run, daemon=True)
    runner.start()
    marker = Marker()
    try:
        # four best-effort gangs of 2 x 2 GPUs fill the 16 GPUs; their checkpoints (all taken since
        # they started: an older one would count from the start) differ in age
        ages = {"be-a": 5, "be-b": 0, "be-c": 3, "be-d": None}
        for name, age in ages.items():
            ann = {C.ANNOTATION_CHECKPOINTABLE: "true" if age is not None else "false"}
            G.create_gang(api, ns, name, 2, 2, priority_class="airflow-gpu-best-effort-training", grace=5,
                          command=[sys.executable, "-c", SIGTERM_SCRIPT], annotations=ann,
                          env={"MARKER": marker.address}, pg_annotations=None)
        G.wait_until(lambda: all(_bound_at(G.list_pods(api, ns)).values()) and len(G.list_pods(api, ns)) == 8,
                     30, what="best-effort gangs bound")
        G.wait_until(lambda: marker.started(8), 30, what="every best-effort pod running its SIGTERM handler")
        time.sleep(7)  # then each checkpoints: be-a 5 s ago, be-c 3 s ago, be-b just now
        now = time.time()
        for name, age in ages.items():
            if age is None:
                continue
            stamp = datetime.fromtimestamp(now - age, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            for i in range(2):
                client.CoreV1Api(api).patch_namespaced_pod(
                    f"{name}-{i}", ns, {"metadata": {"annotations": {C.ANNOTATION_LAST_CHECKPOINT_TIME: stamp}}})
        victims_expected = {"be-b-0", "be-b-1"}
        nodes_before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in G.list_pods(api, ns)}

        G.create_gang(api, ns, "prod", 2, 2, priority_class="airflow-gpu-production-training", sim_seconds=30)
        G.wait_until(lambda: G.gang_binding_state(G.list_pods(api, ns)).get(f"{ns}/prod", (0, 2))[0] == 2,
                     40, what="production gang bound")
        pods = {p["metadata"]["name"]: p for p in G.list_pods(api, ns)}
        gone = {n for n in nodes_before if n not in pods or pods[n]["status"].get("phase") in ("Succeeded", "Failed")}
        assert gone == victims_expected, f"victims {sorted(gone)}, expected {sorted(victims_expected)}"
        prod_nodes = {pods[f"prod-{i}"]["spec"]["nodeName"] for i in range(2)}
        assert prod_nodes == {nodes_before["be-b-0"]}  # where the victims' GPUs were freed
        said = marker.lines()
        assert sum(line.startswith("sigterm") for line in said) == 2, said  # each victim pod
        assert sum(line.startswith("saved") for line in said) == 2, said  # and each had time to save
        events = G.events_for(api, ns)
        assert any(e["reason"] == "Preempting" and "be-b" in e["message"] for e in events)
        assert any(e["reason"] == "Preempted" and e["involvedObject"]["name"] == "be-b" for e in events)
        for name in ("be-a", "be-c", "be-d"):
            assert G.gang_binding_state(G.list_pods(api, ns))[f"{ns}/{name}"] == (2, 2)
        assert recorder.seen <= REQUIRED, f"requests outside deploy/rbac.yaml: {sorted(recorder.seen - REQUIRED)}"
        assert ("", "pods/eviction", "create") in recorder.seen
    finally:
        marker.close()
        scheduler.stop()
        runner.join(10)
        elector.stop()


def test_reclaim_preempts_the_borrowing_team(kube_cluster, api, namespace, tmp_path):
    a, b = namespace("team-a"), namespace("team-b")
    cfg = load_config(_quota_config(tmp_path, [
        {"name": "a", "namespace": a, "quota": {"h100": 8}},
        {"name": "b", "namespace": b, "quota": {"h100": 8}, "borrowing_limit": {"h100": 8}},
    ]))
    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), cfg, Settings(), identity="reclaim")
    runner = threading.Thread(target=scheduler.run, daemon=True)
    runner.start()
    try:
        # team b runs 12 GPUs: its own 8 and 4 borrowed from team a's idle quota
        for i in range(3):
            G.create_gang(api, b, f"b{i}", 1, 4, priority_class="airflow-gpu-best-effort-training", grace=2,
                          annotations={C.ANNOTATION_CHECKPOINTABLE: "true"})
            G.wait_until(lambda: G.gang_binding_state(G.list_pods(api, b)).get(f"{b}/b{i}", (0, 1))[0] == 1,
                         20, what=f"b{i} bound")
        borrowed = [i for i in range(3)
                    if (G.get_podgroup(api, b, f"b{i}")["metadata"].get("annotations") or {}).get(C.ANNOTATION_BORROWED)]
        assert borrowed == [2], borrowed  # the gang past b's quota runs on borrowed quota
        # team a wants its 8 back (only 4 GPUs are free)
        G.create_gang(api, a, "mine", 2, 4, priority_class="airflow-gpu-production-training", sim_seconds=30)
        G.wait_until(lambda: G.gang_binding_state(G.list_pods(api, a)).get(f"{a}/mine", (0, 2))[0] == 2,
                     30, what="team a's gang bound")
        left = G.gang_binding_state(G.list_pods(api, b))
        # the gang admitted on borrowed quota gives the GPUs back; b keeps its guaranteed 8
        assert sorted(k for k, v in left.items() if v == (1, 1)) == [f"{b}/b0", f"{b}/b1"], left
        value = scheduler.metrics.registry.get_sample_value(
            "airflow_gpu_preemptions_total", {"team": "b", "tier": "best-effort-training", "reason": "reclaim"})
        assert value == 1.0
    finally:
        scheduler.stop()
        runner.join(10)


def test_team_quota_and_never_preempting_tier(kube_cluster, api, namespace, tmp_path):
    q, be = namespace("team-q"), namespace("team-be")
    # the config lets best-effort preempt; the cluster's PriorityClass (deploy/) says Never, and wins
    cfg = load_config(_quota_config(tmp_path, [{"name": "q", "namespace": q, "quota": {"h100": 4}},
                                               {"name": "be", "namespace": be, "quota": {"h100": 12}}],
                                    preempting_tiers=("best-effort-training",)))
    assert cfg.tier("best-effort-training").preemption_policy == "PreemptLowerPriority"
    try:
        client.SchedulingV1Api(api).create_priority_class(
            {"metadata": {"name": "low-batch"}, "value": 10, "preemptionPolicy": "Never"})
    except client.ApiException as exc:
        assert exc.status == 409
    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), cfg, Settings(), identity="quota")
    runner = threading.Thread(target=scheduler.run, daemon=True)
    runner.start()
    try:
        # team q: its second 4-GPU gang waits on its own quota although 12 GPUs are free
        for name in ("q1", "q2"):
            G.create_gang(api, q, name, 1, 4, priority_class="airflow-gpu-best-effort-training")
        G.wait_until(lambda: G.gang_binding_state(G.list_pods(api, q)).get(f"{q}/q1") == (1, 1), 20, what="q1")

        def reason(ns, name):
            return (G.get_podgroup(api, ns, name)["metadata"].get("annotations") or {}).get(C.ANNOTATION_WAIT_REASON, "")

        G.wait_until(lambda: reason(q, "q2").startswith("team quota: q uses 4 of 4"), 20, what="q2 quota reason")
        # team be fills the other 12 GPUs at priority 10, then asks for 4 more at best-effort priority:
        # best-effort-training never preempts (PriorityClass preemptionPolicy: Never), so it waits
        for i in range(3):
            G.create_gang(api, be, f"low{i}", 1, 4, priority_class="low-batch")
        G.wait_until(lambda: sum(b for b, _ in G.gang_binding_state(G.list_pods(api, be)).values()) == 3, 20,
                     what="low gangs bound")
        G.create_gang(api, be, "be", 1, 4, priority_class="airflow-gpu-best-effort-training")
        G.wait_until(lambda: reason(be, "be") != "", 20, what="be waits with a reason")
        time.sleep(1.0)
        state = G.gang_binding_state(G.list_pods(api, be))
        assert state[f"{be}/be"] == (0, 1) and all(state[f"{be}/low{i}"] == (1, 1) for i in range(3)), state
        assert "preempting" not in reason(be, "be")
        assert G.gang_binding_state(G.list_pods(api, q))[f"{q}/q2"] == (0, 1)
    finally:
        scheduler.stop()
        runner.join(10)


def test_a_head_of_unknown_start_holds_its_node_for_the_configured_time_then_lets_work_through(
        kube_cluster, api, namespace, tmp_path):
    """The config's scheduling.reservation_hold_seconds reaches the scheduler (the bound the replay
    measures): a head of line waiting on work of unknown duration keeps a smaller gang of its own
    priority off its reserved node, and only for that long."""
    ns = namespace("hold")
    cfg_path = _quota_config(tmp_path, [{"name": "ml", "namespace": ns, "quota": {"h100": 24}}])  # quota is no limit
    raw = yaml.safe_load(cfg_path.read_text())
    raw["scheduling"] = {"reservation_hold_seconds": 4}
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = load_config(cfg_path)
    assert cfg.scheduling.reservation_hold_seconds == 4
    prod = "airflow-gpu-production-training"  # one priority for all: nothing here may preempt
    core = client.CoreV1Api(api)
    # h100-1 full, h100-0 with 2 GPUs free, for far longer than the test (no expected duration)
    for node, gpus in (("h100-0", 6), ("h100-1", 8)):
        core.create_namespaced_pod(ns, G.pod_manifest(f"busy-{node}", ns, gpus, priority_class=prod, sim_seconds=300,
                                                      node_selector={"kubernetes.io/hostname": node}))
    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), cfg, Settings(), identity="hold")
    runner = threading.Thread(target=scheduler.run, daemon=True)
    runner.start()
    try:
        G.wait_until(lambda: all(_bound_at(G.list_pods(api, ns)).values()), 20, what="busy pods bound")
        G.create_gang(api, ns, "head", 1, 8, priority_class=prod, node_selector={"kubernetes.io/hostname": "h100-0"})
        time.sleep(0.5)
        G.create_gang(api, ns, "small", 1, 2, priority_class=prod, sim_seconds=300)
        created = time.time()
        G.wait_until(lambda: G.gang_binding_state(G.list_pods(api, ns)).get(f"{ns}/small") == (1, 1), 15,
                     what="small bound once the head's hold has run out")
        waited = time.time() - created
        pods = {p["metadata"]["name"]: p for p in G.list_pods(api, ns)}
        assert pods[G.member_name("small", 0)]["spec"]["nodeName"] == "h100-0"  # on the head's reserved node
        assert pods[G.member_name("head", 0)]["spec"].get("nodeName") is None
        said = [(e["involvedObject"]["name"], e["message"]) for e in G.events_for(api, ns)
                if e["reason"] == "FailedScheduling"]
        assert ("small", f"would delay {ns}/head, which holds 1 node(s) and starts when gangs of unknown duration end") \
            in said, said
        assert any(who == "head" and "no reservation: it held one 4 s without a known start" in m for who, m in said), said
        assert 2.0 <= waited <= 10.0, waited  # held about 4 s from the head's first cycle, not for good
    finally:
        scheduler.stop()
        runner.join(10)


def test_a_preemptor_binds_only_after_its_slow_saving_victims_are_gone(kube_cluster, api, namespace, tmp_path):
    """Team ml (guarantee 8) runs a best-effort gang of 6 GPUs on node A beside another team's 2-GPU
    pod; its production gang of 8 fits only on the free node B but has no quota, so it preempts the
    best-effort gang, whose SIGTERM save takes 6 s. The production gang binds once the victim is
    gone, never while it still saves (6 + 8 on a guarantee of 8)."""
    ns, other = namespace("slow-save"), namespace("slow-save-other")
    cfg = load_config(_quota_config(tmp_path, [{"name": "ml", "namespace": ns, "quota": {"h100": 8}},
                                               {"name": "other", "namespace": other, "quota": {"h100": 8}}]))
    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), cfg, Settings(), identity="slow-save")
    runner = threading.Thread(target=scheduler.run, daemon=True)
    runner.start()
    marker = Marker()
    try:
        node_a = sorted(n.metadata.name for n in client.CoreV1Api(api).list_node().items)[0]
        on_a = {"kubernetes.io/hostname": node_a}
        G.create_gang(api, other, "keep", 1, 2, priority_class="airflow-gpu-production-training", sim_seconds=120,
                      node_selector=on_a)
        slow = SIGTERM_SCRIPT.replace("time.sleep(1.0)  # checkpointing", "time.sleep(6.0)  # a slow checkpoint")
        G.create_gang(api, ns, "be", 1, 6, priority_class="airflow-gpu-best-effort-training", grace=20,
                      command=[sys.executable, "-c", slow], annotations={C.ANNOTATION_CHECKPOINTABLE: "true"},
                      env={"MARKER": marker.address}, pg_annotations=None, node_selector=on_a)
        G.wait_until(lambda: all(_bound_at(G.list_pods(api, ns) + G.list_pods(api, other)).values())
                     and marker.started(1), 30, what="best-effort gang bound and running its SIGTERM handler")
        G.create_gang(api, ns, "prod", 1, 8, priority_class="airflow-gpu-production-training", sim_seconds=30)
        first_bound = None
        deadline = time.time() + 60
        while time.time() < deadline and first_bound is None:
            if G.gang_binding_state(G.list_pods(api, ns)).get(f"{ns}/prod", (0, 1))[0] == 1:
                first_bound = time.time()
            time.sleep(0.1)
        assert first_bound is not None, "production gang never bound"
        prod = next(p for p in G.list_pods(api, ns) if p["metadata"]["name"].startswith("prod"))
        assert prod["spec"]["nodeName"] != node_a  # the free node: only quota stood in its way
        said = marker.lines()
        saved = [float(line.split()[1]) for line in said if line.startswith("saved")]
        sigterm = [float(line.split()[1]) for line in said if line.startswith("sigterm")]
        assert sigterm, f"the victim got no SIGTERM: {said}"
        assert saved and first_bound >= saved[0], (
            f"production bound at {first_bound:.2f}, while its victim was still saving (sigterm at "
            f"{sigterm[0]:.2f}, saved at {saved[0] if saved else 'never'}): {said}")
    finally:
        marker.close()
        scheduler.stop()
        runner.join(10)

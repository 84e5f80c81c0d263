"""The whole scheduler process at scale, through the API (issue 31): the local cluster in scale mode
(`mode: scale`: pods and nodes simulated without processes or heartbeats, as KWOK does; see
airflow_gpu/localcluster/kubelet/simkubelet.py) with N nodes x 8 GPUs in zones, racks and NVLink cliques, and
the real `airflow-gpu scheduler` process over HTTP. Phases:

1. fill: P one-GPU pods (best-effort, running until deleted) created at once from client threads
   while the scheduler runs -> time from the first create to all bound, bindings/s over the binding
   window, creates/s, the scheduler's peak RSS and CPU seconds (and the API server's);
2. rack gang: a PodGroup of 64 x 8-GPU pods (production-training, `rack:hard`) on the filled cluster
   with 10 % of its GPUs freed -> last pod created to all bound: first with the free GPUs scattered
   (one per node: it must preempt ~7 x 64 best-effort pods in one rack), then with the gang deleted
   and its rack free (no preemption needed);
3. steady: running gangs fill the cluster; the bench ends --churn of them per second (deletes them,
   longest bound first) and --churn new gangs arrive per second on top of --pending waiting ones,
   so the cluster stays full and about --pending wait (printed at the start and end) -> cycle
   p50/p99 from the scheduler's own histogram (airflow_gpu_scheduling_cycle_seconds, over the
   window) and the scheduling thread's own CPU per cycle (airflow_gpu_scheduling_cycle_cpu_seconds:
   the cycle's cost apart from its waits for the interpreter and the cores), binding latency p50/p99
   (plan to last Binding, airflow_gpu_binding_latency_seconds), queue wait of the arrivals, and the
   gangs bound per second beside those ended;
4. kai: the fill again on a fresh 500-node cluster with 4,000 one-GPU jobs, beside KAI's published
   6 min 38 s (docs/scale-tests of KAI-Scheduler), unless the main run is already that size.

    python -m bench cluster_scale --nodes 500 --pods 4000          # small, while developing
    python -m bench cluster_scale                                  # 5,000 nodes, 40,000 pods (quiet machine)

Targets (issue 31, 5,000 nodes): >= 300 bindings/s; the rack gang <= 5 s without preemption and
<= 30 s with; steady cycle p50 <= 500 ms, p99 <= 2 s; scheduler RSS <= 2 GB.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu import constants as C
from airflow_gpu.devtools import gangs as G
from airflow_gpu.devtools.kube import start_kube_cluster
from airflow_gpu.devtools.processes import free_port, wait_until
from airflow_gpu.kube import group_manifest
from bench.scheduler import BindWatch

PRODUCT = "NVIDIA-H100-80GB-HBM3"
NS = "bench"
BEST_EFFORT, PRODUCTION = "airflow-gpu-best-effort-training", "airflow-gpu-production-training"
KAI_FILL = (500, 4000, 6 * 60 + 38)  # nodes, one-GPU jobs, seconds to fill (KAI's published scale test)
SEED_QUOTAS = Path(__file__).resolve().parents[1] / "examples" / "seed-quotas.yaml"


def cluster_spec(nodes: int, zones: int, rack_nodes: int, clique_nodes: int) -> dict:
    """N nodes x 8 GPUs: one pool per zone, split into racks of about rack_nodes and cliques of about
    clique_nodes (the labels core.topology reads: constants.NODE_ZONE / NODE_RACK / NODE_GPU_CLIQUE)."""
    pools = []
    for z in range(zones):
        count = nodes // zones + (1 if z < nodes % zones else 0)
        zone = f"zone-{chr(ord('a') + z)}"
        pools.append({"name": f"h100-{zone[-1]}", "count": count, "zone": zone, "maxPods": 110,
                      "gpu": {"product": PRODUCT, "count": 8},
                      "racks": [f"{zone}-rack{i}" for i in range(max(1, count // rack_nodes))],
                      "cliques": [f"{zone}-nvl{i}" for i in range(max(1, count // clique_nodes))]})
    return {"name": "cluster-scale", "mode": "scale", "watchHistory": 200_000, "pools": pools}


def quota_config(path: Path, gpus: int) -> Path:
    seed = yaml.safe_load(SEED_QUOTAS.read_text())
    cfg = {"version": 1, "products": [{"name": "h100", "memory_gb": 80, "node_label": PRODUCT,
                                       "price_per_gpu_hour": {"on_demand": 9.8, "spot": 3.9}}],
           "tiers": seed["tiers"], "teams": [{"name": "bench", "namespace": NS, "quota": {"h100": gpus}}]}
    path.write_text(yaml.safe_dump(cfg))
    return path


class Proc:
    """CPU seconds and RSS of a process from /proc."""

    def __init__(self, pid: int):
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick

    def rss_mib(self, key: str = "VmRSS") -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return 0.0


def histogram(port: int, name: str) -> dict[float, float]:
    """upper bound -> cumulative count of a scheduler histogram, summed over its label sets (the queue
    wait's team, tier and product: the gang phase's production gangs are another set)."""
    out: dict[float, float] = {}
    for labels, value in G.scheduler_samples(port, name + "_bucket"):
        bound = float(labels["le"])  # "+Inf" reads as inf
        out[bound] = out.get(bound, 0.0) + value
    return out


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """histogram_quantile over the window after - before (linear inside the bucket, as Prometheus)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / max(count - below, 1e-9))
        lower, below = bound, count
    return lower


def leading(port: int) -> bool:
    try:
        return G.scheduler_metric(port, "airflow_gpu_scheduler_is_leader") == 1
    except OSError:  # its metrics server is not up yet
        return False


def retried(call, done_status: int, tries: int = 5):
    """call(), again after a dropped connection (a loaded API server closes connections whose request
    head it did not read in time); done_status: the answer that says an earlier try went through."""
    for attempt in range(tries):
        try:
            resp = call()
            if isinstance(resp, urllib3.BaseHTTPResponse):  # _preload_content=False: give the connection back
                resp.drain_conn()
                resp.release_conn()
            return resp
        except ApiException as exc:
            if exc.status != done_status:
                raise
            return None
        except (urllib3.exceptions.HTTPError, OSError):
            if attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


class Poster:
    """Creates and deletes with plain urllib3 requests of pre-encoded JSON, from client threads: the
    official client's per-request work (~1 ms of CPU) would take the scheduler's CPU on a 2-core machine at
    40,000 creates (150-460 creates/s with it, 1,100 without)."""

    def __init__(self, api, threads: int = 8):
        self.host = api.configuration.host
        self.http = urllib3.PoolManager(maxsize=threads, retries=False)
        auth = api.configuration.api_key.get("authorization")
        self.headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth else {})}

    def post(self, path: str, body: dict) -> None:
        self._send("POST", path, json.dumps(body).encode(), (201, 409))  # 409: an earlier try went through

    def delete(self, path: str) -> None:
        self._send("DELETE", path, None, (200, 202, 404))  # 404: gone already

    def _send(self, method: str, path: str, data: bytes | None, done: tuple[int, ...]) -> None:
        for attempt in range(5):
            try:
                status = self.http.request(method, self.host + path, body=data, headers=self.headers, timeout=60).status
            except urllib3.exceptions.HTTPError:
                status = None  # a dropped connection: again
            if status in done:
                return
            if status is not None and status < 500 and status != 429:
                raise RuntimeError(f"{method} {path}: HTTP {status}")
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"{method} {path}: no answer after 5 tries")

    def pod(self, body: dict) -> None:
        self.post(f"/api/v1/namespaces/{NS}/pods", body)

    def podgroup(self, name: str, members: int) -> None:
        self.post(f"/apis/{C.PODGROUP_GROUP}/{C.PODGROUP_VERSION}/namespaces/{NS}/{C.PODGROUP_PLURAL}",
                  group_manifest(C.GANG_BACKEND_AIRFLOW_GPU, NS, name, members))


def create_pods(api, bodies: list[dict], threads: int = 8) -> float:
    """Create every pod from client threads; returns the seconds it took."""
    poster = Poster(api, threads)
    t0 = time.time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(poster.pod, bodies))
    return time.time() - t0


def delete_pods(api, names: list[str], threads: int = 8) -> None:
    core = client.CoreV1Api(api)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda n: retried(lambda: core.delete_namespaced_pod(
            n, NS, grace_period_seconds=0, _preload_content=False), 404), names))


def live_pods(api) -> list[dict]:
    return [p for p in G.list_pods(api, NS) if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def fill(api, sched: Proc, server: Proc, pods: int, prefix: str = "fill") -> dict:
    watch = BindWatch(api, NS, timeout=3600)
    bodies = [G.pod_manifest(f"{prefix}-{i:05d}", NS, 1, priority_class=BEST_EFFORT) for i in range(pods)]
    cpu0, scpu0 = sched.cpu(), server.cpu()
    t0 = time.time()
    create_s = create_pods(api, bodies)
    wait_until(lambda: sum(n.startswith(prefix) for n in list(watch.bound)) >= pods, 3600, 0.2, f"{pods} fill pods bound")
    times = sorted(t for n, t in watch.bound.items() if n.startswith(prefix))
    r = {"pods": pods, "create_s": create_s, "all_bound_s": times[-1] - t0, "first_bind_s": times[0] - t0,
         "bind_rate": (len(times) - 1) / max(times[-1] - times[0], 1e-9), "sched_cpu": sched.cpu() - cpu0,
         "server_cpu": server.cpu() - scpu0, "rss": sched.rss_mib(), "peak_rss": sched.rss_mib("VmHWM"),
         "server_rss": server.rss_mib()}
    print(f"fill: {pods} one-GPU pods created in {create_s:.1f} s ({pods / create_s:.0f}/s); all bound "
          f"{r['all_bound_s']:.1f} s after the first create; {r['bind_rate']:.0f} bindings/s from first to last "
          f"Binding (target >= 300/s); scheduler CPU {r['sched_cpu']:.0f} s ({1000 * r['sched_cpu'] / pods:.2f} ms per "
          f"binding: what a busy machine does not change much), RSS {r['rss']:.0f} MiB (peak "
          f"{r['peak_rss']:.0f}, target <= 2048); API server CPU {r['server_cpu']:.0f} s, RSS {r['server_rss']:.0f} MiB",
          flush=True)
    return r


def rack_gang(api, gpus: int, name: str, watch: BindWatch) -> float:
    """The 64 x 8-GPU rack gang: seconds from its last pod's create returning to all 64 bound."""
    names = G.create_gang(api, NS, name, 64, 8, pg_annotations={C.ANNOTATION_TOPOLOGY: "rack:hard"},
                          priority_class=PRODUCTION)
    created = time.time()
    wait_until(lambda: all(n in watch.bound for n in names), 600, 0.05, f"rack gang {name} bound")
    return max(watch.bound[n] for n in names) - created


def gang_phase(api, nodes: int, port: int) -> dict:
    gpus = nodes * 8
    pods = live_pods(api)
    if len(pods) < gpus:  # top up: the phase starts from a full cluster
        fill_more = [G.pod_manifest(f"top-{i:05d}", NS, 1, priority_class=BEST_EFFORT) for i in range(gpus - len(pods))]
        create_pods(api, fill_more)
        wait_until(lambda: sum(bool(p["spec"].get("nodeName")) for p in live_pods(api)) >= gpus, 1200, 1.0,
                   "cluster full")
        pods = live_pods(api)
    by_node: dict[str, list[str]] = {}
    for p in pods:
        by_node.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
    # 10 % free, scattered: one GPU on each of 80 % of the nodes, so no node is empty
    delete_pods(api, [names[0] for _, names in sorted(by_node.items())[:int(0.8 * len(by_node))]])
    full = 1 - len(by_node) * 0.8 * 1 / gpus
    watch = BindWatch(api, NS, timeout=3600)
    evicted0 = G.scheduler_metric(port, "airflow_gpu_evicted_pods_total")
    with_preemption = rack_gang(api, gpus, "rack-a", watch)
    evicted = G.scheduler_metric(port, "airflow_gpu_evicted_pods_total") - evicted0
    print(f"rack gang (64 x 8 GPUs, rack:hard) on a cluster {100 * full:.0f} % full, scattered free GPUs: bound "
          f"{with_preemption:.2f} s after its last pod was created, preempting {evicted:.0f} pods (target <= 30 s)",
          flush=True)
    gang_pods = [f"rack-a-{i}" for i in range(64)]
    delete_pods(api, gang_pods)  # its 64 nodes are free now: the next one needs no preemption
    wait_until(lambda: not any(p["metadata"]["name"] in gang_pods for p in G.list_pods(api, NS)), 120, 0.2,
               "rack gang deleted")
    used = sum(int(bool(p["spec"].get("nodeName"))) for p in live_pods(api))
    evicted0 = G.scheduler_metric(port, "airflow_gpu_evicted_pods_total")
    without = rack_gang(api, gpus, "rack-b", watch)
    evicted = G.scheduler_metric(port, "airflow_gpu_evicted_pods_total") - evicted0
    print(f"rack gang on a cluster {100 * used / gpus:.0f} % full with one rack free: bound {without:.2f} s after its "
          f"last pod was created, preempting {evicted:.0f} pods (target <= 5 s)", flush=True)
    return {"with_preemption": with_preemption, "without": without}


def clear(api) -> None:
    client.CoreV1Api(api).delete_collection_namespaced_pod(NS, grace_period_seconds=0)
    client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
        C.PODGROUP_GROUP, C.PODGROUP_VERSION, NS, C.PODGROUP_PLURAL)
    wait_until(lambda: not G.list_pods(api, NS), 300, 0.5, "pods deleted")


def submit_gangs(poster: Poster, names: list[str], members: int, threads: int = 8) -> None:
    """Gangs of `members` one-GPU pods that run until deleted: PodGroup then pods, from client threads."""

    def one(name):
        poster.podgroup(name, members)
        for i in range(members):
            poster.pod(G.pod_manifest(f"{name}-{i}", NS, 1, group=name, priority_class=BEST_EFFORT))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))


class Churn(threading.Thread):
    """Ends `rate` running gangs per second, the longest bound first, as their owner deletes a job
    that finished (PodGroup and pods, from client threads): the gangs run until ended, so the
    cluster stays full and the pending gangs wait for the room the ended ones leave, however long
    the set-up took. (Run times of their own would end most gangs during a set-up longer than
    them: an earlier version measured a half-empty cluster whose arrivals were admitted at once.)"""

    def __init__(self, poster: Poster, watch: BindWatch, members: int, rate: float, threads: int = 8):
        super().__init__(daemon=True)
        self.poster, self.watch, self.members, self.rate = poster, watch, members, rate
        self.ended = 0
        self._halt = threading.Event()  # not _stop: that is a method of Thread, which join() calls
        self._pool = ThreadPoolExecutor(threads)

    def _end(self, gang: str) -> None:
        self.poster.delete(f"/apis/{C.PODGROUP_GROUP}/{C.PODGROUP_VERSION}/namespaces/{NS}/{C.PODGROUP_PLURAL}/{gang}")
        for i in range(self.members):  # by name: a label-selected deletecollection scans every pod
            self.poster.delete(f"/api/v1/namespaces/{NS}/pods/{gang}-{i}?gracePeriodSeconds=0")

    def run(self):
        bound: dict[str, int] = {}  # gang -> members seen bound
        ready: list[str] = []  # gangs whole bound, in the order their last member was bound
        seen, start, futures = 0, time.time(), []
        while not self._halt.wait(0.05):
            names = list(self.watch.bound)  # insertion order: the order they were bound
            for name in names[seen:]:
                gang = name.rsplit("-", 1)[0]
                bound[gang] = bound.get(gang, 0) + 1
                if bound[gang] == self.members:
                    ready.append(gang)
            seen = len(names)
            due = min(len(ready), int((time.time() - start) * self.rate) - self.ended)
            if due > 0:
                futures += [self._pool.submit(self._end, g) for g in ready[:due]]
                del ready[:due]
                self.ended += due
        for f in futures:
            f.result()

    def stop(self):
        """Ends the deletions and waits for them, so none is in flight when the cluster stops."""
        self._halt.set()
        self.join(timeout=120)
        self._pool.shutdown(wait=True)


QUEUED = "airflow_gpu_scheduler_writes_queued"
CYCLE_CPU = "airflow_gpu_scheduling_cycle_cpu_seconds"  # the cycle thread's own CPU (time.thread_time)
PENDING = "airflow_gpu_pending_gangs"  # a gauge the scheduler refreshes every few seconds
ADMITTED = "airflow_gpu_gangs_admitted_total"
PHASES = "airflow_gpu_scheduling_cycle_phase_seconds"


def metric_sum(port: int, name: str) -> float:
    """A scheduler metric summed over its labels (every team, tier, reason)."""
    return sum(value for _, value in G.scheduler_samples(port, name))


def pending_gangs(port: int) -> float:
    return metric_sum(port, PENDING)


def phase_totals(port: int) -> dict[str, tuple[float, float]]:
    """phase -> (seconds, cycles) of the scheduler's airflow_gpu_scheduling_cycle_phase_seconds."""
    seconds = {labels["phase"]: value for labels, value in G.scheduler_samples(port, PHASES + "_sum")}
    return {labels["phase"]: (seconds.get(labels["phase"], 0.0), value)
            for labels, value in G.scheduler_samples(port, PHASES + "_count")}


def steady(api, nodes: int, port: int, sched: Proc, pending: int, churn: float, members: int, seconds: float) -> dict:
    clear(api)
    running = nodes * 8 // members
    t0 = time.time()
    # the cluster full of gangs that run until the bench ends them (Churn), then the pending ones
    watch, poster = BindWatch(api, NS, timeout=3600), Poster(api)
    submit_gangs(poster, [f"run-{i:05d}" for i in range(running)], members)
    # the window starts once they run: the backlog's own admission is the fill phase, not the steady state
    wait_until(lambda: sum(n.startswith("run-") for n in list(watch.bound)) >= running * members, 3600, 1.0,
               "running gangs bound")
    submit_gangs(poster, [f"wait-{i:05d}" for i in range(pending)], members)
    done = histogram(port, "airflow_gpu_scheduling_cycle_seconds").get(math.inf, 0)  # and their wait reasons written
    wait_until(lambda: histogram(port, "airflow_gpu_scheduling_cycle_seconds").get(math.inf, 0) >= done + 2, 1200, 1.0,
               "two cycles after the pending gangs arrived")
    wait_until(lambda: pending_gangs(port) >= pending, 120, 0.5, "the pending gangs in the scheduler's gauge")
    setup = time.time() - t0
    ender = Churn(poster, watch, members, churn)
    pending0, admitted0 = pending_gangs(port), metric_sum(port, ADMITTED)
    ender.start()
    cycles0, bind0 = histogram(port, "airflow_gpu_scheduling_cycle_seconds"), histogram(
        port, "airflow_gpu_binding_latency_seconds")
    cycle_cpu0, phases0 = histogram(port, CYCLE_CPU), phase_totals(port)
    wait0, cpu0 = histogram(port, "airflow_gpu_queue_wait_seconds"), sched.cpu()
    print(f"  steady: set up in {setup:.0f} s; measuring {seconds:g} s", flush=True)
    start, arrived = time.time(), 0
    queued = [G.scheduler_metric(port, QUEUED)]  # the writes off the binding waiting: bounded, or piling up?
    while time.time() - start < seconds:
        due = int((time.time() - start) * churn) - arrived
        if due > 0:
            submit_gangs(poster, [f"new-{arrived + i:06d}" for i in range(due)], members)
            arrived += due
        if time.time() - start >= len(queued):
            queued.append(G.scheduler_metric(port, QUEUED))
        time.sleep(0.05)
    window = time.time() - start
    queued.append(G.scheduler_metric(port, QUEUED))
    pending1, admitted = pending_gangs(port), metric_sum(port, ADMITTED) - admitted0
    ender.stop()
    cycles, bind, wait = (histogram(port, n) for n in ("airflow_gpu_scheduling_cycle_seconds",
                                                       "airflow_gpu_binding_latency_seconds",
                                                       "airflow_gpu_queue_wait_seconds"))
    cycle_cpu, phases = histogram(port, CYCLE_CPU), phase_totals(port)
    # mean seconds per cycle of each phase over the window (exact: sums and counts, no buckets)
    phase_mean = {p: (t - phases0.get(p, (0, 0))[0]) / max(1.0, n - phases0.get(p, (0, 0))[1])
                  for p, (t, n) in phases.items()}
    n_cycles = cycles.get(math.inf, 0) - cycles0.get(math.inf, 0)
    ms = lambda v: "n/a" if v is None else f"{1000 * v:.0f} ms"  # noqa: E731
    behind = ": fewer than ended, the pending pile up and GPUs idle" if admitted < 0.95 * ender.ended else ""
    r = {"cycle_p50": quantile(cycles0, cycles, 0.5), "cycle_p99": quantile(cycles0, cycles, 0.99),
         "bind_p50": quantile(bind0, bind, 0.5), "bind_p99": quantile(bind0, bind, 0.99),
         "cycle_cpu_p50": quantile(cycle_cpu0, cycle_cpu, 0.5), "cycle_cpu_p99": quantile(cycle_cpu0, cycle_cpu, 0.99),
         "wait_p50": quantile(wait0, wait, 0.5), "cycles": n_cycles, "arrived": arrived, "window": window,
         "cpu": sched.cpu() - cpu0, "rss": sched.rss_mib(), "ended": ender.ended, "pending": (pending0, pending1),
         "admitted": admitted, "phase_mean": phase_mean, "writes_queued": (queued[0], max(queued), queued[-1])}
    print(f"steady ({running} running gangs of {members} x 1 GPU ending at {churn:g}/s, {pending} pending, {churn:g} "
          f"arriving/s; set up in {setup:.0f} s; pending gangs {pending0:.0f} at the start, {pending1:.0f} at the end): over {window:.0f} s, {n_cycles:.0f} cycles p50 {ms(r['cycle_p50'])} "
          f"p99 {ms(r['cycle_p99'])} (targets 500 ms / 2 s), of which the scheduling thread's own CPU p50 "
          f"{ms(r['cycle_cpu_p50'])} p99 {ms(r['cycle_cpu_p99'])}, its phases on average "
          f"{', '.join(f'{p} {ms(v)}' for p, v in phase_mean.items())}; binding latency p50 {ms(r['bind_p50'])} p99 "
          f"{ms(r['bind_p99'])}; queue wait p50 {ms(r['wait_p50'])}; {arrived} arrivals "
          f"({arrived / window:.0f}/s achieved by the client), {ender.ended} gangs ended ({ender.ended / window:.0f}/s), {admitted:.0f} bound ({admitted / window:.0f}/s{behind}); writes queued (wait "
          f"reasons, statuses, bound annotations) {queued[0]:.0f} at the start, {max(queued):.0f} at most, "
          f"{queued[-1]:.0f} at the end; scheduler CPU {r['cpu'] / window:.2f} cores, "
          f"RSS {r['rss']:.0f} MiB", flush=True)
    return r


def run(args, nodes: int, pods: int, phases: set[str]) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-scale-"))
    spec = cluster_spec(nodes, args.zones or max(1, min(4, nodes // 250)), args.rack_nodes, args.clique_nodes)
    print(f"--- {nodes} nodes x 8 GPUs in {len(spec['pools'])} zones, "
          f"{sum(len(p['racks']) for p in spec['pools'])} racks, {sum(len(p['cliques']) for p in spec['pools'])} "
          f"NVLink cliques (scale mode); load average {os.getloadavg()[0]:.2f}", flush=True)
    sched = None
    results: dict = {}
    with start_kube_cluster(workdir, spec, timeout=600) as cluster:
        try:
            api = G.api_client(cluster.kubeconfig, pool=16)
            G.ensure_namespace(api, NS)
            G.install_priority_classes(api)
            port = free_port()
            sched = G.scheduler_process(cluster.kubeconfig, workdir / "scheduler.log", identity="bench-scale",
                                        config_path=quota_config(workdir / "quotas.yaml", nodes * 8),
                                        metrics_port=port, lease=(15.0, 10.0, 2.0),
                                        extra=["--log-level", "WARNING", *args.scheduler_arg]).start()
            wait_until(lambda: leading(port) or not sched.alive(), 120, 0.5, "scheduler leading")
            s, k = Proc(sched.pid), Proc(cluster.pid)
            if args.pause:
                print(f"scheduler pid {sched.pid}, API server pid {cluster.pid}; profiling window", flush=True)
            if "fill" in phases:
                results["fill"] = fill(api, s, k, pods)
            if "gang" in phases:
                results["gang"] = gang_phase(api, nodes, port)
            if "steady" in phases:
                results["steady"] = steady(api, nodes, port, s, args.pending, args.churn, args.members, args.seconds)
            refused = G.scheduler_metric(port, "airflow_gpu_scheduler_fence_refusals_total")
            print(f"  scheduler: peak RSS {s.rss_mib('VmHWM'):.0f} MiB, bindings refused by the leader fence "
                  f"{refused:.0f}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        finally:
            if sched is not None:
                sched.stop()
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench cluster_scale")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=None, help="fill pods (default: one per GPU, nodes x 8)")
    ap.add_argument("--phases", default="fill,gang,steady", help="comma-separated: fill, gang, steady")
    ap.add_argument("--zones", type=int, default=0, help="default: nodes / 250, 1 to 4")
    ap.add_argument("--rack-nodes", type=int, default=80)
    ap.add_argument("--clique-nodes", type=int, default=16)
    ap.add_argument("--pending", type=int, default=1000, help="steady: gangs waiting")
    ap.add_argument("--churn", type=float, default=100.0, help="steady: gangs ending and arriving per second")
    ap.add_argument("--members", type=int, default=4, help="steady: one-GPU pods per gang")
    ap.add_argument("--seconds", type=float, default=60.0, help="steady: measured window")
    ap.add_argument("--no-kai", action="store_true", help="skip the 500-node / 4,000-job fill beside KAI's")
    ap.add_argument("--pause", action="store_true", help="print the PIDs (for py-spy) before the phases")
    ap.add_argument("--scheduler-arg", action="append", default=[],
                    help="passed on to `airflow-gpu scheduler` (repeat; e.g. --scheduler-arg=--bind-workers=4)")
    args = ap.parse_args(sys.argv[2:] if argv is None and len(sys.argv) > 1 and sys.argv[1] == "cluster_scale"
                         else argv or [])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks stop the child processes
    phases = set(args.phases.split(","))
    results = run(args, args.nodes, args.pods or args.nodes * 8, phases)
    nodes, jobs, kai_s = KAI_FILL
    if args.no_kai:
        return
    if (args.nodes, args.pods or args.nodes * 8) == (nodes, jobs) and "fill" in phases:
        r = results["fill"]
    else:
        r = run(args, nodes, jobs, {"fill"})["fill"]
    print(f"KAI side by side: {nodes} nodes, {jobs} one-GPU jobs filled in {r['all_bound_s']:.0f} s here, "
              f"KAI's published {kai_s // 60} min {kai_s % 60} s ({kai_s} s)", flush=True)


if __name__ == "__main__":
    main()

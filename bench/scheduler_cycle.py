"""The scheduler's whole cycle (Scheduler.cycle: build_world, the decisions, the writes handed off,
the PodGroup statuses, the publication) in one process at 5,000 nodes x 8 GPUs, with the cluster
replaced by an in-memory one: the cache is a dict the test changes, the Api answers each write at
once by replacing the object (as the API server and the watch would). So it measures what the
scheduler costs per cycle on a core of its own, apart from the API server and the client that
share this machine's two cores in `bench cluster_scale` (there the steady phase's cycle is that
cost stretched by the CPU the scheduler gets: about half a core).

The steady state of cluster_scale: running gangs of 4 one-GPU pods fill the cluster (10,000 at
5,000 nodes), --pending gangs wait; before each measured cycle --churn gangs end (PodGroup and pods
deleted) and as many arrive: at 100 gangs/s, 50 per cycle is a 500 ms cycle's share. Per cycle:
wall clock and the process's CPU time (the writes' threads included); p50 / p99 over --cycles, and
the load average.

    python -m bench scheduler_cycle [--nodes 5000] [--pending 1000] [--churn 50] [--cycles 20]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


class Store:
    """The cache's part the scheduler reads and writes (scheduler/cache.ClusterCache's interface)."""

    def __init__(self, stores: dict[str, dict]):
        self.lock = threading.Lock()
        self.stores = stores
        self.assumed: dict[str, str] = {}
        from airflow_gpu.scheduler.cache import ChangeLog

        self.log = ChangeLog()  # its changes, as the cache tells them (cache.Changes)
        self.mark = self.log.mark  # under the lock: the object of a key was stored, replaced or removed

    def view(self):
        from airflow_gpu.scheduler.cache import View

        with self.lock:
            return View(**{k: dict(v) for k, v in self.stores.items()}, assumed=dict(self.assumed),
                        changes=self.log.take())

    def get(self, kind, key):
        with self.lock:
            return self.stores[kind].get(key)

    def observe_write(self, kind, obj):
        from airflow_gpu.kube.convert import key_of

        with self.lock:
            self.stores[kind][key_of(obj)] = obj
            self.mark(kind, key_of(obj))

    def observe_delete(self, kind, obj):
        from airflow_gpu.kube.convert import key_of

        with self.lock:
            self.stores[kind].pop(key_of(obj), None)
            self.mark(kind, key_of(obj))

    def assume_bound(self, key, node):
        with self.lock:
            self.assumed[key] = node

    def forget_assumed(self, key):
        with self.lock:
            self.assumed.pop(key, None)


class InstantApi:
    """scheduler/actions.Api answered at once: each write replaces the object with a new version."""

    def __init__(self, store: Store, versions):
        self.store, self.versions, self.calls = store, versions, 0

    def _replace(self, kind, key, change):
        self.calls += 1
        with self.store.lock:
            obj = json.loads(json.dumps(self.store.stores[kind][key]))
            obj["metadata"]["resourceVersion"] = str(next(self.versions))
            change(obj)
            self.store.stores[kind][key] = obj
            self.store.mark(kind, key)
            if kind == "pods":
                self.store.assumed.pop(key, None)
        return obj

    def bind(self, pod_key, node, uid=None):
        self._replace("pods", pod_key, lambda o: (o["spec"].update(nodeName=node), o.update(status={"phase": "Running"})))
        return "bound"

    def patch_pod_annotations(self, key, annotations):
        return self._replace("pods", key, lambda o: o["metadata"].setdefault("annotations", {}).update(annotations))

    def patch_podgroup_annotations(self, key, annotations):
        return self._replace("podgroups", key, lambda o: o["metadata"].setdefault("annotations", {}).update(annotations))

    def patch_podgroup_status(self, key, status):
        return self._replace("podgroups", key, lambda o: o.update(status=status))

    def write_plan(self, namespace, name, scheduler_name, record):
        from airflow_gpu import constants as C

        self.calls += 1
        return {"apiVersion": "v1", "kind": "ConfigMap", "data": {C.PLAN_DATA_KEY: record},
                "metadata": {"name": name, "namespace": namespace, "uid": f"cm-{name}",
                             "resourceVersion": str(next(self.versions))}}

    def delete_plan(self, namespace, name):
        self.calls += 1
        return {"metadata": {"name": name, "namespace": namespace}}

    def write_queue_status(self, body):
        self.calls += 1

    def event(self, *args, **kwargs):
        self.calls += 1

    def read_preemptions(self, *args):
        return {}

    def record_preemptions(self, *args, **kwargs):
        self.calls += 1

    def evict(self, *args):
        self.calls += 1
        return "evicted"

    def mark_disruption(self, *args):
        self.calls += 1


def main(argv: list[str] | None = None) -> None:
    from kubernetes import client

    from airflow_gpu import constants as C
    from airflow_gpu.config import load_config
    from airflow_gpu.devtools import gangs as G
    from airflow_gpu.kube import group_manifest
    from airflow_gpu.kube.convert import key_of
    from airflow_gpu.localcluster.spec import ClusterSpec, initial_nodes
    from airflow_gpu.scheduler.heap import Heap
    from airflow_gpu.scheduler.loop import Scheduler, Settings
    from bench.cluster_scale import BEST_EFFORT, NS, cluster_spec, quota_config

    ap = argparse.ArgumentParser(prog="python -m bench scheduler_cycle")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--members", type=int, default=4, help="one-GPU pods per gang")
    ap.add_argument("--pending", type=int, default=1000)
    ap.add_argument("--churn", type=int, default=50, help="gangs ending and arriving before each cycle")
    ap.add_argument("--cycles", type=int, default=20)
    args = ap.parse_args(sys.argv[2:] if argv is None and len(sys.argv) > 1 and sys.argv[1] == "scheduler_cycle"
                         else argv or [])
    versions = itertools.count(10)
    spec = ClusterSpec.model_validate(cluster_spec(args.nodes, max(1, min(4, args.nodes // 250)), 80, 16))
    nodes = {}
    for n in initial_nodes(spec):
        n["metadata"].update(uid=f"uid-{n['metadata']['name']}", resourceVersion=str(next(versions)))
        nodes[n["metadata"]["name"]] = n
    names = sorted(nodes)

    def gang(name: str, on: list[str] | None = None) -> tuple[dict, list[dict]]:
        pg = group_manifest(C.GANG_BACKEND_AIRFLOW_GPU, NS, name, args.members)
        pg["metadata"].update(uid=f"uid-{name}", resourceVersion=str(next(versions)),
                              creationTimestamp="2026-12-06T10:00:00Z")
        pods = []
        for i in range(args.members):
            p = G.pod_manifest(f"{name}-{i}", NS, 1, group=name, priority_class=BEST_EFFORT)
            p["metadata"].update(uid=f"uid-{name}-{i}", resourceVersion=str(next(versions)),
                                 creationTimestamp="2026-12-06T10:00:00Z")
            if on:
                p["spec"]["nodeName"] = on[i]
            p["status"] = {"phase": "Running" if on else "Pending"}
            pods.append(p)
        return pg, pods

    store = Store({"pods": {}, "nodes": nodes, "podgroups": {}, "priorityclasses": {}, "resourcequotas": {},
                   "plans": {}})

    def add(pg, pods):
        store.stores["podgroups"][key_of(pg)] = pg
        store.stores["pods"].update({key_of(p): p for p in pods})
        store.mark("podgroups", key_of(pg))
        for p in pods:
            store.mark("pods", key_of(p))

    running = args.nodes * 8 // args.members
    for g in range(running):
        add(*gang(f"run-{g:05d}", [names[(g * args.members + i) // 8] for i in range(args.members)]))
    for g in range(args.pending):
        add(*gang(f"wait-{g:05d}"))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(quota_config(Path(tmp) / "quotas.yaml", args.nodes * 8))
    scheduler = Scheduler(client.ApiClient(), cfg, Settings())
    scheduler.cache = store
    scheduler.api = InstantApi(store, versions)
    heap = Heap()
    print(f"{args.nodes} nodes x 8 GPUs, {running} running gangs of {args.members} x 1 GPU, {args.pending} pending; "
          f"{args.churn} end and {args.churn} arrive before each cycle; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for first in range(2):  # a restart's cost, not the steady state's: everything converted, then every
        t0 = time.perf_counter()  # PodGroup again (the first cycle wrote each one's status)
        scheduler.cycle()
        while not scheduler.writes.settled():  # its writes land before the next cycle
            time.sleep(0.1)
        print(f"  cycle {first + 1} after the start: {time.perf_counter() - t0:.1f} s, its writes included "
              f"({scheduler.api.calls} writes so far)", flush=True)
        heap.after_cycle()
    ended = itertools.count()
    walls, cpus = [], []
    for c in range(args.cycles):
        with store.lock:
            for _ in range(args.churn):
                name = f"run-{next(ended):05d}"
                store.stores["podgroups"].pop(f"{NS}/{name}", None)
                store.mark("podgroups", f"{NS}/{name}")
                for i in range(args.members):
                    store.stores["pods"].pop(f"{NS}/{name}-{i}", None)
                    store.mark("pods", f"{NS}/{name}-{i}")
                add(*gang(f"new-{c:03d}-{_:04d}"))
        t, cpu = time.perf_counter(), time.process_time()
        world = scheduler.cycle()
        walls.append(time.perf_counter() - t)
        time.sleep(0.2)  # the writes handed off land (on their threads), as between real cycles
        cpus.append(time.process_time() - cpu)
        heap.after_cycle()
    scheduler.writes.shutdown()
    heap.close()
    if os.environ.get("BENCH_SCHEDULER_CYCLE_EACH"):
        print("  each:", " ".join(f"{1000 * w:.0f}" for w in walls))
    ms = lambda a, q: f"{1000 * float(np.percentile(a, q)):.0f} ms"  # noqa: E731
    print(f"  steady cycle over {args.cycles}: wall p50 {ms(walls, 50)} p99 {ms(walls, 99)}; CPU (writes' threads "
          f"included) p50 {ms(cpus, 50)} p99 {ms(cpus, 99)}; {len(world.pending)} pending, {len(world.running)} "
          f"running at the end; targets 500 ms / 2 s; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

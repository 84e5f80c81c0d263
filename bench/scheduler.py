"""The GPU scheduler against the local cluster (both real processes, official client over HTTP).

1. Binding throughput: 1,000 pending 1-GPU pods are created first, then the scheduler starts; bindings
   per second from its first Binding to its last, as seen by a watch. Side by side: the rate at which
   the same client created those pods against the same API server (the API's own write rate here).
2. Gang latency: 100 gangs of 8 x 1 GPU arrive one after another; per gang, the time from its last
   member's create returning to its last member bound (watch). p50 / p99. And one 64-pod gang.
Cluster: 160 nodes x 8 GPUs (1,280 GPUs), 10 NVLink cliques. Seconds move on a shared 2-core
machine; rerun when it is quiet.
3. The cost of durable acknowledgement (issue 10): 1 and 2 again on a fresh cluster per way the API
   server acknowledges a write (bench.localcluster.durability_modes: before the log as before issue 10,
   group commit by default, --fsync), side by side. BENCH_SCHEDULER_MODES=default runs the default alone.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from airflow_gpu.devtools import gangs as G
from airflow_gpu.devtools.kube import start_kube_cluster
from airflow_gpu.devtools.processes import wait_until

_decode = msgspec.json.Decoder().decode

THROUGHPUT_PODS = 1000
GANGS, MEMBERS = 100, 8
SPEC = {"name": "bench-scheduler", "pools": [{"name": "h100", "count": 160, "cliques": [f"c{i}" for i in range(10)],
                                              "maxPods": 200, "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8}}]}


class BindWatch:
    """Time at which each pod of a namespace was first seen bound."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout: int = 300):
        self.bound: dict[str, float] = {}
        self._resp = client.CoreV1Api(api).list_namespaced_pod(
            namespace, watch=True, timeout_seconds=timeout, _preload_content=False, _request_timeout=(10, timeout + 300))
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            for line in iter_resp_lines(self._resp):
                if not line:
                    continue
                obj = _decode(line)["object"]  # msgspec: this client shares the cores with what it measures
                name = obj.get("metadata", {}).get("name")
                if name and name not in self.bound and (obj.get("spec") or {}).get("nodeName"):
                    self.bound[name] = time.time()
        except Exception:  # noqa: BLE001 - the stream ends when the bench closes it
            pass

    def close(self):
        pass  # closing from another thread can block on the reader's lock; the daemon thread ends with us


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def main() -> None:
    from bench.localcluster import durability_modes

    # SIGTERM (e.g. from `timeout`) must still run the finally below: the cluster and the scheduler
    # run in their own sessions and would outlive us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    modes = durability_modes()
    if os.environ.get("BENCH_SCHEDULER_MODES") == "default":
        modes = modes[1:2]
    rows = []
    for label, env, fsync in modes:
        print(f"--- API server: {label}", flush=True)
        workdir = Path(tempfile.mkdtemp(prefix="bench-scheduler-"))
        with start_kube_cluster(workdir, SPEC, env=env, fsync=fsync) as cluster:
            rows.append((label, run(cluster.kubeconfig, workdir)))
    if len(rows) > 1:
        base = rows[0][1]
        print("durable acknowledgement, side by side (ratio to the first row):")
        for label, r in rows:
            print(f"  {label:45s} bindings {r['bind_rate']:5.0f}/s ({r['bind_rate'] / base['bind_rate']:4.2f})  "
                  f"creates {r['create_rate']:5.0f}/s ({r['create_rate'] / base['create_rate']:4.2f})  "
                  f"gang p50 {1000 * r['p50']:4.0f} ms p99 {1000 * r['p99']:4.0f} ms  64-pod {1000 * r['big']:4.0f} ms")


def run(kubeconfig: Path, workdir: Path) -> dict:
    sched = None
    try:
        api = G.api_client(kubeconfig, pool=16)
        core = client.CoreV1Api(api)
        # 1. throughput on a backlog
        G.ensure_namespace(api, "tput")
        watch = BindWatch(api, "tput")
        pods = [G.pod_manifest(f"p{i:04d}", "tput", 1) for i in range(THROUGHPUT_PODS)]
        t0 = time.time()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda body: core.create_namespaced_pod("tput", body, _preload_content=False), pods))
        create_rate = THROUGHPUT_PODS / (time.time() - t0)
        sched = G.scheduler_process(kubeconfig, workdir / "scheduler.log", identity="bench",
                                    extra=["--log-level", "WARNING"]).start()
        wait_until(lambda: len(watch.bound) >= THROUGHPUT_PODS or not sched.alive(), 300, 0.1, "all pods bound")
        times = sorted(watch.bound.values())
        bind_rate = (len(times) - 1) / (times[-1] - times[0])
        watch.close()
        print(f"binding throughput: {bind_rate:.0f} pods/s over a backlog of {THROUGHPUT_PODS} 1-GPU pods "
              f"(first to last Binding {times[-1] - times[0]:.2f} s; target >= 100/s)")
        print(f"  side by side: the same client created them at {create_rate:.0f} pods/s "
              f"-> bindings/creates = {bind_rate / create_rate:.2f}")
        core.delete_collection_namespaced_pod("tput", grace_period_seconds=0)
        wait_until(lambda: not G.list_pods(api, "tput"), 60, 0.2, "throughput pods deleted")

        # 2. gang latency: last member created -> all members bound
        G.ensure_namespace(api, "gangs")
        watch = BindWatch(api, "gangs")
        last_created: dict[str, float] = {}
        for g in range(GANGS):
            G.create_gang(api, "gangs", f"g{g:03d}", MEMBERS, 1)
            last_created[f"g{g:03d}"] = time.time()
            time.sleep(0.05)
        names64 = G.create_gang(api, "gangs", "big64", 64, 1)
        last_created["big64"] = time.time()
        wait_until(lambda: len(watch.bound) >= GANGS * MEMBERS + 64 or not sched.alive(), 120, 0.1, "gangs bound")
        lat = []
        for g in range(GANGS):
            members = [watch.bound[f"g{g:03d}-{i}"] for i in range(MEMBERS)]
            lat.append(max(members) - last_created[f"g{g:03d}"])
        big = max(watch.bound[n] for n in names64) - last_created["big64"]
        watch.close()
        print(f"gang latency (last member created -> all {MEMBERS} bound), {GANGS} gangs: "
              f"p50 {1000 * statistics.median(lat):.0f} ms, p99 {1000 * pct(lat, 99):.0f} ms, "
              f"max {1000 * max(lat):.0f} ms; one 64-pod gang: {1000 * big:.0f} ms")
        print(f"  machine: {os.cpu_count()} cores shared; cluster 160 nodes x 8 GPUs, scheduler policy bestfit")
        return {"bind_rate": bind_rate, "create_rate": create_rate, "p50": statistics.median(lat),
                "p99": pct(lat, 99), "big": big}
    finally:
        if sched is not None:
            sched.stop()


if __name__ == "__main__":
    main()

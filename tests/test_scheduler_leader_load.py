"""Issue 31, item 3: the leader fence under load. The real scheduler process with short lease timings
(lease 3 s, renew deadline 2 s, retry 0.5 s) binds 300 pods created from 8 threads while 2 CPU burner
processes and 4 threads listing every pod load the machine and the API server, and every API request
waits LATENCY s (the local cluster's latency fault): no Binding is refused by the fence and no lost
leadership is logged (before the fix: two requests per renewal and a retry period after each, so the
fence lapsed between renewals and bindings were refused as "not leader", unlogged). Then the API server is frozen (SIGSTOP) past the renew
deadline: the lost leadership is logged with its cause, and the scheduler leads and binds again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from kubernetes import client

from airflow_gpu.devtools import gangs as G
from airflow_gpu.localcluster import control
from airflow_gpu.devtools.processes import free_port, wait_until

PODS, CREATORS, LISTERS, BURNERS = 300, 8, 4, 2
LATENCY = 0.5


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "leader-load", "pools": [{"name": "h100", "count": 40, "gpu": {"count": 8}}]}


def _bound(api, ns: str) -> int:
    return sum(1 for p in G.list_pods(api, ns) if p["spec"].get("nodeName"))


def test_a_busy_scheduler_keeps_its_lease_and_logs_a_lost_one_with_the_cause(kube_cluster, tmp_path):
    api = G.api_client(kube_cluster.kubeconfig)
    ns = "fence"
    G.ensure_namespace(api, ns)
    port = free_port()
    log_path = tmp_path / "scheduler.log"
    sched = G.scheduler_process(kube_cluster.kubeconfig, log_path, identity="busy", metrics_port=port).start()
    burners: list[subprocess.Popen] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        wait_until(lambda: "became leader" in log_path.read_text(), 30, what="the scheduler leading")
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]
        control.latency(LATENCY, kube_cluster.kubeconfig)

        def lister():  # the API server encodes every pod, over and over
            own = G.api_client(kube_cluster.kubeconfig, pool=1)
            while not stop.is_set():
                client.CoreV1Api(own).list_pod_for_all_namespaces(_preload_content=False).data

        def creator(k: int):
            own = G.api_client(kube_cluster.kubeconfig, pool=1)
            for i in range(k, PODS, CREATORS):
                client.CoreV1Api(own).create_namespaced_pod(ns, G.pod_manifest(f"p{i}", ns, 1, sim_seconds=600),
                                                           _preload_content=False)

        threads = [threading.Thread(target=lister, daemon=True) for _ in range(LISTERS)]
        threads += [threading.Thread(target=creator, args=(k,), daemon=True) for k in range(CREATORS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        wait_until(lambda: _bound(api, ns) == PODS or None, 50, interval=0.5, what=f"{PODS} pods bound")
        took, load = time.monotonic() - t0, os.getloadavg()[0]
        control.latency(0, kube_cluster.kubeconfig)
        stop.set()
        for t in threads:
            t.join(30)
        for b in burners:
            b.kill()
            b.wait()
        burners = []
        log = log_path.read_text()
        slow = [ln.split(": ", 1)[-1] for ln in log.splitlines() if "a renewal took" in ln]
        print(f"{PODS} pods bound in {took:.1f}s under load {load:.1f}, API latency {LATENCY}s; "
              f"fence refusals {G.scheduler_metric(port, 'airflow_gpu_scheduler_fence_refusals_total'):.0f}; "
              f"slow renewals warned: {slow}")
        assert G.scheduler_metric(port, "airflow_gpu_bindings_total") == PODS
        assert G.scheduler_metric(port, "airflow_gpu_scheduler_fence_refusals_total") == 0, log[-3000:]
        assert "lost leadership" not in log and "not leader" not in log, log[-3000:]
        assert log.count("became leader") == 1
        # every cycle's own CPU is recorded beside its duration, and under this load it is less
        cycles, cpu = (G.scheduler_metric(port, f"airflow_gpu_scheduling_cycle{m}_seconds_count") for m in ("", "_cpu"))
        wall, used = (G.scheduler_metric(port, f"airflow_gpu_scheduling_cycle{m}_seconds_sum") for m in ("", "_cpu"))
        assert cycles > 0 and cpu == cycles, (cycles, cpu)
        assert 0 < used < wall, (used, wall)
        # and its phases: each once per leading cycle (the world also while standing by), within its duration
        phase = {(labels["phase"], kind): value for kind in ("count", "sum")
                 for labels, value in G.scheduler_samples(port, f"airflow_gpu_scheduling_cycle_phase_seconds_{kind}")}
        names = ("world", "plans", "queue", "writes", "status", "publish")
        assert all(phase[(n, "count")] == cycles for n in names[1:]) and phase[("world", "count")] >= cycles, phase
        assert sum(phase[(n, "sum")] for n in names[1:]) < wall, (phase, wall)

        # on purpose: the API server stops answering for longer than the renew deadline
        os.kill(kube_cluster.pid, signal.SIGSTOP)
        try:
            time.sleep(3.5)
            wait_until(lambda: "lost leadership" in log_path.read_text(), 10, what="the lost leadership logged")
        finally:
            os.kill(kube_cluster.pid, signal.SIGCONT)
        line = next(ln for ln in log_path.read_text().splitlines() if "lost leadership" in ln)
        assert "busy lost leadership (lease" in line and "no successful renewal for" in line, line
        assert "renewal in flight for" in line or "last attempt:" in line, line  # the cause: the API
        wait_until(lambda: log_path.read_text().count("became leader") == 2, 20, what="leading again")
        client.CoreV1Api(api).create_namespaced_pod(ns, G.pod_manifest("after", ns, 1, sim_seconds=600))
        wait_until(lambda: _bound(api, ns) == PODS + 1 or None, 20, what="a pod bound after the outage")
    finally:
        stop.set()
        for b in burners:
            b.kill()
            b.wait()
        sched.stop()
        print(next((ln for ln in log_path.read_text().splitlines() if "slowest renewal" in ln), "no timing line"))

"""What live logs cost (issue 26): 50 deferred gangs (gangs of one pod whose rank 0 prints a line a
second), their GangTriggers in one event loop as in a triggerer, first with get_logs=False and then with
live logs (logging_interval), each for the same time on the same pods, printed side by side. Counted:
the Kubernetes API requests of the triggers (the local cluster's audit log, by user agent) and the CPU
time of this process, which runs only the triggers (the cluster is another process), per gang per
minute; the load average is printed before, between and after.

    python -m bench live_logs                                   # 50 gangs, 2 x 5 minutes, interval 30 s
    BENCH_LIVE_GANGS=3 BENCH_LIVE_MINUTES=1 python -m bench live_logs   # a small correctness run

Run it on a quiet machine: the triggers' CPU is measured, and the pods' own printing loads it too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import tempfile
import time
from collections import Counter
from pathlib import Path

from airflow_gpu import constants as C
from airflow_gpu.devtools import gangs as G
from airflow_gpu.devtools.kube import start_kube_cluster
from airflow_gpu.devtools.processes import wait_until
from airflow_gpu.kube.wire import api_time
from airflow_gpu.triggers.gang import USER_AGENT, GangTrigger
from bench.gang_trigger import run_triggers_for

NS = "bench-live"
PRINTER = "i=0; while true; do i=$((i+1)); echo \"step $i loss 0.$i\"; sleep 1; done"


def _pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {C.LABEL_GANG: name, C.LABEL_GANG_RANK: "0"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "base", "image": "busybox", "command": ["sh", "-c", PRINTER]}]}}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    gangs = int(os.environ.get("BENCH_LIVE_GANGS", "50"))
    minutes = float(os.environ.get("BENCH_LIVE_MINUTES", "5"))
    logging.getLogger("airflow_gpu.triggers.gang.GangTrigger").setLevel(logging.WARNING)  # lines counted, not shown
    interval = float(os.environ.get("BENCH_LIVE_INTERVAL", "30"))
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp, \
            start_kube_cluster(Path(tmp), audit=True) as cluster:
        from kubernetes import client

        api = G.api_client(cluster.kubeconfig)
        G.ensure_namespace(api, NS)
        core = client.CoreV1Api(api)
        names = [f"live-{i}" for i in range(gangs)]
        uids = {n: core.create_namespaced_pod(NS, _pod(n)).metadata.uid for n in names}
        wait_until(lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(NS).items),
                   timeout=120, what="the printing pods running")
        print(f"{gangs} running gangs (1 pod printing a line a second), {minutes:g} min each way; "
              f"load average before: {_load()}")
        phases = []
        for label, get_logs, logging_interval in (("warm-up", True, interval), ("get_logs=False", False, None),
                                                  (f"logging_interval={interval:g}", True, interval)):
            triggers = [GangTrigger(NS, n, [n], pod_uids={n: uids[n]}, config_file=str(cluster.kubeconfig),
                                    get_logs=get_logs, logging_interval=logging_interval, settle_seconds=0)
                        for n in names]
            started, cpu0 = time.time(), _cpu()
            asyncio.run(run_triggers_for(triggers, 15 if label == "warm-up" else minutes * 60, "their gangs ran"))
            ended, cpu = time.time(), _cpu() - cpu0
            if label != "warm-up":  # imports and first connections are paid once, in the warm-up
                phases.append((label, started, ended, cpu, _load()))
        # a request is audited when it ends, and a log stream the client left ends with its container
        # here: the pods are stopped before the requests of each phase are counted
        core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
        wait_until(lambda: not core.list_namespaced_pod(NS).items, timeout=120, what="the printing pods gone")
        time.sleep(3)
        audited = [e for e in cluster.audit_events() if e.get("userAgent") == USER_AGENT]
        rows = []
        for label, started, ended, cpu, load in phases:
            ours = [e for e in audited if started <= api_time(e["requestReceivedTimestamp"]) <= ended]
            verbs = Counter(f"{e['verb']} {e['objectRef'].get('subresource') or e['objectRef'].get('resource')}"
                            for e in ours)
            per = gangs * (ended - started) / 60
            rows.append((label, len(ours) / per, cpu / per, load, dict(verbs)))
        print(f"{'':24s} {'requests/gang/min':>18s} {'trigger CPU ms/gang/min':>24s}  {'load after':>16s}  requests")
        for label, req, cpu, load, verbs in rows:
            print(f"{label:24s} {req:18.2f} {cpu * 1000:24.1f}  {load:>16s}  {verbs}")
        print(f"added by live logs ({gangs} gangs): {rows[1][1] - rows[0][1]:.2f} requests and "
              f"{(rows[1][2] - rows[0][2]) * 1000:.1f} ms CPU per gang per minute")


if __name__ == "__main__":
    main()

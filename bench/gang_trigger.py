"""Kubernetes API requests of waiting tasks: GangTriggers in one event loop (as in a triggerer),
each watching a gang that cannot be placed, counted from the local cluster's audit log.

    python -m bench gang_trigger            # 10 gangs, 3 minutes
    BENCH_TRIGGER_GANGS=50 BENCH_TRIGGER_MINUTES=6 python -m bench gang_trigger
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from airflow_gpu import constants as C
from airflow_gpu.devtools import gangs as G
from airflow_gpu.devtools.kube import start_kube_cluster
from airflow_gpu.kube import TaskInstanceRef, WorkloadSpec, build
from airflow_gpu.kube.wire import api_time
from airflow_gpu.triggers.gang import USER_AGENT, GangTrigger

NS = "bench-wait"


async def run_triggers_for(triggers: list[GangTrigger], seconds: float,
                           while_what: str = "their gangs could not be placed") -> None:
    """Run the triggers for `seconds`, then close them; none may end meanwhile (also bench live_logs)."""
    gens = [t.run() for t in triggers]
    tasks = [asyncio.create_task(g.__anext__()) for g in gens]
    done, _ = await asyncio.wait(tasks, timeout=seconds)
    if done:
        raise RuntimeError(f"{len(done)} triggers ended while {while_what}")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for g in gens:
        await g.aclose()


def main() -> None:
    gangs = int(os.environ.get("BENCH_TRIGGER_GANGS", "10"))
    minutes = float(os.environ.get("BENCH_TRIGGER_MINUTES", "3"))
    with tempfile.TemporaryDirectory(prefix="bench-trigger-") as tmp, \
            start_kube_cluster(Path(tmp), audit=True) as cluster:
        api = G.api_client(cluster.kubeconfig)
        G.install_priority_classes(api)
        G.ensure_namespace(api, NS)
        triggers = []
        for i in range(gangs):  # 2 x 8 GPUs: no node of the small cluster has 8, so they wait
            ti = TaskInstanceRef("bench", f"wait-{i}", "manual__bench")
            m = build(WorkloadSpec(team="bench", namespace=NS, tier=C.TIER_BEST_EFFORT_TRAINING, image="i",
                                   workers=2, gpus_per_worker=8, task_instance=ti))
            uids = G.submit_gang(api, m)
            res = m.group_resource
            triggers.append(GangTrigger(NS, m.name, list(uids), pod_uids=uids, config_file=str(cluster.kubeconfig),
                                        group={"group": res.group, "version": res.version, "plural": res.plural}))
        started = time.time()
        asyncio.run(run_triggers_for(triggers, minutes * 60))
        ended = time.time()
        ours = [e for e in cluster.audit_events() if e.get("userAgent") == USER_AGENT
                and started <= api_time(e["requestReceivedTimestamp"]) <= ended]
        verbs = Counter(e["verb"] for e in ours)
        watches = verbs.pop("watch", 0)
        others = sum(verbs.values())
        per = gangs * (ended - started) / 60
        print(f"{gangs} waiting gangs for {(ended - started) / 60:.1f} min (watch_timeout "
              f"{triggers[0].watch_timeout} s):")
        print(f"  requests beyond the watch   {others:5d}  = {others / per:5.2f} per task per minute  {dict(verbs)}")
        print(f"  watch requests              {watches:5d}  = {watches / per:5.2f} per task per minute")
        print("  (a poll of each pod every poll_interval, as KubernetesPodTrigger does with its default 2 s, "
              "would be 30 per pod per minute)")


if __name__ == "__main__":
    main()

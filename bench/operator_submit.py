"""Task start -> every object of a 16-worker gang created (issue 11 target: < 2 s), against the local
cluster: GpuTrainingOperator.execute() from its first line to the deferral (the provider's
KubernetesHook, cleanup of earlier tries by label selector, PodGroup + Service + 16 pods created one
request each, UIDs stored), side by side with the bare creation of the same 18 objects with the
official client (the floor). No scheduler runs: the pods stay pending. Medians of ROUNDS runs.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

WORKERS = 16
ROUNDS = 5
SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"
SPEC = {"name": "bench-submit", "pools": [{"name": "gpu", "count": 20, "gpu": {"count": 8}, "cpu": "64",
                                            "memory": "512Gi"}]}


def main() -> None:
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="bench-submit-home-"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

    from airflow_gpu.devtools.kube import start_kube_cluster
    from airflow_gpu.devtools.operator_run import DictStateStore, FakeTaskInstance, context_for, execute_until_deferred
    from airflow_gpu.kube import TaskInstanceRef, WorkloadSpec, build
    from airflow_gpu.operators import GpuTrainingOperator
    from airflow_gpu.operators.cluster import GangClient

    with tempfile.TemporaryDirectory(prefix="bench-submit-") as tmp, start_kube_cluster(Path(tmp), SPEC) as cluster:
        os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": str(cluster.kubeconfig)}})
        import subprocess
        import sys

        rendered = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "render-k8s", "--config", str(SEED)],
                                  capture_output=True, text=True, check=True).stdout
        cluster.kubectl("apply", "-f", "-", input=rendered)
        api = cluster.api_client()
        operator_s, bare_s = [], []
        for i in range(ROUNDS):
            op = GpuTrainingOperator(task_id="train", team="research", tier="best-effort-training", workers=WORKERS,
                                     gpus_per_worker=1, image="python:3.11", retries=1, config_file=str(SEED))
            ti = FakeTaskInstance("bench_submit", "train", f"run-{i}")
            t0 = time.perf_counter()
            deferred = execute_until_deferred(op, context_for(ti, DictStateStore()))
            operator_s.append(time.perf_counter() - t0)
            assert len(deferred.trigger.pod_uids) == WORKERS
            op._delete_objects(op._client(), op._task_instance(context_for(ti, None)), wait=False)

            spec = WorkloadSpec(team="research", namespace="team-research", tier="best-effort-training",
                                image="python:3.11", workers=WORKERS, gpus_per_worker=1,
                                task_instance=TaskInstanceRef("bench_bare", "train", f"run-{i}"))
            manifests = build(spec)
            kube = GangClient(api, _Quiet())
            t0 = time.perf_counter()
            kube.create(manifests, {}, poll_interval=1.0)
            bare_s.append(time.perf_counter() - t0)
            kube.delete_all("team-research", spec.task_instance.selector(), manifests.group_resource)
    op_med, bare_med = statistics.median(operator_s), statistics.median(bare_s)
    print(f"16-worker gang (PodGroup + Service + {WORKERS} pods), local cluster, median of {ROUNDS}:")
    print(f"  GpuTrainingOperator.execute() start -> deferred  {op_med * 1000:7.1f} ms (target < 2000 ms)")
    print(f"  the same objects created directly (floor)        {bare_med * 1000:7.1f} ms")
    print(f"  operator overhead over the floor                 {(op_med - bare_med) * 1000:7.1f} ms")


class _Quiet:
    def info(self, *a, **k):
        pass

    warning = info


if __name__ == "__main__":
    main()

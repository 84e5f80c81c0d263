"""Server-side Table columns of the workload kinds, as kube-apiserver prints them for `kubectl get`."""

from __future__ import annotations

from airflow_gpu.localcluster.podutil import parse_time


def _duration(start: str | None, end: str | None, age) -> str:
    t0, t1 = parse_time(start), parse_time(end)
    if t0 is None:
        return ""
    if t1 is None:
        return age(start)
    seconds = int((t1 - t0).total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def _job_status(job: dict) -> str:
    conditions = {c["type"]: c.get("status") for c in (job.get("status") or {}).get("conditions") or []}
    for ctype, text in (("Complete", "Complete"), ("Failed", "Failed"), ("FailureTarget", "FailureTarget"),
                        ("SuccessCriteriaMet", "SuccessCriteriaMet"), ("Suspended", "Suspended")):
        if conditions.get(ctype) == "True":
            return text
    return "Running"


def _containers(obj: dict) -> tuple[str, str]:
    containers = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    return ",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers)


def _selector(obj: dict) -> str:
    selector = (obj.get("spec") or {}).get("selector") or {}
    return ",".join(f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())) or "<none>"


def columns(kind: str, col) -> list[dict] | None:
    wide = [col("Containers", priority=1), col("Images", priority=1), col("Selector", priority=1)]
    if kind == "Deployment":
        return [col("Name", fmt="name"), col("Ready"), col("Up-to-date", "integer"), col("Available", "integer"),
                col("Age")] + wide
    if kind == "ReplicaSet":
        return [col("Name", fmt="name"), col("Desired", "integer"), col("Current", "integer"),
                col("Ready", "integer"), col("Age")] + wide
    if kind == "Job":
        return [col("Name", fmt="name"), col("Status"), col("Completions"), col("Duration"), col("Age")] + wide
    if kind == "PodDisruptionBudget":
        return [col("Name", fmt="name"), col("Min Available"), col("Max Unavailable"),
                col("Allowed Disruptions", "integer"), col("Age")]
    if kind == "Lease":
        return [col("Name", fmt="name"), col("Holder"), col("Age")]
    return None


def row(kind: str, obj: dict, age) -> list | None:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    created = age(obj["metadata"].get("creationTimestamp"))
    name = obj["metadata"]["name"]
    if kind in ("Deployment", "ReplicaSet", "Job"):
        wide = [*_containers(obj), _selector(obj)]
    if kind == "Deployment":
        return [name, f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}", status.get("updatedReplicas", 0),
                status.get("availableReplicas", 0), created] + wide
    if kind == "ReplicaSet":
        return [name, spec.get("replicas", 1), status.get("replicas", 0), status.get("readyReplicas", 0), created] + wide
    if kind == "Job":
        completions = spec.get("completions")
        done = f"{status.get('succeeded', 0)}/{completions}" if completions is not None else \
            f"{status.get('succeeded', 0)}/1 of {spec.get('parallelism', 1)}"
        return [name, _job_status(obj), done, _duration(status.get("startTime"), status.get("completionTime"), age),
                created] + wide
    if kind == "PodDisruptionBudget":
        return [name, str(spec["minAvailable"]) if spec.get("minAvailable") is not None else "N/A",
                str(spec["maxUnavailable"]) if spec.get("maxUnavailable") is not None else "N/A",
                status.get("disruptionsAllowed", 0), created]
    if kind == "Lease":
        return [name, spec.get("holderIdentity") or "", created]
    return None

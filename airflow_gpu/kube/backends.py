"""How each gang backend recognises a gang: the group object, the pods' labels and annotations, and
the scheduler that places them (../shared/crds/README.md lists the upstream keys).

| backend | group object | pod membership | schedulerName |
|---|---|---|---|
| airflow-gpu | PodGroup scheduling.x-k8s.io/v1alpha1 | label scheduling.x-k8s.io/pod-group | airflow-gpu |
| coscheduling | PodGroup scheduling.x-k8s.io/v1alpha1 (+ minResources) | same label | scheduler-plugins-scheduler |
| volcano | PodGroup scheduling.volcano.sh/v1beta1 | annotation scheduling.k8s.io/group-name | volcano |
| kueue | none: Kueue builds its Workload from the pods | labels pod-group-name, queue-name; annotation pod-group-total-count | default-scheduler |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from airflow_gpu import constants as C


@dataclass(frozen=True)
class GroupResource:
    """Where a backend's group objects live in the API (for CustomObjectsApi calls)."""

    group: str
    version: str
    plural: str
    kind: str = C.PODGROUP_KIND

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


SCHEDULER_PLUGINS_PODGROUP = GroupResource(C.PODGROUP_GROUP, C.PODGROUP_VERSION, C.PODGROUP_PLURAL)
VOLCANO_PODGROUP = GroupResource(C.VOLCANO_PODGROUP_GROUP, C.VOLCANO_PODGROUP_VERSION, C.VOLCANO_PODGROUP_PLURAL)

DEFAULT_SCHEDULER = {
    C.GANG_BACKEND_AIRFLOW_GPU: C.DEFAULT_SCHEDULER_NAME,
    C.GANG_BACKEND_COSCHEDULING: C.COSCHEDULING_SCHEDULER_NAME,
    C.GANG_BACKEND_VOLCANO: C.VOLCANO_SCHEDULER_NAME,
    C.GANG_BACKEND_KUEUE: C.KUBE_DEFAULT_SCHEDULER_NAME,
}


def group_resource(backend: str) -> GroupResource | None:
    """The API resource of the backend's group object (None: the backend has none, e.g. Kueue)."""
    if backend in (C.GANG_BACKEND_AIRFLOW_GPU, C.GANG_BACKEND_COSCHEDULING):
        return SCHEDULER_PLUGINS_PODGROUP
    if backend == C.GANG_BACKEND_VOLCANO:
        return VOLCANO_PODGROUP
    if backend == C.GANG_BACKEND_KUEUE:
        return None
    raise ValueError(f"gang_backend={backend!r}: must be one of {', '.join(C.GANG_BACKENDS)}")


@dataclass(frozen=True)
class Membership:
    """What a pod carries to be a member of gang `name` for a backend."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = C.DEFAULT_SCHEDULER_NAME


def membership(backend: str, name: str, members: int | None = None, queue: str | None = None) -> Membership:
    """Pod labels/annotations that put a pod into gang `name` of `members` pods (the count is only
    needed by Kueue, whose pods carry it)."""
    labels = {C.LABEL_GANG: name}  # ours on every backend: the headless Service selects on it
    annotations: dict[str, str] = {}
    if backend in (C.GANG_BACKEND_AIRFLOW_GPU, C.GANG_BACKEND_COSCHEDULING):
        labels[C.LABEL_COSCHEDULING_POD_GROUP] = name
    elif backend == C.GANG_BACKEND_VOLCANO:
        annotations[C.ANNOTATION_VOLCANO_GROUP_NAME] = name
    elif backend == C.GANG_BACKEND_KUEUE:
        if not queue or not members:
            raise ValueError("queue and members: the kueue backend needs the team's LocalQueue name and the gang size")
        labels[C.LABEL_KUEUE_POD_GROUP_NAME] = name
        labels[C.LABEL_KUEUE_QUEUE_NAME] = queue
        annotations[C.ANNOTATION_KUEUE_POD_GROUP_TOTAL] = str(members)
    else:
        group_resource(backend)  # raises the error naming the allowed backends
    return Membership(labels, annotations, DEFAULT_SCHEDULER[backend])


def group_manifest(backend: str, namespace: str, name: str, members: int, *,
                   labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None,
                   min_resources: Mapping[str, str] | None = None, priority_class: str | None = None,
                   queue: str | None = None, schedule_timeout_seconds: int | None = None) -> dict | None:
    """The backend's group object for gang `name` (None for Kueue: it derives a Workload itself)."""
    resource = group_resource(backend)
    if resource is None:
        return None
    spec: dict = {"minMember": members}
    if resource is VOLCANO_PODGROUP:
        if priority_class:
            spec["priorityClassName"] = priority_class
        if queue:
            spec["queue"] = queue
        if min_resources:
            spec["minResources"] = dict(min_resources)
    else:
        if schedule_timeout_seconds is not None:
            spec["scheduleTimeoutSeconds"] = schedule_timeout_seconds
        if min_resources and backend == C.GANG_BACKEND_COSCHEDULING:  # its PreFilter checks it
            spec["minResources"] = dict(min_resources)
    return {"apiVersion": resource.api_version, "kind": resource.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                         "annotations": dict(annotations or {})},
            "spec": spec}

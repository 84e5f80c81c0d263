"""WorkloadSpec -> the Kubernetes objects of one attempt of a gang: W pods with rank and checkpoint
env (or the pods of its pod sets: a launcher and its workers, each set its own container), a
headless Service for rank discovery, and the backend's group object.

Every object carries the task instance's labels, so `TaskInstanceRef.selector()` finds all of them
(cleanup on every path), and the attempt's label, so one attempt's objects are told from another's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from airflow_gpu import constants as C
from airflow_gpu.kube.backends import (
    DEFAULT_SCHEDULER,
    GroupResource,
    Membership,
    group_manifest,
    group_resource,
    membership,
)
from airflow_gpu.kube.names import member_name
from airflow_gpu.kube.podlog import RESULT_PATH
from airflow_gpu.kube.spec import PodSetSpec, WorkloadSpec, WorkloadSpecError
from airflow_gpu.kube.template import apply_pod_template


@dataclass(frozen=True)
class GangManifests:
    """The objects to create, in this order: group, Service, pods (a scheduler that sees a pod
    before its group would treat it as a lone pod)."""

    group: dict | None
    group_resource: GroupResource | None
    service: dict | None
    pods: tuple[dict, ...]

    @property
    def name(self) -> str:
        return self.pods[0]["metadata"]["labels"].get(C.LABEL_GANG) or self.pods[0]["metadata"]["name"]

    def objects(self) -> list[dict]:
        return [o for o in (self.group, self.service) if o is not None] + list(self.pods)


def common_labels(spec: WorkloadSpec) -> dict[str, str]:
    """Labels on every object of the attempt."""
    labels = {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE, C.LABEL_TEAM: spec.team, C.LABEL_TIER: spec.tier,
              C.LABEL_ATTEMPT: str(spec.attempt)}
    if spec.task_instance is not None:
        labels.update(spec.task_instance.labels())
    return labels


def scheduling_annotations(spec: WorkloadSpec) -> dict[str, str]:
    """What the airflow-gpu scheduler reads from a gang's objects (kube/convert.py)."""
    out = {C.ANNOTATION_CHECKPOINTABLE: str(spec.checkpointable).lower(),
           C.ANNOTATION_INTERRUPTIONS: str(spec.interruptions), C.ANNOTATION_PREEMPTIONS: str(spec.preemptions)}
    if spec.gpu_products:
        out[C.ANNOTATION_GPU_PRODUCTS] = ",".join(spec.gpu_products)
    if spec.topology_annotation:
        out[C.ANNOTATION_TOPOLOGY] = spec.topology_annotation
    if spec.restart_overhead_seconds is not None:
        out[C.ANNOTATION_RESTART_OVERHEAD] = str(spec.restart_overhead_seconds)
    if spec.checkpoint_seconds is not None:
        out[C.ANNOTATION_CHECKPOINT_SECONDS] = str(spec.checkpoint_seconds)
    if spec.task_instance is not None:
        out[C.ANNOTATION_TASK_INSTANCE] = spec.task_instance.annotation()
    return out


def capacity_placement(spec: WorkloadSpec) -> tuple[dict[str, str], list[dict]]:
    """nodeSelector and tolerations that put the pods on the chosen capacity type, in the labels of
    the cluster's provisioner (constants.NODE_CAPACITY_TYPE_*). GKE has no on-demand label: on-demand
    there is "not spot", which the scheduler already enforces for work that may not run on spot."""
    spot = spec.capacity_type == C.CAPACITY_SPOT
    if spec.capacity_type is None:
        return {}, []
    tolerations = [{"key": C.TAINT_SPOT, "operator": "Exists", "effect": "NoSchedule"}] if spot else []
    if spec.capacity_labels == "karpenter":
        return {C.NODE_CAPACITY_TYPE_KARPENTER: C.CAPACITY_SPOT if spot else C.CAPACITY_ON_DEMAND}, tolerations
    if spec.capacity_labels == "eks":
        return {C.NODE_CAPACITY_TYPE_EKS: "SPOT" if spot else "ON_DEMAND"}, tolerations
    if spot:  # gke
        tolerations.append({"key": C.TAINT_GKE_SPOT, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
        return {C.NODE_GKE_SPOT: "true"}, tolerations
    return {}, []


def _node_selector(spec: WorkloadSpec, capacity: dict[str, str]) -> dict[str, str]:
    selector = dict(spec.node_selector)
    for key, value in capacity.items():
        if selector.get(key, value) != value:
            raise WorkloadSpecError(f"node_selector[{key!r}]={selector[key]!r} contradicts capacity_type="
                                    f"{spec.capacity_type!r} ({key}={value}); drop it from node_selector")
        selector[key] = value
    return selector


def member_address(spec: WorkloadSpec, rank: int) -> str:
    """The stable DNS name of member `rank`: its record in the gang's headless Service."""
    name = spec.gang_name
    return f"{member_name(name, rank)}.{name}.{spec.namespace}.svc"


def rank_env(spec: WorkloadSpec, rank: int) -> list[dict]:
    """torch.distributed env:// rendezvous: rank 0's stable DNS name through the headless Service."""
    if spec.pod_sets:
        return pod_set_env(spec, rank)
    return [{"name": C.ENV_MASTER_ADDR, "value": member_address(spec, 0)},
            {"name": C.ENV_MASTER_PORT, "value": str(spec.master_port)},
            {"name": C.ENV_WORLD_SIZE, "value": str(spec.workers)},
            {"name": C.ENV_RANK, "value": str(rank)},
            {"name": C.ENV_LOCAL_WORLD_SIZE, "value": str(spec.processes_per_worker)}]


def pod_set_env(spec: WorkloadSpec, rank: int) -> list[dict]:
    """A gang of pod sets (launcher + workers): MASTER_ADDR is the first set's first pod (the
    launcher: put it first); RANK and WORLD_SIZE count the pods of the pod's own set (the workers are
    ranks 0..W-1 of a world of W, the launcher is not one of them); LOCAL_WORLD_SIZE its GPUs (or 1);
    AIRFLOW_GPU_POD_SET its set, and AIRFLOW_GPU_HOSTS_<SET> for every set the DNS names of its pods
    (an MPI launcher's host list)."""
    members = spec.members()
    _, own, index = members[rank]
    env = [{"name": C.ENV_MASTER_ADDR, "value": member_address(spec, 0)},
           {"name": C.ENV_MASTER_PORT, "value": str(spec.master_port)},
           {"name": C.ENV_WORLD_SIZE, "value": str(own.replicas)},
           {"name": C.ENV_RANK, "value": str(index)},
           {"name": C.ENV_LOCAL_WORLD_SIZE, "value": str(own.gpus or 1)},
           {"name": C.ENV_POD_SET, "value": own.name}]
    for ps in spec.pod_sets:
        hosts = [member_address(spec, r) for r, s, _ in members if s is ps]
        env.append({"name": ps.hosts_env, "value": ",".join(hosts)})
    return env


def checkpoint_env(spec: WorkloadSpec, rank: int) -> list[dict]:
    """The contract of checkpoint/ENV.md (attempt and interruptions always; the rest when set)."""
    env = [{"name": C.ENV_ATTEMPT, "value": str(spec.attempt)},
           {"name": C.ENV_INTERRUPTIONS, "value": str(spec.interruptions + spec.preemptions)}]
    optional = ((C.ENV_CHECKPOINT_URI, spec.checkpoint_uri_of(rank)), (C.ENV_RESUME_URI, spec.resume_uri),
                (C.ENV_DEADLINE, spec.deadline), (C.ENV_CHECKPOINT_KEEP_LAST, spec.checkpoint_keep_last),
                (C.ENV_CHECKPOINT_KEEP_EVERY, spec.checkpoint_keep_every))
    env += [{"name": k, "value": str(v)} for k, v in optional if v is not None]
    return env


def _container(spec: WorkloadSpec, rank: int, pod_set: PodSetSpec | None = None) -> dict:
    env = (rank_env(spec, rank) if spec.gang else []) + checkpoint_env(spec, rank)
    own_env = {**spec.env_vars, **pod_set.env_vars} if pod_set is not None else spec.env_vars
    env += [{"name": k, "value": v} for k, v in sorted(own_env.items())]
    env += [{"name": s.env, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}}
            for s in spec.secrets if s.env]
    env_from = [{"secretRef": {"name": s.secret}} for s in spec.secrets if not s.env]
    if spec.s3_secret:
        env_from.append({"secretRef": {"name": spec.s3_secret}})
    own_resources = (pod_set.container_resources if pod_set is not None and pod_set.container_resources
                     else spec.container_resources)
    resources = {part: dict(own_resources.get(part) or {}) for part in ("requests", "limits")}
    resources["limits"].update(spec.gpu_limits() if pod_set is None else pod_set.gpu_limits())
    # the training code's result: the kubelet keeps this file as the termination message (rank 0's is read)
    env.append({"name": C.ENV_RESULT_PATH, "value": RESULT_PATH})
    image, cmds, arguments = spec.image, spec.cmds, spec.arguments
    if pod_set is not None:  # the set's own container, where it gives one
        image = pod_set.image or image
        cmds = pod_set.cmds if pod_set.cmds is not None else cmds
        arguments = pod_set.arguments if pod_set.arguments is not None else arguments
    container: dict = {"name": spec.container_name, "image": image, "env": env,
                       "resources": {k: v for k, v in resources.items() if v},
                       "terminationMessagePath": RESULT_PATH, "terminationMessagePolicy": "File"}
    if cmds:
        container["command"] = list(cmds)
    if arguments:
        container["args"] = list(arguments)
    if env_from:
        container["envFrom"] = env_from
    if spec.volume_mounts:
        container["volumeMounts"] = [dict(m) for m in spec.volume_mounts]
    return container


def build(spec: WorkloadSpec) -> GangManifests:
    """The objects of `spec`'s attempt. Deterministic: the same spec gives the same objects."""
    name = spec.gang_name
    labels = common_labels(spec)
    annotations = scheduling_annotations(spec)
    capacity_selector, capacity_tolerations = capacity_placement(spec)
    node_selector = _node_selector(spec, capacity_selector)
    member = (membership(spec.gang_backend, name, spec.workers, spec.queue) if spec.gang
              else Membership(scheduler_name=DEFAULT_SCHEDULER[spec.gang_backend]))  # lone pod: no gang labels
    pods = []
    for rank, pod_set, _ in spec.members():
        pod_name = member_name(name, rank) if spec.gang else name
        pod_labels = {**spec.labels, **labels, **member.labels}
        if spec.gang:
            pod_labels[C.LABEL_GANG_RANK] = str(rank)
        if pod_set is not None:
            pod_labels[C.LABEL_POD_SET] = pod_set.name
        pod_spec: dict = {
            "schedulerName": spec.scheduler_name or member.scheduler_name,
            "restartPolicy": "Never",  # a relaunch is a new attempt with new pods, never a restart in place
            "priorityClassName": spec.priority_class_name,
            "enableServiceLinks": False,
            "containers": [_container(spec, rank, pod_set)],
        }
        if spec.gang:
            pod_spec["hostname"] = pod_name
            pod_spec["subdomain"] = name
        if node_selector:
            pod_spec["nodeSelector"] = dict(node_selector)
        tolerations = [dict(t) for t in spec.tolerations] + [t for t in capacity_tolerations if t not in spec.tolerations]
        if tolerations:
            pod_spec["tolerations"] = tolerations
        if spec.volumes:
            pod_spec["volumes"] = [dict(v) for v in spec.volumes]
        if spec.service_account_name:
            pod_spec["serviceAccountName"] = spec.service_account_name
        if spec.termination_grace_period is not None:
            pod_spec["terminationGracePeriodSeconds"] = spec.termination_grace_period
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name, "namespace": spec.namespace, "labels": pod_labels,
                            "annotations": {**spec.annotations, **annotations, **member.annotations}},
               "spec": pod_spec}
        if spec.pod_template:
            apply_pod_template(pod, spec.pod_template, spec.container_name,
                               simple_affinity=spec.gang_backend == C.GANG_BACKEND_AIRFLOW_GPU)
        problem = file_checkpoint_problem(pod["spec"], spec.container_name, spec.checkpoint_uri)
        if problem:
            raise WorkloadSpecError(f"checkpoint_uri={spec.checkpoint_uri!r}: {problem}")
        pods.append(pod)
    if not spec.gang:
        return GangManifests(None, None, None, tuple(pods))
    group = group_manifest(
        spec.gang_backend, spec.namespace, name, spec.workers, labels=labels, annotations=annotations,
        min_resources=_min_resources(spec), priority_class=spec.priority_class_name, queue=spec.queue,
        schedule_timeout_seconds=spec.schedule_timeout_seconds)
    return GangManifests(group, group_resource(spec.gang_backend), _service(spec, labels), tuple(pods))


# volumes that live and die with their pod: a checkpoint there is gone when the attempt ends
POD_LIFETIME_VOLUMES = frozenset({"emptyDir", "ephemeral", "configMap", "secret", "downwardAPI", "projected"})
FILE_CHECKPOINT_FIX = ("use an s3:// store (SeaweedFS on the local platform), or mount a volume every rank and "
                       "every attempt shares at that path (volumes= + volume_mounts=, or the pod template: e.g. a "
                       "ReadWriteMany persistentVolumeClaim or nfs); the local cluster has no such volume "
                       "(README, 'Checkpoints on file://')")


def file_checkpoint_problem(pod_spec: dict, container_name: str, uri: str | None) -> str | None:
    """Why a file:// checkpoint store would not survive the attempt, or None. On Kubernetes a path is
    in the container's own filesystem unless a volume is mounted there: the save "succeeds" and
    vanishes with the pod, and the next attempt finds nothing to resume. So the store must be under
    a writable mount of the training container whose volume outlives the pod."""
    if not uri or not uri.startswith("file://"):
        return None
    rest = uri[len("file://"):]
    path = PurePosixPath("/" + rest[len("localhost/"):] if rest.startswith("localhost/") else rest)
    container = next((c for c in pod_spec.get("containers") or [] if c.get("name") == container_name), {})
    mounts = [m for m in container.get("volumeMounts") or []
              if m.get("mountPath") and (path == PurePosixPath(m["mountPath"]) or PurePosixPath(m["mountPath"]) in path.parents)]
    if not mounts:
        return f"{path} is on no volume of the pods (it would be written inside the container and lost with it); " \
               + FILE_CHECKPOINT_FIX
    mount = max(mounts, key=lambda m: len(m["mountPath"]))  # the innermost mount holds the path
    volume = next((v for v in pod_spec.get("volumes") or [] if v.get("name") == mount.get("name")), {})
    kind = next((k for k in volume if k != "name"), None)
    if kind in POD_LIFETIME_VOLUMES:
        return f"{path} is on volume {mount.get('name')!r}, a {kind} that ends with its pod; " + FILE_CHECKPOINT_FIX
    if mount.get("readOnly"):
        return f"{path} is on volume {mount.get('name')!r}, mounted readOnly; " + FILE_CHECKPOINT_FIX
    return None


def _min_resources(spec: WorkloadSpec) -> dict[str, str]:
    if not spec.pod_sets:
        return {res: str(int(qty) * spec.workers) for res, qty in spec.gpu_limits().items()}
    total: dict[str, int] = {}
    for ps in spec.pod_sets:
        for res, qty in ps.gpu_limits().items():
            total[res] = total.get(res, 0) + int(qty) * ps.replicas
    return {res: str(n) for res, n in total.items()}


def _service(spec: WorkloadSpec, labels: dict[str, str]) -> dict:
    """Headless: a DNS record per member (<pod>.<gang>.<namespace>.svc), published before the pods
    are Ready so that ranks can rendezvous while they start."""
    name = spec.gang_name
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": spec.namespace, "labels": dict(labels)},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {C.LABEL_GANG: name},
                     "ports": [{"name": "rendezvous", "port": spec.master_port, "targetPort": spec.master_port,
                                "protocol": "TCP"}]}}

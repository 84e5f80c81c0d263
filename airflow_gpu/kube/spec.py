"""`WorkloadSpec`: everything that decides the Kubernetes shape of one attempt of a gang.

Validated when it is built (the operator builds one at DAG parse time for its dry run), each error
naming the field and the fix. It knows nothing about the team config: whether the team may use the
tier or the products is checked against the config by the operator; the capacity type is the verdict
of core/capacity.py, passed in, and only checked here against the one rule that needs no config
(spot only for checkpointable work).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from airflow_gpu import constants as C
from airflow_gpu.core.capacity import is_spot_eligible
from airflow_gpu.core.model import TopologyLevel
from airflow_gpu.core.tiers import priority_class_name
from airflow_gpu.kube.names import MAX_GANG_NAME, TaskInstanceRef, gang_name, is_dns_label
from airflow_gpu.kube.wire import as_dict


class WorkloadSpecError(ValueError):
    """A field of a WorkloadSpec that cannot become a valid gang; the message names it and the fix."""


CAPACITY_LABELS = ("karpenter", "eks", "gke")  # which cloud's node labels select spot / on-demand
TOPOLOGIES = tuple(level.value for level in TopologyLevel if level is not TopologyLevel.ANY)
CHECKPOINT_SCHEMES = ("s3://", "file://")
# env the gang's pods get from the spec; an author's env_vars may not set them
RESERVED_ENV = frozenset({
    C.ENV_MASTER_ADDR, C.ENV_MASTER_PORT, C.ENV_WORLD_SIZE, C.ENV_RANK, C.ENV_LOCAL_WORLD_SIZE,
    C.ENV_CHECKPOINT_URI, C.ENV_RESUME_URI, C.ENV_ATTEMPT, C.ENV_INTERRUPTIONS, C.ENV_DEADLINE,
    C.ENV_CHECKPOINT_KEEP_LAST, C.ENV_CHECKPOINT_KEEP_EVERY, C.ENV_POD_SET,
})
# names that hold credentials: only from a Secret (secretKeyRef / envFrom), never a literal in the pod spec
_CREDENTIAL_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY|API_KEY", re.I)
# our annotations an author may set: local-cluster simulation knobs and the backfill hint
USER_SETTABLE_ANNOTATIONS = frozenset({C.ANNOTATION_SIM_DURATION, C.ANNOTATION_SIM_EXIT_CODE,
                                       C.ANNOTATION_EXPECTED_DURATION, C.ANNOTATION_RESTART_OVERHEAD,
                                       C.ANNOTATION_CHECKPOINT_SECONDS})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_MIG_PROFILE = re.compile(r"^\d+g\.\d+gb$")
_GPU_RESOURCES = (C.RESOURCE_GPU, C.RESOURCE_MIG_PREFIX)


@dataclass(frozen=True)
class SecretEnv:
    """Environment from a Kubernetes Secret: one key as `env` (secretKeyRef), or, with env and key
    None, every key of the Secret (envFrom)."""

    secret: str
    key: str | None = None
    env: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.secret, str) or len(self.secret) > 253 or not _DNS_SUBDOMAIN.match(self.secret):
            raise WorkloadSpecError(f"secrets: Secret name {self.secret!r} is not a valid Kubernetes name")
        if (self.key is None) != (self.env is None):
            raise WorkloadSpecError(f"secrets: Secret {self.secret!r}: give both key and env (one variable) "
                                    f"or neither (every key of the Secret as env)")
        if self.env is not None and not _ENV_NAME.match(self.env):
            raise WorkloadSpecError(f"secrets: env name {self.env!r} is not a valid environment variable name")

    @classmethod
    def of(cls, value: Any) -> "SecretEnv":
        if isinstance(value, SecretEnv):
            return value
        if isinstance(value, str):
            return cls(secret=value)
        if isinstance(value, Mapping):
            unknown = set(value) - {"secret", "key", "env"}
            if unknown or "secret" not in value:
                raise WorkloadSpecError(f"secrets: {dict(value)!r}: use {{'secret': NAME}} or "
                                        f"{{'secret': NAME, 'key': KEY, 'env': VAR}}")
            return cls(secret=value["secret"], key=value.get("key"), env=value.get("env"))
        raise WorkloadSpecError(f"secrets: {value!r}: give a SecretEnv, a Secret name or a dict")


def _frozen_map(value: Mapping | None, what: str) -> Mapping[str, str]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise WorkloadSpecError(f"{what}: must be a mapping of strings, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float, bool)):
            raise WorkloadSpecError(f"{what}[{k!r}]: keys and values must be strings")
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return MappingProxyType(out)


def _wire_list(value: Sequence | None, what: str) -> tuple[dict, ...]:
    """Kubernetes objects given as wire-format dicts or client models, kept as wire dicts."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)):
        raise WorkloadSpecError(f"{what}: must be a list of objects, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        wire = as_dict(item)
        if not isinstance(wire, dict):
            raise WorkloadSpecError(f"{what}[{i}]: {item!r} is not a Kubernetes object")
        out.append(wire)
    return tuple(out)


def _positive_int(value: Any, what: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkloadSpecError(f"{what}={value!r}: must be an integer >= {minimum}")


POD_SET_FIELDS = ("name", "replicas", "gpus", "mig_profile", "image", "cmds", "arguments", "env_vars",
                  "container_resources")


@dataclass(frozen=True)
class PodSetSpec:
    """One pod set of a gang (a launcher, the workers; Kueue's podSets, JobSet's replicatedJobs):
    `replicas` alike pods with `gpus` whole GPUs each, or one `mig_profile` slice each, or neither (a
    CPU-only pod, e.g. an MPI launcher or a rendezvous server), each set with its own container:
    image, cmds, arguments (None: the gang's), env_vars (over the gang's), container_resources (empty:
    the gang's). Authors may give a dict with these keys (`PodSetSpec.of`)."""

    name: str
    replicas: int = 1
    gpus: int = 0
    mig_profile: str | None = None
    image: str | None = None
    cmds: tuple[str, ...] | None = None
    arguments: tuple[str, ...] | None = None
    env_vars: Mapping[str, str] = field(default_factory=dict)
    container_resources: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        setter = object.__setattr__
        for what in ("cmds", "arguments"):
            value = getattr(self, what)
            if value is not None:
                if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                    raise WorkloadSpecError(f"{what}: must be a list of strings (got {value!r})")
                setter(self, what, tuple(str(v) for v in value))
        setter(self, "env_vars", _frozen_map(self.env_vars, "env_vars"))
        setter(self, "container_resources", MappingProxyType(dict(as_dict(self.container_resources or {}))))

    @classmethod
    def of(cls, value: Any) -> "PodSetSpec":
        if isinstance(value, PodSetSpec):
            return value
        if not isinstance(value, Mapping):
            raise WorkloadSpecError(f": give a dict with {', '.join(POD_SET_FIELDS)} (or a PodSetSpec), got "
                                    f"{type(value).__name__}")
        unknown = sorted(set(value) - set(POD_SET_FIELDS))
        if unknown:
            raise WorkloadSpecError(f".{unknown[0]}: unknown field; a pod set has {', '.join(POD_SET_FIELDS)}")
        if "name" not in value:
            raise WorkloadSpecError(".name: every pod set needs a name (e.g. 'launcher', 'worker')")
        return cls(**value)

    @property
    def uses_gpu(self) -> bool:
        return bool(self.gpus) or self.mig_profile is not None

    def check(self, where: str) -> None:
        """Raise WorkloadSpecError naming `where`.field (e.g. pod_sets[1].replicas)."""
        if not is_dns_label(self.name, 20):
            raise WorkloadSpecError(f"{where}.name={self.name!r}: must be a lowercase DNS label of at most 20 "
                                    "characters (it names the set's env AIRFLOW_GPU_HOSTS_<NAME> and label)")
        _positive_int(self.replicas, f"{where}.replicas")
        _positive_int(self.gpus, f"{where}.gpus", 0)
        if self.gpus and self.mig_profile is not None:
            raise WorkloadSpecError(f"{where}.mig_profile: give gpus (whole GPUs per pod) or mig_profile (one MIG "
                                    "slice per pod), not both; neither: a CPU-only pod")
        if self.mig_profile is not None and (not isinstance(self.mig_profile, str)
                                             or not _MIG_PROFILE.match(self.mig_profile)):
            raise WorkloadSpecError(f"{where}.mig_profile={self.mig_profile!r}: must look like '1g.10gb'")
        if self.image is not None and (not isinstance(self.image, str) or not self.image):
            raise WorkloadSpecError(f"{where}.image: give the container image, e.g. 'python:3.11', or leave it "
                                    "out for the gang's")
        _check_env(self.env_vars, f"{where}.env_vars")
        _check_resources(self.container_resources, f"{where}.container_resources")

    def gpu_limits(self) -> dict[str, str]:
        if self.mig_profile is not None:
            return {f"{C.RESOURCE_MIG_PREFIX}{self.mig_profile}": "1"}
        return {C.RESOURCE_GPU: str(self.gpus)} if self.gpus else {}

    @property
    def hosts_env(self) -> str:
        """The env var listing the set's pods' DNS names: AIRFLOW_GPU_HOSTS_<NAME>."""
        return C.ENV_HOSTS_PREFIX + self.name.upper().replace("-", "_")


def _check_env(env_vars: Mapping[str, str], what: str) -> None:
    for name in env_vars:
        if not _ENV_NAME.match(name):
            raise WorkloadSpecError(f"{what}[{name!r}]: not a valid environment variable name")
        if name in RESERVED_ENV or name.startswith(C.ENV_HOSTS_PREFIX):
            raise WorkloadSpecError(f"{what}[{name!r}]: set by airflow-gpu for every pod (rank and "
                                    f"checkpoint contract); remove it")
        if _CREDENTIAL_NAME.search(name):
            raise WorkloadSpecError(f"{what}[{name!r}]: looks like a credential; put it in a Kubernetes "
                                    f"Secret and pass secrets=[SecretEnv(secret=..., key=..., env={name!r})]")


def _check_resources(res: Mapping[str, Any], what: str) -> None:
    unknown = set(res) - {"requests", "limits"}
    if unknown:
        raise WorkloadSpecError(f"{what}: unknown keys {sorted(unknown)}; use "
                                f"{{'requests': {{'cpu': '4', 'memory': '16Gi'}}, 'limits': {{...}}}}")
    for part in ("requests", "limits"):
        for resource in (res.get(part) or {}):
            if resource.startswith(_GPU_RESOURCES):
                raise WorkloadSpecError(f"{what}.{part}[{resource}]: GPUs come from "
                                        f"gpus_per_worker or mig_profile, not container_resources")


@dataclass(frozen=True)
class WorkloadSpec:
    """One attempt of a gang of `workers` pods (or, with gang=False, one lone pod)."""

    team: str
    namespace: str
    tier: str
    image: str
    workers: int = 1
    gpus_per_worker: int | None = None
    mig_profile: str | None = None  # one slice per worker, e.g. "1g.10gb"
    gpu_products: tuple[str, ...] = ()  # preference order
    task_instance: TaskInstanceRef | None = None
    name: str | None = None  # the gang's name; default: from task_instance and attempt (kube.names)
    attempt: int = 0  # AIRFLOW_GPU_ATTEMPT: strictly greater for every relaunch (checkpoint/ENV.md)
    interruptions: int = 0  # relaunches in this try after a spot interruption or a lost node
    preemptions: int = 0  # relaunches in this try after the scheduler preempted the gang
    priority_class: str | None = None  # default: the tier's PriorityClass (core.tiers)
    capacity_type: str | None = None  # spot | on-demand (core/capacity.py's verdict) | None: either
    capacity_labels: str = "karpenter"  # karpenter | eks | gke: the labels that select the capacity type
    topology: str | None = None  # node | clique | rack | zone
    topology_required: bool = False
    checkpoint_uri: str | None = None
    checkpoint_per_rank: bool = False  # every rank writes its own store <uri>/rank-<r> (else rank 0 saves)
    resume_uri: str | None = None
    deadline: str | None = None  # RFC 3339 with timezone
    checkpoint_keep_last: int | None = None
    checkpoint_keep_every: int | None = None
    s3_secret: str | None = None  # Secret with the AWS_* variables, as envFrom (or None: pod identity)
    cmds: tuple[str, ...] = ()
    arguments: tuple[str, ...] = ()
    env_vars: Mapping[str, str] = field(default_factory=dict)
    secrets: tuple[SecretEnv, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[dict, ...] = ()
    volume_mounts: tuple[dict, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[dict, ...] = ()
    service_account_name: str | None = None
    termination_grace_period: int | None = None
    # seconds each restart of the gang computes nothing (over its tier's), and its SIGTERM checkpoint takes
    restart_overhead_seconds: int | None = None
    checkpoint_seconds: int | None = None
    container_resources: Mapping[str, Any] = field(default_factory=dict)  # {"requests": {...}, "limits": {...}}
    container_name: str = "base"
    gang_backend: str = C.GANG_BACKEND_AIRFLOW_GPU
    scheduler_name: str | None = None  # default: the backend's scheduler
    queue: str | None = None  # Volcano Queue / Kueue LocalQueue
    master_port: int = C.DEFAULT_MASTER_PORT
    schedule_timeout_seconds: int | None = None
    gang: bool = True  # False: one lone pod, no PodGroup, Service or gang labels (inference)
    pod_template: Mapping[str, Any] | None = None  # a Pod (wire dict) under every member (kube/template.py)
    # launcher + workers: the gang's pods by set, in this order (workers is then their total, and
    # gpus_per_worker / mig_profile are per set); empty: `workers` alike pods
    pod_sets: tuple[PodSetSpec, ...] = ()

    def __post_init__(self) -> None:
        setter = object.__setattr__  # frozen: normalise inputs once, here
        setter(self, "gpu_products", tuple(self.gpu_products))
        setter(self, "cmds", tuple(self.cmds))
        setter(self, "arguments", tuple(self.arguments))
        setter(self, "env_vars", _frozen_map(self.env_vars, "env_vars"))
        setter(self, "labels", _frozen_map(self.labels, "labels"))
        setter(self, "annotations", _frozen_map(self.annotations, "annotations"))
        setter(self, "node_selector", _frozen_map(self.node_selector, "node_selector"))
        setter(self, "secrets", tuple(SecretEnv.of(s) for s in (self.secrets or ())))
        setter(self, "volumes", _wire_list(self.volumes, "volumes"))
        setter(self, "volume_mounts", _wire_list(self.volume_mounts, "volume_mounts"))
        setter(self, "tolerations", _wire_list(self.tolerations, "tolerations"))
        setter(self, "container_resources", MappingProxyType(dict(as_dict(self.container_resources or {}))))
        self._normalise_pod_sets()
        if self.pod_template is not None:
            template = as_dict(self.pod_template)
            if not isinstance(template, dict) or not isinstance(template.get("spec", {}), dict):
                raise WorkloadSpecError("pod_template: must be a Pod (a dict with metadata and spec, or a V1Pod)")
            setter(self, "pod_template", MappingProxyType(template))
        self._validate()

    # --- validation ---------------------------------------------------------------------------

    def _validate(self) -> None:
        for what in ("team", "namespace", "tier"):
            if not is_dns_label(getattr(self, what)):
                raise WorkloadSpecError(f"{what}={getattr(self, what)!r}: must be a lowercase DNS label "
                                        f"(a-z, 0-9, '-', starting with a letter, at most 63)")
        if not self.image or not isinstance(self.image, str):
            raise WorkloadSpecError("image: give the container image, e.g. 'python:3.11'")
        if self.pod_sets:  # first: `workers` is their total
            self._validate_pod_sets()
        _positive_int(self.workers, "workers")
        self._validate_gpus()
        if self.name is None and self.task_instance is None:
            raise WorkloadSpecError("name: give the gang's name or task_instance (the name is derived from it)")
        if self.name is not None and not is_dns_label(self.name, MAX_GANG_NAME):
            raise WorkloadSpecError(f"name={self.name!r}: must be a lowercase DNS label of at most {MAX_GANG_NAME} "
                                    f"characters (pods are <name>-<rank>)")
        _positive_int(self.attempt, "attempt", 0)
        _positive_int(self.interruptions, "interruptions", 0)
        _positive_int(self.preemptions, "preemptions", 0)
        if not self.gang and self.workers != 1:
            raise WorkloadSpecError(f"gang=False with workers={self.workers}: a lone pod has one worker")
        if self.gang_backend not in C.GANG_BACKENDS:
            raise WorkloadSpecError(f"gang_backend={self.gang_backend!r}: must be one of {', '.join(C.GANG_BACKENDS)}")
        if self.gang and self.gang_backend == C.GANG_BACKEND_KUEUE and not self.queue:
            raise WorkloadSpecError("queue: the kueue backend needs the team's LocalQueue name (label "
                                    f"{C.LABEL_KUEUE_QUEUE_NAME})")
        self._validate_capacity()
        if self.topology is not None and self.topology not in TOPOLOGIES:
            raise WorkloadSpecError(f"topology={self.topology!r}: must be one of {', '.join(TOPOLOGIES)} or None")
        if self.topology_required and self.topology is None:
            raise WorkloadSpecError("topology_required=True needs topology (node, clique, rack or zone)")
        self._validate_checkpoint()
        self._validate_env()
        self._validate_metadata()
        for what in ("termination_grace_period", "restart_overhead_seconds", "checkpoint_seconds"):
            if getattr(self, what) is not None:
                _positive_int(getattr(self, what), what, 0)
        if self.schedule_timeout_seconds is not None:
            _positive_int(self.schedule_timeout_seconds, "schedule_timeout_seconds")
        if isinstance(self.master_port, bool) or not isinstance(self.master_port, int) or not 1 <= self.master_port <= 65535:
            raise WorkloadSpecError(f"master_port={self.master_port!r}: must be a TCP port 1..65535")
        if not is_dns_label(self.container_name):
            raise WorkloadSpecError(f"container_name={self.container_name!r}: must be a lowercase DNS label")

    def _normalise_pod_sets(self) -> None:
        if isinstance(self.pod_sets, (str, bytes, Mapping)) or not isinstance(self.pod_sets, Sequence):
            raise WorkloadSpecError(f"pod_sets: must be a list of pod sets (got {type(self.pod_sets).__name__})")
        sets = []
        for i, value in enumerate(self.pod_sets):
            try:
                sets.append(PodSetSpec.of(value))
            except (WorkloadSpecError, TypeError) as exc:
                text = str(exc)
                raise WorkloadSpecError(f"pod_sets[{i}]{text if text.startswith(('.', ':')) else ': ' + text}") from None
        object.__setattr__(self, "pod_sets", tuple(sets))
        if sets:
            if self.gpus_per_worker is not None or self.mig_profile is not None:
                raise WorkloadSpecError("pod_sets: give pod_sets (GPUs per set) or gpus_per_worker / mig_profile, "
                                        "not both")
            if all(isinstance(ps.replicas, int) and not isinstance(ps.replicas, bool) for ps in sets):
                object.__setattr__(self, "workers", sum(ps.replicas for ps in sets))

    def _validate_pod_sets(self) -> None:
        names = []
        for i, ps in enumerate(self.pod_sets):
            ps.check(f"pod_sets[{i}]")
            if ps.name in names:
                raise WorkloadSpecError(f"pod_sets[{i}].name={ps.name!r}: two pod sets have this name")
            names.append(ps.name)
        if not any(ps.uses_gpu for ps in self.pod_sets):
            raise WorkloadSpecError("pod_sets: no set asks for GPUs (gpus or mig_profile); a gang of CPU-only pods "
                                    "is not GPU work")
        if not self.gang:
            raise WorkloadSpecError("pod_sets: a lone pod (gang=False) has no pod sets")

    def _validate_gpus(self) -> None:
        if self.pod_sets:
            pass  # per set (_validate_pod_sets)
        elif (self.gpus_per_worker is None) == (self.mig_profile is None):
            raise WorkloadSpecError("gpus_per_worker / mig_profile: give exactly one (whole GPUs per worker, "
                                    "or one MIG slice per worker such as '1g.10gb')")
        elif self.gpus_per_worker is not None:
            _positive_int(self.gpus_per_worker, "gpus_per_worker")
        elif not isinstance(self.mig_profile, str) or not _MIG_PROFILE.match(self.mig_profile):
            raise WorkloadSpecError(f"mig_profile={self.mig_profile!r}: must look like '1g.10gb'")
        if not all(isinstance(p, str) and p and "," not in p for p in self.gpu_products):
            raise WorkloadSpecError(f"gpu_products={self.gpu_products!r}: product names, no commas")
        _check_resources(self.container_resources, "container_resources")

    def _validate_capacity(self) -> None:
        if self.capacity_type not in (None, C.CAPACITY_SPOT, C.CAPACITY_ON_DEMAND):
            raise WorkloadSpecError(f"capacity_type={self.capacity_type!r}: must be {C.CAPACITY_SPOT!r}, "
                                    f"{C.CAPACITY_ON_DEMAND!r} or None")
        if self.capacity_labels not in CAPACITY_LABELS:
            raise WorkloadSpecError(f"capacity_labels={self.capacity_labels!r}: must be one of {', '.join(CAPACITY_LABELS)}")
        if self.capacity_type == C.CAPACITY_SPOT and not is_spot_eligible(True, self.checkpoint_uri is not None):
            raise WorkloadSpecError("capacity_type='spot' needs checkpoint_uri: work that cannot resume never "
                                    "runs on spot")

    def _validate_checkpoint(self) -> None:
        for what in ("checkpoint_uri", "resume_uri"):
            uri = getattr(self, what)
            if uri is not None and (not isinstance(uri, str) or not uri.startswith(CHECKPOINT_SCHEMES)
                                    or len(uri.split("://", 1)[1].strip("/")) == 0):
                raise WorkloadSpecError(f"{what}={uri!r}: must be s3://bucket/prefix or file:///absolute/dir")
        if self.checkpoint_per_rank and self.checkpoint_uri is None:
            raise WorkloadSpecError("checkpoint_per_rank=True needs checkpoint_uri")
        for what in ("checkpoint_keep_last", "checkpoint_keep_every"):
            if getattr(self, what) is not None:
                _positive_int(getattr(self, what), what)

    def _validate_env(self) -> None:
        _check_env(self.env_vars, "env_vars")
        envs = [s.env for s in self.secrets if s.env]
        clash = sorted({e for e in envs if envs.count(e) > 1 or e in self.env_vars or e in RESERVED_ENV})
        if clash:
            raise WorkloadSpecError(f"secrets: env {clash} set twice (or reserved); give each variable once")
        if self.s3_secret is not None:
            SecretEnv(secret=self.s3_secret)  # same name rules

    def _validate_metadata(self) -> None:
        for what, mapping in (("labels", self.labels), ("annotations", self.annotations),
                              ("node_selector", self.node_selector)):
            for key, value in mapping.items():
                if not _QUALIFIED_NAME.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
                    raise WorkloadSpecError(f"{what}[{key!r}]: not a valid Kubernetes key (prefix/name)")
                if what != "annotations" and (len(value) > 63 or not _LABEL_VALUE.match(value)):
                    raise WorkloadSpecError(f"{what}[{key!r}]={value!r}: not a valid label value (<= 63 of A-Z a-z 0-9 - _ .)")
                if what != "node_selector" and key.startswith(f"{C.DOMAIN}/") and key not in USER_SETTABLE_ANNOTATIONS:
                    raise WorkloadSpecError(f"{what}[{key!r}]: the {C.DOMAIN}/ prefix is reserved for airflow-gpu; "
                                            f"use another prefix")

    # --- derived ------------------------------------------------------------------------------

    @property
    def gang_name(self) -> str:
        return self.name or gang_name(self.task_instance, self.attempt)

    @property
    def priority_class_name(self) -> str:
        return self.priority_class or priority_class_name(self.tier)

    @property
    def checkpointable(self) -> bool:
        return self.checkpoint_uri is not None

    @property
    def topology_annotation(self) -> str | None:
        if self.topology is None:
            return None
        return f"{self.topology}:{'hard' if self.topology_required else 'soft'}"

    def checkpoint_uri_of(self, rank: int) -> str | None:
        """The store rank `rank` writes to (and whose status.json reports its progress)."""
        if self.checkpoint_uri is None:
            return None
        base = self.checkpoint_uri.rstrip("/")
        return f"{base}/rank-{rank}" if self.checkpoint_per_rank else base

    def gpu_limits(self) -> dict[str, str]:
        if self.mig_profile is not None:
            return {f"{C.RESOURCE_MIG_PREFIX}{self.mig_profile}": "1"}
        return {C.RESOURCE_GPU: str(self.gpus_per_worker)}

    @property
    def processes_per_worker(self) -> int:
        """LOCAL_WORLD_SIZE: one process per whole GPU, one per MIG slice."""
        return self.gpus_per_worker or 1

    def members(self) -> list[tuple[int, PodSetSpec | None, int]]:
        """(rank, its pod set or None, its index in the set) of each pod, in rank order: the pod sets'
        pods follow each other in the order given (the first set's first pod is rank 0, MASTER_ADDR)."""
        if not self.pod_sets:
            return [(rank, None, rank) for rank in range(self.workers)]
        out = []
        for ps in self.pod_sets:
            for i in range(ps.replicas):
                out.append((len(out), ps, i))
        return out


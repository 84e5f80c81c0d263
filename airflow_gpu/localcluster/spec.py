"""Cluster spec (YAML): node pools of simulated GPU nodes, and the Node objects they become.

A pool is `count` identical nodes. Nodes carry the labels the NVIDIA GPU operator (GPU feature
discovery) and the cloud providers set, so the scheduler and the operator read the same labels they
would read on EKS/GKE with Karpenter. MIG uses the "mixed" strategy: `mig.gpus` of the node's GPUs
are partitioned into the given devices and advertised as nvidia.com/mig-<profile>; the rest stay
whole nvidia.com/gpu.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from kubernetes.utils.quantity import parse_quantity
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from airflow_gpu import constants as C

MIG_PROFILE = re.compile(r"^(\d)g\.(\d+)gb$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
KUBELET_VERSION = "v1.32.0"


class SpecError(ValueError):
    """A cluster spec that cannot be used; the message names the field and the fix."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class MigDevice(_Model):
    profile: str = Field(description="MIG profile, e.g. 1g.10gb or 3g.40gb")
    count: int = Field(ge=1)

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        if not MIG_PROFILE.match(value):
            raise ValueError(f"MIG profile {value!r} must look like '1g.10gb' or '3g.40gb'")
        return value

    @property
    def compute_slices(self) -> int:
        return int(MIG_PROFILE.match(self.profile).group(1))

    @property
    def memory_gb(self) -> int:
        return int(MIG_PROFILE.match(self.profile).group(2))


class MigLayout(_Model):
    strategy: Literal["mixed"] = "mixed"
    gpus: int = Field(ge=1, description="how many of the node's GPUs are partitioned")
    devices: list[MigDevice] = Field(min_length=1, description="the partition of ONE GPU")


class GpuSpec(_Model):
    product: str = "NVIDIA-A100-SXM4-80GB"
    count: int = Field(ge=0, default=8)
    memory_mib: int = Field(alias="memoryMiB", ge=1, default=81920)
    mig: MigLayout | None = None

    @model_validator(mode="after")
    def _mig_fits(self) -> "GpuSpec":
        if self.mig is None:
            return self
        if self.mig.gpus > self.count:
            raise ValueError(f"mig.gpus={self.mig.gpus} is more than gpu.count={self.count}")
        slices = sum(d.compute_slices * d.count for d in self.mig.devices)
        memory = sum(d.memory_gb * d.count for d in self.mig.devices) * 1024
        if slices > 7:
            raise ValueError(f"mig.devices use {slices} compute slices; one GPU has 7 (e.g. 7 x 1g.10gb)")
        if memory > self.memory_mib:
            raise ValueError(f"mig.devices use {memory} MiB; one GPU has memoryMiB={self.memory_mib}")
        return self


class Taint(_Model):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodePool(_Model):
    name: str
    count: int = Field(ge=0)
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    cpu: str = "96"
    memory: str = "1152Gi"
    max_pods: int = Field(alias="maxPods", default=110, ge=1)
    capacity_type: Literal["spot", "on-demand"] = Field(alias="capacityType", default="on-demand")
    instance_type: str = Field(alias="instanceType", default="p4de.24xlarge")
    zone: str = "zone-a"
    racks: list[str] = Field(default_factory=list, description="nodes are split over these in order")
    cliques: list[str] = Field(default_factory=list, description="NVLink cliques, split like racks")
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    spot_taint: bool = Field(alias="spotTaint", default=True, description="spot nodes get TAINT_SPOT")

    @field_validator("racks", "cliques", mode="before")
    @classmethod
    def _one_or_many(cls, value):
        return [value] if isinstance(value, str) else value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not DNS_LABEL.match(value) or len(value) > 50:
            raise ValueError(f"pool name {value!r} must be a lowercase DNS label (a-z, 0-9, '-'), at most 50 chars")
        return value

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _quantity(cls, value) -> str:
        value = str(value)
        try:
            parse_quantity(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a Kubernetes quantity (examples: '96', '500m', '1152Gi')") from None
        return value


class ClusterSpec(_Model):
    name: str = "local"
    provider: Literal["karpenter", "eks", "gke"] = Field(
        default="karpenter", description="which cloud's capacity-type labels nodes carry"
    )
    pools: list[NodePool] = Field(min_length=1)
    crds: list[str] = Field(default_factory=list, description="extra CRD YAML files loaded at start")
    pod_gc_seconds: float = Field(alias="podGCSeconds", default=40.0, ge=0,
                                  description="how long pods of a vanished node stay before PodGC deletes them")
    event_ttl_seconds: float = Field(alias="eventTTLSeconds", default=3600.0, gt=0,
                                     description="Events older than this are deleted (kube-apiserver --event-ttl)")
    watch_history: int = Field(alias="watchHistory", default=20_000, ge=10,
                               description="events kept for watches that resume; older resourceVersions get 410 Gone")
    node_lease_seconds: float = Field(alias="nodeLeaseRenewSeconds", default=10.0, gt=0,
                                      description="how often each kubelet renews its Lease in kube-node-lease")
    node_status_seconds: float = Field(alias="nodeStatusReportSeconds", default=60.0, gt=0,
                                       description="how often each kubelet reports its node's condition heartbeats")
    sim_default_seconds: float | None = Field(
        alias="simDefaultSeconds", default=None,
        description="run time of a container without a command and without the sim-duration annotation; null: until deleted",
    )
    mode: Literal["processes", "scale"] = Field(
        default="processes",
        description="processes: each node's kubelet runs bound pods as local processes and renews its Lease; "
                    "scale: pods are simulated without processes and nodes without heartbeats, as KWOK does "
                    "(thousands of nodes; see localcluster/kubelet/simkubelet.py for what is simulated)",
    )
    pod_isolation: Literal["mountns", "none"] = Field(
        alias="podIsolation", default="mountns",
        description="mountns: each container sees an image-like copy-on-write root (the host's system directories "
                    "and Python runtime read-only, no host secrets) in a private mount namespace with its volumes "
                    "at their mountPaths (needs root); none: containers run on the host filesystem, without volumes",
    )

    @model_validator(mode="after")
    def _unique_pools(self) -> "ClusterSpec":
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(dupes)}")
        return self


def load_spec(path: str | Path) -> ClusterSpec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read cluster spec {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"cluster spec {path} is not valid YAML: {exc}") from None
    return parse_spec(raw, source=str(path))


def parse_spec(raw: object, source: str = "<spec>") -> ClusterSpec:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a cluster spec is a mapping with a 'pools' list")
    try:
        spec = ClusterSpec.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise SpecError(f"{source}: invalid cluster spec:\n" + "\n".join(lines)) from None
    base = Path(source).parent if source != "<spec>" else Path.cwd()
    spec.crds = [str((base / p).resolve()) if not Path(p).is_absolute() else p for p in spec.crds]
    return spec


def _spread(values: list[str], index: int, count: int) -> str | None:
    if not values:
        return None
    count = max(count, 1)
    return values[(index % count) * len(values) // count]  # replacements take the slots in turn


def capacity_labels(provider: str, capacity_type: str) -> dict[str, str]:
    spot = capacity_type == C.CAPACITY_SPOT
    labels = {C.NODE_CAPACITY_TYPE_KARPENTER: capacity_type}  # Karpenter runs on every provider here
    if provider == "eks":
        labels[C.NODE_CAPACITY_TYPE_EKS] = "SPOT" if spot else "ON_DEMAND"
    if provider == "gke" and spot:
        labels[C.NODE_GKE_SPOT] = "true"
    return labels


def gpu_resources(gpu: GpuSpec) -> dict[str, str]:
    """Extended resources the NVIDIA device plugin advertises (mixed MIG strategy)."""
    resources: dict[str, str] = {}
    whole = gpu.count - (gpu.mig.gpus if gpu.mig else 0)
    resources[C.RESOURCE_GPU] = str(whole)
    if gpu.mig:
        for dev in gpu.mig.devices:
            key = C.RESOURCE_MIG_PREFIX + dev.profile
            resources[key] = str(int(resources.get(key, "0")) + dev.count * gpu.mig.gpus)
    return resources


def node_manifest(spec: ClusterSpec, pool: NodePool, index: int, node_number: int) -> dict:
    """The Node object for node `index` of `pool` (node_number: cluster-wide, for its address)."""
    name = f"{pool.name}-{index}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": pool.instance_type,
        C.NODE_ZONE: pool.zone,
        "topology.kubernetes.io/region": re.sub(r"-?[a-z]$", "", pool.zone) or pool.zone,
        "karpenter.sh/nodepool": pool.name,
        **capacity_labels(spec.provider, pool.capacity_type),
    }
    if pool.gpu.count:
        labels.update({
            "nvidia.com/gpu.present": "true",
            C.NODE_GPU_PRODUCT: pool.gpu.product,
            C.NODE_GPU_COUNT: str(pool.gpu.count),
            C.NODE_GPU_MEMORY: str(pool.gpu.memory_mib),
            C.NODE_MIG_STRATEGY: "mixed" if pool.gpu.mig else "none",
        })
    rack = _spread(pool.racks, index, pool.count)
    clique = _spread(pool.cliques, index, pool.count)
    if rack:
        labels[C.NODE_RACK] = rack
    if clique:
        labels[C.NODE_GPU_CLIQUE] = clique
    labels.update(pool.labels)
    taints = [t.model_dump() for t in pool.taints]
    if pool.capacity_type == C.CAPACITY_SPOT and pool.spot_taint:
        taints.append({"key": C.TAINT_SPOT, "value": "true", "effect": "NoSchedule"})
    for t in taints:
        if not t.get("value"):
            t.pop("value", None)
    capacity = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": str(pool.max_pods),
        "ephemeral-storage": "1Ti",
        **(gpu_resources(pool.gpu) if pool.gpu.count else {}),
    }
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": pod_cidr(node_number), "providerID": f"local://{spec.name}/{name}"},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
    if taints:
        body["spec"]["taints"] = taints
    return body


def pod_cidr(node_number: int) -> str:
    # Pod IPs live in 127.0.0.0/8 so that pods (local processes) can reach each other by pod IP.
    return f"127.{100 + node_number // 250}.{node_number % 250}.0/24"


def initial_nodes(spec: ClusterSpec) -> list[dict]:
    nodes, number = [], 0
    for pool in spec.pools:
        for index in range(pool.count):
            nodes.append(node_manifest(spec, pool, index, number))
            number += 1
    return nodes

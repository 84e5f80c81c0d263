"""What the API server serves: built-in resource types plus the types CRDs add at run time.

Objects are stored per group/resource (not per version), as etcd does; a CRD's served versions all
read and write the same objects (conversion strategy None: only apiVersion changes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    versions: tuple[str, ...]  # served versions; first is the preferred one
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    model: str | None = None  # kubernetes.client model class name (built-ins): schema for validation
    schemas: dict = field(default_factory=dict, compare=False, hash=False)  # CRDs: version -> openAPIV3Schema
    printer_columns: dict = field(default_factory=dict, compare=False, hash=False)  # CRDs: version -> columns
    crd: bool = False
    verbs: tuple[str, ...] = ALL_VERBS  # ("create",): a review API, answered and never stored

    @property
    def key(self) -> str:
        return f"{self.group}/{self.plural}"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def api_version(self, version: str | None = None) -> str:
        version = version or self.versions[0]
        return f"{self.group}/{version}" if self.group else version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


BUILTINS: tuple[ResourceType, ...] = (
    ResourceType("", ("v1",), "namespaces", "Namespace", False, ("ns",), ("status",), model="V1Namespace"),
    ResourceType("", ("v1",), "nodes", "Node", False, ("no",), ("status",), model="V1Node"),
    ResourceType("", ("v1",), "pods", "Pod", True, ("po",), ("status", "binding", "eviction", "log", "exec", "attach", "portforward"),
                 ("all",), model="V1Pod"),
    ResourceType("", ("v1",), "services", "Service", True, ("svc",), ("status",), ("all",), model="V1Service"),
    ResourceType("", ("v1",), "events", "Event", True, ("ev",), model="CoreV1Event"),
    ResourceType("", ("v1",), "configmaps", "ConfigMap", True, ("cm",), model="V1ConfigMap"),
    ResourceType("", ("v1",), "secrets", "Secret", True, model="V1Secret"),
    ResourceType("", ("v1",), "serviceaccounts", "ServiceAccount", True, ("sa",), ("token",), model="V1ServiceAccount"),
    ResourceType("", ("v1",), "resourcequotas", "ResourceQuota", True, ("quota",), ("status",), model="V1ResourceQuota"),
    ResourceType("scheduling.k8s.io", ("v1",), "priorityclasses", "PriorityClass", False, ("pc",), model="V1PriorityClass"),
    ResourceType("coordination.k8s.io", ("v1",), "leases", "Lease", True, model="V1Lease"),
    ResourceType("apps", ("v1",), "deployments", "Deployment", True, ("deploy",), ("status", "scale"), ("all",),
                 model="V1Deployment"),
    ResourceType("apps", ("v1",), "replicasets", "ReplicaSet", True, ("rs",), ("status", "scale"), ("all",),
                 model="V1ReplicaSet"),
    ResourceType("batch", ("v1",), "jobs", "Job", True, (), ("status",), ("all",), model="V1Job"),
    ResourceType("policy", ("v1",), "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), ("status",),
                 model="V1PodDisruptionBudget"),
    ResourceType("apiextensions.k8s.io", ("v1",), "customresourcedefinitions", "CustomResourceDefinition", False,
                 ("crd", "crds"), ("status",), ("api-extensions",), model="V1CustomResourceDefinition"),
    # RBAC: enforced for service-account tokens (rbac.py); the admin is in system:masters
    ResourceType("rbac.authorization.k8s.io", ("v1",), "clusterroles", "ClusterRole", False, model="V1ClusterRole"),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "clusterrolebindings", "ClusterRoleBinding", False,
                 model="V1ClusterRoleBinding"),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "roles", "Role", True, model="V1Role"),
    ResourceType("rbac.authorization.k8s.io", ("v1",), "rolebindings", "RoleBinding", True, model="V1RoleBinding"),
    # review APIs (rbac.py): POST only, answered from who is asking, never stored
    ResourceType("authentication.k8s.io", ("v1",), "selfsubjectreviews", "SelfSubjectReview", False,
                 model="V1SelfSubjectReview", verbs=("create",)),
    ResourceType("authentication.k8s.io", ("v1",), "tokenreviews", "TokenReview", False,
                 model="V1TokenReview", verbs=("create",)),
    ResourceType("authorization.k8s.io", ("v1",), "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
                 model="V1SelfSubjectAccessReview", verbs=("create",)),
    ResourceType("authorization.k8s.io", ("v1",), "subjectaccessreviews", "SubjectAccessReview", False,
                 model="V1SubjectAccessReview", verbs=("create",)),
)
CRD_KEY = "apiextensions.k8s.io/customresourcedefinitions"


def from_crd(crd: dict) -> ResourceType:
    spec = crd["spec"]
    names = spec["names"]
    served = [v for v in spec["versions"] if v.get("served", True)]
    # preferred version: the storage version if served, else the first served one
    served.sort(key=lambda v: not v.get("storage", False))
    return ResourceType(
        group=spec["group"],
        versions=tuple(v["name"] for v in served),
        plural=names["plural"],
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        short_names=tuple(names.get("shortNames", ())),
        subresources=("status",) if any("status" in (v.get("subresources") or {}) for v in served) else (),
        categories=tuple(names.get("categories", ())),
        schemas={v["name"]: (v.get("schema") or {}).get("openAPIV3Schema") or {} for v in served},
        printer_columns={v["name"]: v.get("additionalPrinterColumns") or [] for v in served},
        crd=True,
    )


class Registry:
    def __init__(self) -> None:
        self._by_key: dict[str, ResourceType] = {}
        self._by_path: dict[tuple[str, str, str], ResourceType] = {}
        self.generation = 0  # bumped when CRDs change, so discovery/openapi caches know
        for rt in BUILTINS:
            self._add(rt)

    def _add(self, rt: ResourceType) -> None:
        self._by_key[rt.key] = rt
        for version in rt.versions:
            self._by_path[(rt.group, version, rt.plural)] = rt
        self.generation += 1

    def _remove(self, key: str) -> None:
        rt = self._by_key.pop(key, None)
        if rt is not None:
            for version in rt.versions:
                self._by_path.pop((rt.group, version, rt.plural), None)
            self.generation += 1

    def sync_crds(self, crds: list[dict]) -> None:
        """Make the served custom types equal to the given CRD objects (established ones)."""
        wanted = {}
        for crd in crds:
            if crd["metadata"].get("deletionTimestamp"):
                continue
            rt = from_crd(crd)
            wanted[rt.key] = rt
        for key in [k for k, rt in self._by_key.items() if rt.crd and k not in wanted]:
            self._remove(key)
        for key, rt in wanted.items():
            if self._by_key.get(key) != rt or self._by_key[key].schemas != rt.schemas:
                self._remove(key)
                self._add(rt)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_path.get((group, version, plural))

    def by_key(self, key: str) -> ResourceType | None:
        return self._by_key.get(key)

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for rt in self._by_key.values():
            if rt.group == group and rt.kind == kind and version in rt.versions:
                return rt
        return None

    def all(self) -> list[ResourceType]:
        return list(self._by_key.values())

    def group_versions(self) -> dict[str, list[str]]:
        """group -> served versions (preferred first), core group excluded."""
        out: dict[str, list[str]] = {}
        for rt in self._by_key.values():
            if rt.group:
                versions = out.setdefault(rt.group, [])
                for v in rt.versions:
                    if v not in versions:
                        versions.append(v)
        return out

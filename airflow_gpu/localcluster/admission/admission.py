"""Admission on create/update, in the order of a real API server: defaults, validation (422 with
causes, volumes included), namespace lifecycle, Priority (priorityClassName -> spec.priority),
ServiceAccount (the account must exist; the kube-api-access token volume is added), PodSecurity
(the namespace's enforced level), ResourceQuota."""

from __future__ import annotations

import re

from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.admission import podsecurity, quota, serviceaccounts
from airflow_gpu.localcluster.kubelet import security
from airflow_gpu.localcluster.registry import workloadspec
from airflow_gpu.localcluster.podutil import quantity
from airflow_gpu.localcluster.registry.resources import ResourceType
from airflow_gpu.localcluster.registry.schema import crd_causes
from airflow_gpu.localcluster.admission.serviceaccounts import INJECTED_PROJECTED
from airflow_gpu.localcluster.registry.shared import intern_strings
from airflow_gpu.localcluster.kubelet.volumes import volume_causes

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                 "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
DNS_LABEL_KINDS = {"Namespace", "Service"}
NATIVE = ("cpu", "memory", "ephemeral-storage")
PRIORITY_KEY = "scheduling.k8s.io/priorityclasses"
NAMESPACE_KEY = "/namespaces"
SYSTEM_PRIORITY_CLASSES = (("system-node-critical", 2000001000), ("system-cluster-critical", 2000000000))
DEFAULT_TOLERATION_SECONDS = 300
DEFAULT_SCHEDULER = "default-scheduler"


# --- defaults ----------------------------------------------------------------------------------
def apply_defaults(rt: ResourceType, obj: dict) -> None:
    kind = rt.kind if not rt.crd else None
    if kind == "Pod":
        _pod_defaults(obj)
    elif kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif kind == "Secret":
        obj.setdefault("type", "Opaque")
    elif kind == "Service":
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    elif kind == "PriorityClass":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
    elif kind == "ResourceQuota":
        obj.setdefault("status", {})["hard"] = dict((obj.get("spec") or {}).get("hard") or {})
    elif kind in workloadspec.WORKLOAD_KINDS:
        workloadspec.apply_defaults(kind, obj)


def _pod_defaults(pod: dict) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", DEFAULT_SCHEDULER)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if not isinstance(c, dict):
            continue
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        image = str(c.get("image") or "")
        c.setdefault("imagePullPolicy", "Always" if image.endswith(":latest") or ":" not in image else "IfNotPresent")
        res = c.setdefault("resources", {})
        if res.get("limits"):  # requests default to limits
            res["requests"] = {**res["limits"], **(res.get("requests") or {})}
    # DefaultTolerationSeconds admission plugin
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key and t.get("effect") in (None, "", "NoExecute") for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS})
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", _qos(pod))


def _qos(pod: dict) -> str:
    containers = pod["spec"].get("containers") or []
    reqs = [((c.get("resources") or {}).get("requests") or {}) for c in containers if isinstance(c, dict)]
    lims = [((c.get("resources") or {}).get("limits") or {}) for c in containers if isinstance(c, dict)]
    if not any(r.get(n) for r in reqs + lims for n in ("cpu", "memory")):
        return "BestEffort"
    try:
        if all(l.get(n) and quantity(l[n]) == quantity(r.get(n, l[n])) for r, l in zip(reqs, lims) for n in ("cpu", "memory")):
            return "Guaranteed"
    except ValueError:
        pass
    return "Burstable"


# --- validation -------------------------------------------------------------------------------
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
NON_NEGATIVE_QUANTITIES = {"ResourceQuota": ("spec.hard",), "Node": ("status.capacity", "status.allocatable")}


def label_key_problem(key) -> str | None:
    """Why `key` is not a label key (an optional DNS-subdomain prefix and "/", then a name of at most
    63 characters), as the real API server says it; None if it is one."""
    if not isinstance(key, str) or not key:
        return "name part must be non-empty"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"prefix part {SUBDOMAIN_MSG}"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not LABEL_NAME.fullmatch(name):
        return ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                "with an alphanumeric character")
    return None


def _negative(qty) -> bool:
    try:
        return quantity(qty) < 0
    except (ValueError, TypeError, ArithmeticError):
        return False  # not a quantity at all: the schema check reports it


def validate(rt: ResourceType, obj: dict, creating: bool, old: dict | None = None) -> None:
    causes: list[tuple[str, str, str]] = []
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    if not name:
        causes.append(("metadata.name", "FieldValueRequired", "Required value: name or generateName is required"))
    else:
        pattern, msg = (DNS_LABEL, LABEL_MSG) if rt.kind in DNS_LABEL_KINDS else (DNS_SUBDOMAIN, SUBDOMAIN_MSG)
        limit = 63 if rt.kind in DNS_LABEL_KINDS else 253
        if rt.group == "rbac.authorization.k8s.io" and not rt.crd:  # path segment names: "system:discovery"
            if name in (".", "..") or "/" in name or "%" in name:
                causes.append(("metadata.name", "FieldValueInvalid",
                               f'Invalid value: "{name}": may not be \'.\' or \'..\' and may not contain \'/\' or \'%\''))
        # fullmatch: a pattern's "$" also matches before a trailing newline
        elif rt.kind != "Event" and (not pattern.fullmatch(name) or len(name) > limit):
            causes.append(("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {msg}'))
    for key, value in (meta.get("labels") or {}).items():
        key_problem = label_key_problem(key)
        if key_problem:
            causes.append(("metadata.labels", "FieldValueInvalid", f'Invalid value: "{str(key)[:300]}": {key_problem}'))
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.fullmatch(value):
            causes.append(("metadata.labels", "FieldValueInvalid",
                           f'Invalid value: "{value}": a valid label must be an empty string or consist of '
                           "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                           "alphanumeric character, at most 63 characters"))
    if not rt.crd and rt.kind == "Pod":
        causes += _pod_causes(obj)
    if rt.crd:
        version = (obj.get("apiVersion") or "").rpartition("/")[2]
        schema = rt.schemas.get(version) or rt.schemas.get(rt.versions[0]) or {}
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        props = {k: v for k, v in (schema.get("properties") or {}).items() if k not in ("apiVersion", "kind", "metadata")}
        causes += crd_causes(body, {**schema, "properties": props,
                                    "required": [r for r in schema.get("required") or [] if r != "metadata"]}, "")
    if not rt.crd and rt.kind in workloadspec.WORKLOAD_KINDS:
        causes += workloadspec.causes(rt.kind, obj, None if creating else old)
    if not rt.crd and rt.kind == "PriorityClass" and not isinstance(obj.get("value"), int):
        causes.append(("value", "FieldValueRequired", "Required value"))
    if not rt.crd and rt.kind in NON_NEGATIVE_QUANTITIES:
        for path in NON_NEGATIVE_QUANTITIES[rt.kind]:
            section = obj
            for part in path.split("."):
                section = section.get(part) if isinstance(section, dict) else None
            for res, qty in (section or {}).items() if isinstance(section, dict) else ():
                if _negative(qty):
                    causes.append((f"{path}[{res}]", "FieldValueInvalid",
                                   f'Invalid value: "{qty}": must be greater than or equal to 0'))
    if causes:
        raise errors.invalid(rt.kind, name, causes, rt.group)


def _pod_causes(pod: dict) -> list[tuple[str, str, str]]:
    spec = pod.get("spec") or {}
    causes = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(("spec.containers", "FieldValueRequired", "Required value"))
    seen = set()
    for field, items in (("spec.initContainers", spec.get("initContainers") or []), ("spec.containers", containers)):
        for i, c in enumerate(items):
            where = f"{field}[{i}]"
            cname = c.get("name")
            if not cname:
                causes.append((f"{where}.name", "FieldValueRequired", "Required value"))
            elif not DNS_LABEL.fullmatch(cname):
                causes.append((f"{where}.name", "FieldValueInvalid", f'Invalid value: "{cname}": {LABEL_MSG}'))
            elif cname in seen:
                causes.append((f"{where}.name", "FieldValueDuplicate", f'Duplicate value: "{cname}"'))
            seen.add(cname)
            if not c.get("image"):
                causes.append((f"{where}.image", "FieldValueRequired", "Required value"))
            causes += _resource_causes(c.get("resources") or {}, f"{where}.resources")
    policy = spec.get("restartPolicy")
    if policy not in ("Always", "OnFailure", "Never"):
        causes.append(("spec.restartPolicy", "FieldValueNotSupported",
                       f'Unsupported value: "{policy}": supported values: "Always", "OnFailure", "Never"'))
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and deadline <= 0:
        causes.append(("spec.activeDeadlineSeconds", "FieldValueInvalid",
                       f"Invalid value: {deadline}: must be between 1 and 2147483647, inclusive"))
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and grace < 0:
        causes.append(("spec.terminationGracePeriodSeconds", "FieldValueInvalid",
                       f"Invalid value: {grace}: must be greater than or equal to 0"))
    causes += volume_causes(spec)
    causes += security.causes(spec)
    return causes


def _resource_causes(res: dict, where: str) -> list[tuple[str, str, str]]:
    causes = []
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    for name, value in {**limits, **requests}.items():
        q = quantity(value)
        if q < 0:
            causes.append((f"{where}.requests[{name}]", "FieldValueInvalid",
                           f'Invalid value: "{value}": must be greater than or equal to 0'))
        if name not in NATIVE and not name.startswith("hugepages-"):
            if q != q.to_integral_value():
                causes.append((f"{where}.requests[{name}]", "FieldValueInvalid",
                               f'Invalid value: "{value}": must be an integer'))
    for name, value in requests.items():
        if name in NATIVE or name.startswith("hugepages-"):
            if name in limits and quantity(value) > quantity(limits[name]):
                causes.append((f"{where}.requests", "FieldValueInvalid",
                               f'Invalid value: "{value}": must be less than or equal to {name} limit of {limits[name]}'))
        elif name not in limits:
            causes.append((f"{where}.limits", "FieldValueRequired",
                           "Required value: Limit must be set for non overcommitable resources"))
        elif quantity(value) != quantity(limits[name]):
            causes.append((f"{where}.requests", "FieldValueInvalid",
                           f'Invalid value: "{value}": must be equal to {name} limit of {limits[name]}'))
    return causes


POD_MUTABLE_SPEC = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def validate_pod_update(old: dict, new: dict) -> None:
    """Pods are mostly immutable: images, activeDeadlineSeconds and tolerations may change."""
    def strip(spec: dict) -> dict:
        spec = {k: v for k, v in spec.items() if k not in POD_MUTABLE_SPEC}
        for field in ("containers", "initContainers"):
            spec[field] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get(field) or []]
        return spec
    if strip(old.get("spec") or {}) != strip(new.get("spec") or {}):
        raise errors.invalid("Pod", new["metadata"]["name"], [(
            "spec", "FieldValueForbidden",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
            "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
            "to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
            "previously negative)")])


# --- admission plugins ------------------------------------------------------------------------
def share_pod_values(pod: dict, old: dict | None) -> None:
    """The store's hook for pods: a spec, labels or annotations that are new (not carried over from
    the stored version) get their strings interned, and an injected kube-api-access volume that arrived as a copy
    (an update, a patch, the log replayed at start) points at the one shared INJECTED_PROJECTED again."""
    spec, meta = pod.get("spec"), pod.get("metadata")
    if isinstance(spec, dict) and (old is None or spec is not old.get("spec")):
        for vol in spec.get("volumes") or ():
            projected = vol.get("projected")
            if projected is not None and projected is not INJECTED_PROJECTED and projected == INJECTED_PROJECTED:
                vol["projected"] = INJECTED_PROJECTED
        intern_strings(spec)
    if isinstance(meta, dict):
        old_meta = (old or {}).get("metadata") or {}
        for field in ("labels", "annotations"):
            values = meta.get(field)
            if isinstance(values, dict) and values is not old_meta.get(field):
                intern_strings(values)


def admit_create(store, rt: ResourceType, obj: dict) -> None:
    meta = obj["metadata"]
    name = meta.get("name", "")
    ns_obj = None
    if rt.namespaced:
        ns_obj = store.get(NAMESPACE_KEY, "", meta["namespace"])
        if ns_obj is None:
            raise errors.not_found("namespaces", meta["namespace"])
        if ns_obj["metadata"].get("deletionTimestamp") and rt.kind != "Event":
            raise errors.forbidden(rt.plural, name, f"unable to create new content in namespace "
                                   f"{meta['namespace']} because it is being terminated", rt.group)
    if rt.key == "/pods":
        _admit_priority(store, obj)
        serviceaccounts.admit_pod(store, obj)
        podsecurity.admit_pod(ns_obj, obj)
    quota.admit(store, rt, obj)


def _admit_priority(store, pod: dict) -> None:
    spec = pod["spec"]
    name = pod["metadata"].get("name", "")
    class_name = spec.get("priorityClassName")
    if class_name:
        pc = store.get(PRIORITY_KEY, "", class_name)
        if pc is None:
            raise errors.forbidden("pods", name, f"no PriorityClass with name {class_name} was found")
    else:
        defaults = [p for p in store.values(PRIORITY_KEY) if p.get("globalDefault")]
        pc = max(defaults, key=lambda p: p["value"]) if defaults else None
        if pc is not None:
            spec["priorityClassName"] = pc["metadata"]["name"]
    value = pc["value"] if pc else 0
    if spec.get("priority") is not None and spec["priority"] != value:
        raise errors.forbidden("pods", name, f"the integer value of priority ({spec['priority']}) must not be provided "
                               f"in pod spec; priority admission controller computed {value} from the given "
                               "PriorityClass name")
    spec["priority"] = value
    if pc is not None:
        spec["preemptionPolicy"] = pc.get("preemptionPolicy", "PreemptLowerPriority")


"""/version, discovery documents, OpenAPI v3 index, and server-side Table printing for kubectl get."""

from __future__ import annotations

import datetime as dt
import hashlib

from airflow_gpu.localcluster.registry import openapidocs
from airflow_gpu.localcluster.handlers import openapiv2, workloadtables
from airflow_gpu.localcluster.podutil import parse_time
from airflow_gpu.localcluster.registry.resources import Registry, ResourceType
from airflow_gpu.localcluster.registry.schema import openapi_document
from airflow_gpu.localcluster.registry.store import decode, encode

VERSION_INFO = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.0-airflow-gpu-local", "gitCommit": "0" * 40,
    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23.0",
    "compiler": "gc", "platform": "linux/amd64",
}
SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "log": ["get"], "binding": ["create"], "eviction": ["create"],
                     "scale": ["get", "patch", "update"], "exec": ["create", "get"], "attach": ["create", "get"],
                     "portforward": ["create", "get"], "token": ["create"]}


def api_versions(address: str) -> dict:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}


def _group_entry(group: str, versions: list[str]) -> dict:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(registry: Registry) -> dict:
    groups = [_group_entry(g, vs) for g, vs in sorted(registry.group_versions().items())]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict | None:
    versions = registry.group_versions().get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def api_resource_list(registry: Registry, group: str, version: str) -> dict | None:
    types = [rt for rt in registry.all() if rt.group == group and version in rt.versions]
    if not types:
        return None
    resources = []
    for rt in sorted(types, key=lambda r: r.plural):
        entry = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced, "kind": rt.kind,
                 "verbs": list(rt.verbs)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            kind = {"binding": "Binding", "eviction": "Eviction", "scale": "Scale", "exec": "PodExecOptions",
                    "attach": "PodAttachOptions", "portforward": "PodPortForwardOptions",
                    "token": "TokenRequest"}.get(sub, rt.kind)
            sub_entry = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                         "kind": kind, "verbs": SUBRESOURCE_VERBS[sub]}
            if sub == "eviction":
                sub_entry.update(group="policy", version="v1")
            if sub == "scale":
                sub_entry.update(group="autoscaling", version="v1")
            if sub == "token":
                sub_entry.update(group="authentication.k8s.io", version="v1")
            resources.append(sub_entry)
    if not group:
        resources.append({"name": "bindings", "singularName": "binding", "namespaced": True, "kind": "Binding",
                          "verbs": ["create"]})
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


class OpenAPI:
    """OpenAPI v3 documents per group-version, rebuilt when the set of CRDs changes."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self._generation = -1
        self._docs: dict[str, bytes] = {}

    def _refresh(self) -> None:
        if self._generation == self.registry.generation:
            return
        docs = {}
        gvs: dict[tuple[str, str], list[ResourceType]] = {}
        for rt in self.registry.all():
            for v in rt.versions:
                gvs.setdefault((rt.group, v), []).append(rt)
        for (group, version), types in gvs.items():
            path = f"apis/{group}/{version}" if group else f"api/{version}"
            doc = openapi_document(group, version, types)
            openapidocs.annotate(doc["components"]["schemas"])
            docs[path] = encode(doc)
        self._docs = docs
        self._v2: dict[str, bytes] = {}
        self._generation = self.registry.generation

    def v2(self, protobuf: bool) -> bytes:
        """The Swagger 2.0 document of every served kind, rebuilt with the v3 documents."""
        self._refresh()
        key = "protobuf" if protobuf else "json"
        if key not in self._v2:
            definitions: dict[str, dict] = {}
            for doc in self._docs.values():
                definitions.update(decode(doc)["components"]["schemas"])
            document = openapiv2.swagger(definitions, VERSION_INFO["gitVersion"])
            self._v2[key] = openapiv2.to_protobuf(document) if protobuf else encode(document)
        return self._v2[key]

    def index(self) -> dict:
        self._refresh()
        return {"paths": {path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={hashlib.sha256(doc).hexdigest()[:32].upper()}"}
                          for path, doc in sorted(self._docs.items())}}

    def document(self, path: str) -> bytes | None:
        self._refresh()
        return self._docs.get(path)


# --- Table ------------------------------------------------------------------------------------
def human_age(timestamp: str | None, now: dt.datetime | None = None) -> str:
    t = parse_time(timestamp)
    if t is None:
        return "<unknown>"
    s = int(((now or dt.datetime.now(dt.timezone.utc)) - t).total_seconds())
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d"


def _col(name: str, typ: str = "string", fmt: str = "", priority: int = 0, description: str = "") -> dict:
    return {"name": name, "type": typ, "format": fmt, "description": description or name, "priority": priority}


def pod_status_text(pod: dict) -> str:
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    init = status.get("initContainerStatuses") or []
    for i, cs in enumerate(init):
        state = cs.get("state") or {}
        term = state.get("terminated")
        if term and term.get("exitCode") == 0:
            continue
        if term:
            reason = f"Init:{term.get('reason') or 'ExitCode:' + str(term.get('exitCode'))}"
        elif (state.get("waiting") or {}).get("reason") not in (None, "", "PodInitializing"):
            reason = f"Init:{state['waiting']['reason']}"
        else:
            reason = f"Init:{i}/{len((pod.get('spec') or {}).get('initContainers') or [])}"
        break
    else:
        for cs in reversed(status.get("containerStatuses") or []):
            state = cs.get("state") or {}
            if (state.get("waiting") or {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif state.get("terminated"):
                term = state["terminated"]
                reason = term.get("reason") or (f"Signal:{term['signal']}" if term.get("signal") else f"ExitCode:{term.get('exitCode')}")
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason


def _pod_row(pod: dict) -> list:
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(cs.get("restartCount", 0) for cs in statuses)
    return [pod["metadata"]["name"], f"{ready}/{total}", pod_status_text(pod), restarts,
            human_age(pod["metadata"].get("creationTimestamp")), status.get("podIP") or "<none>",
            (pod.get("spec") or {}).get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>", "<none>"]


def _node_row(node: dict) -> list:
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    text = "Unknown" if ready is None else "Ready" if ready.get("status") == "True" else "NotReady"  # as kubectl prints
    if (node.get("spec") or {}).get("unschedulable"):
        text += ",SchedulingDisabled"
    info = (node.get("status") or {}).get("nodeInfo") or {}
    ip = next((a["address"] for a in (node.get("status") or {}).get("addresses") or [] if a.get("type") == "InternalIP"), "<none>")
    return [node["metadata"]["name"], text, "<none>", human_age(node["metadata"].get("creationTimestamp")),
            info.get("kubeletVersion", ""), ip, "<none>", info.get("osImage", ""), info.get("kernelVersion", ""),
            info.get("containerRuntimeVersion", "")]


def _event_row(ev: dict) -> list:
    obj = ev.get("involvedObject") or {}
    last = ev.get("lastTimestamp") or ev.get("eventTime") or ev["metadata"].get("creationTimestamp")
    return [human_age(last), ev.get("type", ""), ev.get("reason", ""),
            f"{(obj.get('kind') or '').lower()}/{obj.get('name', '')}", ev.get("message", "")]


def _json_path(obj: dict, path: str):
    cur = obj
    for part in path.strip(".").split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def table_columns(rt: ResourceType, version: str) -> list[dict]:
    if not rt.crd and rt.kind == "Pod":
        return [_col("Name", fmt="name"), _col("Ready"), _col("Status"), _col("Restarts", "integer"), _col("Age"),
                _col("IP", priority=1), _col("Node", priority=1), _col("Nominated Node", priority=1),
                _col("Readiness Gates", priority=1)]
    if not rt.crd and rt.kind == "Node":
        return [_col("Name", fmt="name"), _col("Status"), _col("Roles"), _col("Age"), _col("Version"),
                _col("Internal-IP", priority=1), _col("External-IP", priority=1), _col("OS-Image", priority=1),
                _col("Kernel-Version", priority=1), _col("Container-Runtime", priority=1)]
    if not rt.crd and rt.kind == "Event":
        return [_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")]
    if not rt.crd and rt.kind == "Namespace":
        return [_col("Name", fmt="name"), _col("Status"), _col("Age")]
    if not rt.crd and rt.kind == "Service":
        return [_col("Name", fmt="name"), _col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"),
                _col("Age"), _col("Selector", priority=1)]
    if not rt.crd and workloadtables.columns(rt.kind, _col) is not None:
        return workloadtables.columns(rt.kind, _col)
    extra = [_col(c["name"], c.get("type", "string"), priority=c.get("priority", 0))
             for c in rt.printer_columns.get(version, []) if c.get("name", "").lower() != "age"]
    return [_col("Name", fmt="name")] + extra + [_col("Age")]


def table_row(rt: ResourceType, version: str, obj: dict) -> list:
    if not rt.crd and rt.kind == "Pod":
        return _pod_row(obj)
    if not rt.crd and rt.kind == "Node":
        return _node_row(obj)
    if not rt.crd and rt.kind == "Event":
        return _event_row(obj)
    if not rt.crd and rt.kind == "Namespace":
        return [obj["metadata"]["name"], (obj.get("status") or {}).get("phase", ""),
                human_age(obj["metadata"].get("creationTimestamp"))]
    if not rt.crd and rt.kind == "Service":
        spec = obj.get("spec") or {}
        ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or []) or "<none>"
        selector = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items()) or "<none>"
        return [obj["metadata"]["name"], spec.get("type", "ClusterIP"), spec.get("clusterIP") or "<none>", "<none>",
                ports, human_age(obj["metadata"].get("creationTimestamp")), selector]
    if not rt.crd and workloadtables.columns(rt.kind, _col) is not None:
        return workloadtables.row(rt.kind, obj, human_age)
    extra = []
    for c in rt.printer_columns.get(version, []):
        if c.get("name", "").lower() == "age":
            continue
        value = _json_path(obj, c.get("jsonPath", ""))
        extra.append(value if value is not None else "")
    return [obj["metadata"]["name"]] + extra + [human_age(obj["metadata"].get("creationTimestamp"))]


def to_table(rt: ResourceType, version: str, objects: list[dict], rv: str, include: str = "Metadata",
             cont: str | None = None, with_columns: bool = True) -> dict:
    rows = []
    for obj in objects:
        row = {"cells": table_row(rt, version, obj)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        rows.append(row)
    table = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv}, "rows": rows}
    if cont:
        table["metadata"]["continue"] = cont
    table["columnDefinitions"] = table_columns(rt, version) if with_columns else []
    return table

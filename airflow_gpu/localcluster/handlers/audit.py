"""Audit log (kube-apiserver --audit-log-path, level Metadata): one audit.k8s.io/v1 Event per request
as a JSON line, so a test can see exactly which (apiGroup, resource, verb) a component used."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

from airflow_gpu.localcluster.registry.store import encode

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def request_attributes(method: str, path: str, query: dict) -> tuple[str, dict | None]:
    """(verb, objectRef) as the API server's request-info resolver derives them; objectRef None for
    non-resource URLs (/version, /openapi/v3, ...)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return method.lower(), None
    ref: dict = {"apiGroup": group, "apiVersion": version}
    if rest[:1] == ["namespaces"] and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        ref["namespace"], rest = rest[1], rest[2:]
    if not rest:
        return method.lower(), None
    ref["resource"] = rest[0]
    if len(rest) > 1:
        ref["name"] = rest[1]
    if len(rest) > 2:
        ref["subresource"] = rest[2]
    if method == "GET":
        watching = query.get("watch") in ("true", "1", "True")
        verb = "watch" if watching else "get" if "name" in ref else "list"
    elif method == "DELETE" and "name" not in ref:
        verb = "deletecollection"
    else:
        verb = _VERBS.get(method, method.lower())
    return verb, ref


ADMIN = {"username": "local-admin", "groups": ["system:masters"]}
# a request without the bearer token was nobody's, as the real server records it
UNAUTHENTICATED = {"username": "system:anonymous", "groups": ["system:unauthenticated"]}


class AuditLog:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "ab", buffering=0)

    def record(self, method: str, path: str, query_string: str, query: dict, user_agent: str, code: int,
               received: str) -> None:
        verb, ref = request_attributes(method, path, query)
        event = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata", "auditID": str(uuid.uuid4()),
                 "stage": "ResponseComplete", "requestURI": path + (f"?{query_string}" if query_string else ""),
                 "verb": verb, "user": UNAUTHENTICATED if code == 401 else ADMIN,
                 "sourceIPs": ["127.0.0.1"], "userAgent": user_agent, "responseStatus": {"code": code},
                 "requestReceivedTimestamp": received, "stageTimestamp": now()}
        if ref is not None:
            event["objectRef"] = ref
        self.file.write(encode(event) + b"\n")

    def close(self) -> None:
        self.file.close()

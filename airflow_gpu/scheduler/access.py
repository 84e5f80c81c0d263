"""What the scheduler does with the API, as RBAC sees it: (apiGroup, resource, verb).

deploy/rbac.yaml must grant exactly this (tests/test_scheduler_deploy.py), and a test records every
request a running scheduler makes and checks it against this set (`access_of`).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

REQUIRED: frozenset[tuple[str, str, str]] = frozenset(
    {
        # informer cache
        ("", "pods", "list"), ("", "pods", "watch"),
        ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "resourcequotas", "list"), ("", "resourcequotas", "watch"),
        ("scheduling.k8s.io", "priorityclasses", "list"), ("scheduling.k8s.io", "priorityclasses", "watch"),
        ("scheduling.x-k8s.io", "podgroups", "list"), ("scheduling.x-k8s.io", "podgroups", "watch"),
        # binding (a 409 is checked by reading the pod), preemption, wait reasons on lone pods
        ("", "pods", "get"), ("", "pods", "patch"),
        # (the Eviction API also deletes kept pods past their keep-until time: an ended pod goes at once)
        ("", "pods/binding", "create"), ("", "pods/eviction", "create"), ("", "pods/status", "patch"),
        # gangs
        ("scheduling.x-k8s.io", "podgroups", "patch"), ("scheduling.x-k8s.io", "podgroups/status", "patch"),
        ("", "events", "create"),
        # plan records: ConfigMaps in the scheduler's own namespace (namespaced Role)
        ("", "configmaps", "list"), ("", "configmaps", "watch"), ("", "configmaps", "create"),
        ("", "configmaps", "patch"), ("", "configmaps", "delete"),
        # leader election (namespaced Role, one Lease)
        ("coordination.k8s.io", "leases", "get"), ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }
)

_PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))(?P<rest>/.*)?$")
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def access_of(method: str, url: str) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) of one request, as the API server's RBAC check sees it."""
    parts = urlsplit(url)
    m = _PATH.match(parts.path)
    if not m:
        return ("", parts.path, method.lower())
    group = "" if m.group("core") else m.group("group")
    segs = [s for s in (m.group("rest") or "").split("/") if s]
    if len(segs) >= 2 and segs[0] == "namespaces" and len(segs) != 2:
        segs = segs[2:]  # namespaced resource
    resource = segs[0] if segs else ""
    name = segs[1] if len(segs) > 1 else None
    if len(segs) > 2:
        resource = f"{resource}/{segs[2]}"
    if method.upper() == "GET":
        query = parse_qs(parts.query)
        if query.get("watch", ["false"])[0].lower() in ("true", "1"):
            verb = "watch"
        else:
            verb = "get" if name else "list"
    else:
        verb = _VERBS.get(method.upper(), method.lower())
    return (group, resource, verb)

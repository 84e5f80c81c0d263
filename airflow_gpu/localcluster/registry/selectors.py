"""Label selectors (equality and set-based), field selectors and node-selector expressions."""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_gpu.localcluster.errors import bad_request

# Fields each kind can be filtered on, as the real API server allows (others -> 400).
FIELD_LABELS: dict[str, set[str]] = {
    "Pod": {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
            "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"},
    "Event": {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
              "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
              "reason", "reportingComponent", "source", "type"},
    "Node": {"spec.unschedulable"},
    "Namespace": {"status.phase"},
    "Secret": {"type"},
}

_TOKEN = re.compile(r"\s*(!=|==|=|\(|\)|,|!|[^\s!=(),]+)")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in, notin, exists, !exists (=, == map to in; != to notin)
    values: tuple[str, ...] = ()

    def matches(self, labels: dict) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        if self.op == "notin":
            return not present or labels[self.key] not in self.values
        raise AssertionError(self.op)


def parse_label_selector(text: str | None) -> tuple[Requirement, ...]:
    if not text:
        return ()
    tokens = [t for t in _TOKEN.findall(text) if t.strip()]
    reqs: list[Requirement] = []
    i = 0

    def fail(msg: str):
        raise bad_request(f"unable to parse requirement: {msg} in labelSelector {text!r}")

    while i < len(tokens):
        tok = tokens[i]
        if tok == "!":
            if i + 1 >= len(tokens):
                fail("'!' needs a key")
            reqs.append(Requirement(tokens[i + 1], "!exists"))
            i += 2
        else:
            key = tok
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ","
            if nxt == ",":
                reqs.append(Requirement(key, "exists"))
                i += 1
            elif nxt in ("=", "==", "!="):
                if i + 2 >= len(tokens) or tokens[i + 2] == ",":
                    value, step = "", 2
                else:
                    value, step = tokens[i + 2], 3
                reqs.append(Requirement(key, "notin" if nxt == "!=" else "in", (value,)))
                i += step
            elif nxt.lower() in ("in", "notin"):
                if i + 2 >= len(tokens) or tokens[i + 2] != "(":
                    fail(f"expected '(' after {nxt}")
                j, values = i + 3, []
                while j < len(tokens) and tokens[j] != ")":
                    if tokens[j] != ",":
                        values.append(tokens[j])
                    j += 1
                if j >= len(tokens):
                    fail("missing ')'")
                reqs.append(Requirement(key, nxt.lower(), tuple(values)))
                i = j + 1
            else:
                fail(f"unexpected {nxt!r} after key {key!r}")
        if i < len(tokens):
            if tokens[i] != ",":
                fail(f"expected ',' before {tokens[i]!r}")
            i += 1
    return tuple(reqs)


def labels_match(reqs: tuple[Requirement, ...], labels: dict | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


def parse_field_selector(text: str | None, kind: str, extra: set[str] = frozenset()) -> tuple[tuple[str, bool, str], ...]:
    """-> ((path, negated, value), ...); unknown fields -> 400 like the real server."""
    if not text:
        return ()
    allowed = {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(kind, set()) | set(extra)
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([^!=]+)(!=|==|=)(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        path, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if path not in allowed:
            raise bad_request(f'field label not supported: {path}')
        out.append((path, op == "!=", value))
    return tuple(out)


def field_value(obj: dict, path: str) -> str:
    cur: object = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if path == "source" and isinstance(cur, dict):
        return cur.get("component", "")
    return str(cur)


def fields_match(reqs, obj: dict) -> bool:
    for path, negated, value in reqs:
        if (field_value(obj, path) == value) == negated:
            return False
    return True


def match_expression(labels: dict, expr: dict) -> bool:
    """One NodeSelectorRequirement / LabelSelectorRequirement (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            a, b = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def label_selector_object_matches(selector: dict | None, labels: dict | None) -> bool:
    """metav1.LabelSelector {matchLabels, matchExpressions}; an empty selector matches everything."""
    labels = labels or {}
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    return all(match_expression(labels, e) for e in selector.get("matchExpressions") or [])

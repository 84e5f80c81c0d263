"""Kubernetes protobuf request bodies for the few kinds kubectl's imperative generators send that way
(`kubectl create namespace|configmap|secret|quota|priorityclass|serviceaccount|token`, `kubectl auth whoami|can-i`). Everything else
kubectl and the Python clients send is JSON; other protobuf bodies get 415 as before.

Wire format: "k8s\\0" + runtime.Unknown{typeMeta{apiVersion, kind}, raw}; raw is the object's
message. Field numbers are those of k8s.io/api's generated.proto (stable across releases).
"""

from __future__ import annotations

import base64

from airflow_gpu.localcluster import errors

MAGIC = b"k8s\x00"

# message schemas: field number -> (json name, type); types: str, int, bool, bytes, msg:<name>,
# map:str, map:bytes, map:quantity, list:str, list:msg:<name>
SCHEMAS: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {1: ("typeMeta", "msg:TypeMeta"), 2: ("raw", "bytes"), 3: ("contentEncoding", "str"),
                4: ("contentType", "str")},
    "TypeMeta": {1: ("apiVersion", "str"), 2: ("kind", "str")},
    "ObjectMeta": {1: ("name", "str"), 2: ("generateName", "str"), 3: ("namespace", "str"),
                   11: ("labels", "map:str"), 12: ("annotations", "map:str"), 14: ("finalizers", "list:str")},
    "Namespace": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", "list:str")},
    "ConfigMap": {1: ("metadata", "msg:ObjectMeta"), 2: ("data", "map:str"), 3: ("binaryData", "map:bytes"),
                  4: ("immutable", "bool")},
    "Secret": {1: ("metadata", "msg:ObjectMeta"), 2: ("data", "map:bytes"), 3: ("type", "str"),
               4: ("stringData", "map:str"), 5: ("immutable", "bool")},
    "ServiceAccount": {1: ("metadata", "msg:ObjectMeta")},
    "ResourceQuota": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:ResourceQuotaSpec")},
    "ResourceQuotaSpec": {1: ("hard", "map:quantity"), 2: ("scopes", "list:str"), 3: ("scopeSelector", "msg:ScopeSelector")},
    "ScopeSelector": {1: ("matchExpressions", "list:msg:ScopedResourceSelectorRequirement")},
    "ScopedResourceSelectorRequirement": {1: ("scopeName", "str"), 2: ("operator", "str"), 3: ("values", "list:str")},
    "Quantity": {1: ("string", "str")},
    "PriorityClass": {1: ("metadata", "msg:ObjectMeta"), 2: ("value", "int"), 3: ("globalDefault", "bool"),
                      4: ("description", "str"), 5: ("preemptionPolicy", "str")},
    # `kubectl create token` (authentication.k8s.io/v1)
    "TokenRequest": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:TokenRequestSpec")},
    "TokenRequestSpec": {1: ("audiences", "list:str"), 3: ("boundObjectRef", "msg:BoundObjectReference"),
                         4: ("expirationSeconds", "int")},
    "BoundObjectReference": {1: ("kind", "str"), 2: ("apiVersion", "str"), 3: ("name", "str"), 4: ("uid", "str")},
    # `kubectl auth whoami|can-i` and the review APIs (authentication/authorization.k8s.io/v1)
    "SelfSubjectReview": {1: ("metadata", "msg:ObjectMeta")},
    "TokenReview": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:TokenReviewSpec")},
    "TokenReviewSpec": {1: ("token", "str"), 2: ("audiences", "list:str")},
    "SelfSubjectAccessReview": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:SubjectAccessReviewSpec")},
    "SubjectAccessReview": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:SubjectAccessReviewSpec")},
    "SubjectAccessReviewSpec": {1: ("resourceAttributes", "msg:ResourceAttributes"),
                                2: ("nonResourceAttributes", "msg:NonResourceAttributes"), 3: ("user", "str"),
                                4: ("groups", "list:str"), 6: ("uid", "str")},
    "ResourceAttributes": {1: ("namespace", "str"), 2: ("verb", "str"), 3: ("group", "str"), 4: ("version", "str"),
                           5: ("resource", "str"), 6: ("subresource", "str"), 7: ("name", "str")},
    "NonResourceAttributes": {1: ("path", "str"), 2: ("verb", "str")},
    # workloads: what `kubectl create deployment|job|poddisruptionbudget` and `kubectl run` send
    "Pod": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:PodSpec")},
    "Deployment": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:DeploymentSpec")},
    "DeploymentSpec": {1: ("replicas", "int"), 2: ("selector", "msg:LabelSelector"), 3: ("template", "msg:PodTemplateSpec"),
                       4: ("strategy", "msg:DeploymentStrategy"), 5: ("minReadySeconds", "int"),
                       6: ("revisionHistoryLimit", "int"), 7: ("paused", "bool"), 9: ("progressDeadlineSeconds", "int")},
    "DeploymentStrategy": {1: ("type", "str")},
    "Job": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:JobSpec")},
    "JobSpec": {1: ("parallelism", "int"), 2: ("completions", "int"), 3: ("activeDeadlineSeconds", "int"),
                4: ("selector", "msg:LabelSelector"), 5: ("manualSelector", "bool"), 6: ("template", "msg:PodTemplateSpec"),
                7: ("backoffLimit", "int"), 8: ("ttlSecondsAfterFinished", "int"), 9: ("completionMode", "str"),
                10: ("suspend", "bool")},
    "PodDisruptionBudget": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:PodDisruptionBudgetSpec")},
    "PodDisruptionBudgetSpec": {1: ("minAvailable", "intstr"), 2: ("selector", "msg:LabelSelector"),
                                3: ("maxUnavailable", "intstr"), 4: ("unhealthyPodEvictionPolicy", "str")},
    "IntOrString": {1: ("type", "int"), 2: ("intVal", "int"), 3: ("strVal", "str")},
    "LabelSelector": {1: ("matchLabels", "map:str")},
    "PodTemplateSpec": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:PodSpec")},
    "PodSpec": {2: ("containers", "list:msg:Container"), 3: ("restartPolicy", "str"),
                4: ("terminationGracePeriodSeconds", "int"), 5: ("activeDeadlineSeconds", "int"), 6: ("dnsPolicy", "str"),
                8: ("serviceAccountName", "str"), 10: ("nodeName", "str")},
    "Container": {1: ("name", "str"), 2: ("image", "str"), 3: ("command", "list:str"), 4: ("args", "list:str"),
                  5: ("workingDir", "str"), 6: ("ports", "list:msg:ContainerPort"),
                  8: ("resources", "msg:ResourceRequirements"), 13: ("terminationMessagePath", "str"),
                  14: ("imagePullPolicy", "str"), 16: ("stdin", "bool"), 17: ("stdinOnce", "bool"), 18: ("tty", "bool"),
                  20: ("terminationMessagePolicy", "str")},
    "ContainerPort": {1: ("name", "str"), 2: ("hostPort", "int"), 3: ("containerPort", "int"), 4: ("protocol", "str"),
                      5: ("hostIP", "str")},
    "ResourceRequirements": {1: ("limits", "map:quantity"), 2: ("requests", "map:quantity")},
}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes):
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _is_zero(wire: int, raw) -> bool:
    if wire == 0:
        return raw == 0
    if wire in (1, 5):
        return not any(raw)
    if not raw:
        return True
    try:
        return all(_is_zero(w, r) for _, w, r in _fields(raw))
    except ValueError:
        return False


def _map_entry(data: bytes) -> tuple[bytes, bytes]:
    key = value = b""
    for number, _, raw in _fields(data):
        if number == 1:
            key = raw
        elif number == 2:
            value = raw
    return key, value


def decode_message(data: bytes, schema: str) -> dict:
    fields = SCHEMAS[schema]
    out: dict = {}
    for number, wire, raw in _fields(data):
        if number not in fields:
            if _is_zero(wire, raw):  # Go's marshaller writes zero values of non-pointer fields
                continue
            raise ValueError(f"{schema} field {number} is not understood by the local cluster")
        name, typ = fields[number]
        if typ == "str":
            if raw:  # Go writes "" for unset non-pointer strings; the API's defaulting treats both alike
                out[name] = raw.decode()
        elif typ == "bytes":
            out[name] = raw
        elif typ == "int":
            out[name] = raw - (1 << 64) if raw >= 1 << 63 else raw
        elif typ == "bool":
            if raw:  # as JSON's omitempty: false and unset are one value
                out[name] = True
        elif typ == "intstr":  # intstr.IntOrString: {type 0: intVal, 1: strVal} -> 3 or "25%"
            value = decode_message(raw, "IntOrString")
            out[name] = value.get("strVal", "") if value.get("type") == 1 else value.get("intVal", 0)
        elif typ.startswith("msg:"):
            out[name] = decode_message(raw, typ[4:])
        elif typ.startswith("map:"):
            key, value = _map_entry(raw)
            kind = typ[4:]
            decoded = (base64.b64encode(value).decode() if kind == "bytes" else
                       decode_message(value, "Quantity").get("string", "0") if kind == "quantity" else value.decode())
            out.setdefault(name, {})[key.decode()] = decoded
        elif typ == "list:str":
            out.setdefault(name, []).append(raw.decode())
        elif typ.startswith("list:msg:"):
            out.setdefault(name, []).append(decode_message(raw, typ[9:]))
    return out


def decode_body(body: bytes, expected_kind: str) -> dict:
    """The JSON-shaped object of a protobuf request body; 415 for kinds this decoder does not know."""
    if not body.startswith(MAGIC):
        raise errors.bad_request("protobuf body without the k8s\\0 prefix")
    try:
        envelope = decode_message(body[len(MAGIC):], "Unknown")
        kind = envelope.get("typeMeta", {}).get("kind") or expected_kind
        if kind not in SCHEMAS or "metadata" not in SCHEMAS[kind].get(1, ("",))[0]:
            raise errors.unsupported_media_type(f"application/vnd.kubernetes.protobuf ({kind}); send JSON")
        obj = decode_message(envelope.get("raw", b""), kind)
    except ValueError as exc:
        raise errors.unsupported_media_type(f"application/vnd.kubernetes.protobuf ({exc}); send JSON") from None
    obj["apiVersion"] = envelope.get("typeMeta", {}).get("apiVersion", "")
    obj["kind"] = kind
    return obj

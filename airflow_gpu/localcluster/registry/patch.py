"""PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch, JSON patch (RFC 6902).

Strategic merge keys are those of the pod/node/service fields clients patch in practice (containers
by name, env by name, conditions by type, taints by key, ...); lists not listed here are replaced,
which is what the real API does for atomic lists such as tolerations.
"""

from __future__ import annotations

import copy

import jsonpatch

from airflow_gpu.localcluster.errors import ApiError, bad_request

MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath", "imagePullSecrets": "name",
    "conditions": "type", "taints": "key", "ownerReferences": "uid", "hostAliases": "ip",
    "addresses": "type", "resourceClaims": "name", "topologySpreadConstraints": "topologyKey",
    "containerStatuses": "name", "initContainerStatuses": "name",
}
PRIMITIVE_MERGE = {"finalizers"}


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _ports_key(items: list) -> str:
    sample = next((i for i in items if isinstance(i, dict)), {})
    return "containerPort" if "containerPort" in sample else "port"


def strategic_merge(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    if retain is not None:
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, current, patch: list) -> list:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and i.get("$patch"))]
    current = list(current or [])
    if field in PRIMITIVE_MERGE:
        return current + [v for v in patch if v not in current]
    key = MERGE_KEYS.get(field) or (_ports_key(patch + current) if field == "ports" else None)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return copy.deepcopy(patch)
    for item in patch:
        if key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {key}")
        index = next((n for n, c in enumerate(current) if isinstance(c, dict) and c.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                current.pop(index)
            continue
        if index is None:
            current.append(strategic_merge({}, item))
        else:
            current[index] = strategic_merge(current[index], item)
    return current


def apply_patch(obj: dict, patch_body, content_type: str, strategic_ok: bool) -> dict:
    if content_type == "application/json-patch+json":
        if not isinstance(patch_body, list):
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        try:
            return jsonpatch.apply_patch(obj, patch_body)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {exc}")
    if not isinstance(patch_body, dict):
        raise bad_request("json: cannot unmarshal array into Go value of type map[string]interface {}")
    if content_type == "application/merge-patch+json":
        return merge_patch(obj, patch_body)
    if content_type in ("application/strategic-merge-patch+json", "application/apply-patch+yaml",
                        "application/apply-patch+json"):
        if not strategic_ok and content_type == "application/strategic-merge-patch+json":
            raise ApiError(415, "UnsupportedMediaType",
                           "strategic merge patch is not supported for custom resources; use a merge patch")
        return strategic_merge(obj, patch_body) if strategic_ok else merge_patch(obj, patch_body)
    raise ApiError(415, "UnsupportedMediaType", 'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json')

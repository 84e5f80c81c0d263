"""Object schemas: decoding checks like the real API server's, and the OpenAPI v3 documents kubectl reads.

Built-in types take their schema from the official `kubernetes` client's generated models
(`openapi_types` / `attribute_map`), which are generated from the real API's OpenAPI spec; custom
resources use their CRD's openAPIV3Schema. From these we get: type errors and invalid quantities as
400 (the real server fails to decode), unknown fields (fieldValidation Strict -> 400, Warn -> a
Warning header, both drop the field), and /openapi/v3 documents for `kubectl create -f` validation.
"""

from __future__ import annotations

import re
from functools import lru_cache

import kubernetes.client as k8s_models

from airflow_gpu.localcluster.errors import bad_request
from airflow_gpu.localcluster.registry.resources import ResourceType

QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
QUANTITY_MESSAGE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
# (model, attribute) whose map values are resource.Quantity
QUANTITY_MAPS = {
    ("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
    ("V1NodeStatus", "capacity"), ("V1NodeStatus", "allocatable"),
    ("V1ResourceQuotaSpec", "hard"), ("V1ResourceQuotaStatus", "hard"), ("V1ResourceQuotaStatus", "used"),
    ("V1PodSpec", "overhead"), ("V1ContainerStatus", "allocated_resources"),
}
_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\[str, (.+)\]$")


@lru_cache(maxsize=None)
def model_fields(model: str) -> dict[str, tuple[str, str]]:
    """json field name -> (python attribute, type string)."""
    cls = getattr(k8s_models, model)
    return {cls.attribute_map[attr]: (attr, typ) for attr, typ in cls.openapi_types.items()}


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class Decoder:
    """Checks one object against its type, collecting unknown fields and normalising quantities."""

    def __init__(self, kind: str, version: str):
        self.kind, self.version = kind, version
        self.unknown: list[str] = []

    def fail(self, message: str):
        raise bad_request(f'{self.kind} in version "{self.version}" cannot be handled as a {self.kind}: {message}')

    def check_type(self, value, typ: str, path: str, owner: str = "", attr: str = ""):
        """Returns the (possibly normalised) value; unknown fields are dropped and remembered."""
        if value is None or typ == "object":
            return value
        if typ == "str" or typ == "datetime":
            if not isinstance(value, str):
                self.fail(f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type string")
            return value
        if typ == "int":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                self.fail(f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type int64")
            return int(value)
        if typ == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type float64")
            return value
        if typ == "bool":
            if not isinstance(value, bool):
                self.fail(f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type bool")
            return value
        m = _LIST.match(typ)
        if m:
            if not isinstance(value, list):
                self.fail(f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type array")
            return [self.check_type(v, m.group(1), f"{path}[{i}]") for i, v in enumerate(value)]
        m = _DICT.match(typ)
        if m:
            if not isinstance(value, dict):
                self.fail(f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type map")
            if (owner, attr) in QUANTITY_MAPS:
                return {k: self.quantity(v, f"{path}.{k}") for k, v in value.items()}
            return {k: self.check_type(v, m.group(1), f"{path}.{k}") for k, v in value.items()}
        return self.check_model(value, typ, path)

    def quantity(self, value, path: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type resource.Quantity")
        text = repr(value) if isinstance(value, float) else str(value)
        if not QUANTITY.match(text):
            self.fail(QUANTITY_MESSAGE)
        return text

    def check_model(self, value, model: str, path: str) -> dict:
        if not isinstance(value, dict):
            self.fail(f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type {model}")
        fields = model_fields(model)
        out = {}
        for key, item in value.items():
            spec = fields.get(key)
            child = f"{path}.{key}" if path else key
            if spec is None:
                self.unknown.append(child)
                continue
            out[key] = self.check_type(item, spec[1], child, model, spec[0])
        return out

    def check_crd(self, value, schema: dict, path: str):
        """Unknown fields of a custom resource (pruning, as the real server does for structural schemas)."""
        if not isinstance(value, dict) or not schema or schema.get("x-kubernetes-preserve-unknown-fields"):
            return value
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        if props is None and additional is None:
            return value
        out = {}
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if props is not None and key in props:
                sub = props[key]
                if isinstance(item, list) and isinstance(sub.get("items"), dict):
                    out[key] = [self.check_crd(v, sub["items"], f"{child}[{i}]") for i, v in enumerate(item)]
                else:
                    out[key] = self.check_crd(item, sub, child)
            elif isinstance(additional, dict):
                out[key] = self.check_crd(item, additional, child)
            elif additional is True:
                out[key] = item
            else:
                self.unknown.append(child)
        return out


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _type_name(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(type(value)) or \
        ("integer" if isinstance(value, int) else "number" if isinstance(value, float) else "null")


def crd_causes(value, schema: dict, path: str) -> list[tuple[str, str, str]]:
    """Structural-schema checks of a custom resource (type, required, enum, minimum/maximum), with
    the apiextensions server's messages: `spec.minMember in body must be of type integer: "string"`."""
    if not schema or value is None or schema.get("x-kubernetes-preserve-unknown-fields") and "type" not in schema:
        return []
    causes: list[tuple[str, str, str]] = []
    typ = schema.get("type")
    shown = path or "<root>"
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            causes.append((shown, "FieldValueTypeInvalid", f'Invalid value: "{_type_name(value)}": {shown} in body '
                                                           f'must be of type int-or-string: "{_type_name(value)}"'))
        return causes
    ok = {"integer": isinstance(value, int) and not isinstance(value, bool),
          "number": isinstance(value, (int, float)) and not isinstance(value, bool)}.get(typ)
    if ok is None and typ in _JSON_TYPES:
        ok = isinstance(value, _JSON_TYPES[typ])
    if ok is False:
        return [(shown, "FieldValueTypeInvalid", f'Invalid value: "{_type_name(value)}": {shown} in body must be of '
                                                 f'type {typ}: "{_type_name(value)}"')]
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(f'"{v}"' for v in schema["enum"])
        causes.append((shown, "FieldValueNotSupported", f'Unsupported value: "{value}": supported values: {allowed}'))
    for bound, cmp, word in (("minimum", lambda a, b: a < b, "greater"), ("maximum", lambda a, b: a > b, "less")):
        if bound in schema and isinstance(value, (int, float)) and cmp(value, schema[bound]):
            causes.append((shown, "FieldValueInvalid", f"Invalid value: {value}: {shown} in body should be "
                                                       f"{word} than or equal to {schema[bound]}"))
    if isinstance(value, dict):
        for req in schema.get("required") or []:
            if req not in value:
                where = f"{path}.{req}" if path else req
                causes.append((where, "FieldValueRequired", "Required value"))
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if key in props:
                causes += crd_causes(item, props[key], child)
            elif isinstance(extra, dict):
                causes += crd_causes(item, extra, child)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            causes += crd_causes(item, schema["items"], f"{path}[{i}]")
    return causes


def decode_object(rt: ResourceType, version: str, body: dict, field_validation: str) -> tuple[dict, list[str]]:
    """Check `body` as rt; returns (object with unknown fields dropped, warnings). Strict -> 400."""
    decoder = Decoder(rt.kind, version)
    if rt.model:
        obj = decoder.check_model(body, rt.model, "")
    else:
        meta = body.get("metadata")
        obj = decoder.check_crd(body, {**rt.schemas.get(version, {}), "x-kubernetes-preserve-unknown-fields": False}, "")
        for top in ("apiVersion", "kind"):
            if top in body:
                obj[top] = body[top]
        decoder.unknown = [u for u in decoder.unknown if u not in ("apiVersion", "kind", "metadata")]
        if meta is not None:
            obj["metadata"] = decoder.check_model(meta, "V1ObjectMeta", "metadata")
    unknown = sorted(set(decoder.unknown))
    if unknown and field_validation == "Strict":
        detail = ", ".join(f'unknown field "{u}"' for u in unknown)
        decoder.fail(f"strict decoding error: {detail}")
    warnings = [f'unknown field "{u}"' for u in unknown] if field_validation != "Ignore" else []
    return obj, warnings


# --- OpenAPI v3 ------------------------------------------------------------------------------
def _schema_of(typ: str, refs: set[str], owner: str = "", attr: str = "") -> dict:
    if typ == "str":
        return {"type": "string"}
    if typ == "datetime":
        return {"type": "string", "format": "date-time"}
    if typ == "int":
        return {"type": "integer", "format": "int64"}
    if typ == "float":
        return {"type": "number", "format": "double"}
    if typ == "bool":
        return {"type": "boolean"}
    if typ == "object":
        return {"x-kubernetes-int-or-string": True} if attr in ("port", "target_port") else {}
    m = _LIST.match(typ)
    if m:
        return {"type": "array", "items": _schema_of(m.group(1), refs)}
    m = _DICT.match(typ)
    if m:
        if (owner, attr) in QUANTITY_MAPS:
            return {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Quantity"}}
        return {"type": "object", "additionalProperties": _schema_of(m.group(1), refs)}
    refs.add(typ)
    return {"allOf": [{"$ref": f"#/components/schemas/{typ}"}]}


def model_schemas(roots: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {"Quantity": {"x-kubernetes-int-or-string": True, "type": "string"}}
    todo = list(roots)
    while todo:
        model = todo.pop()
        if model in out:
            continue
        refs: set[str] = set()
        props = {json: _schema_of(typ, refs, model, attr) for json, (attr, typ) in model_fields(model).items()}
        out[model] = {"type": "object", "properties": props}
        todo.extend(r for r in refs if r not in out)
    return out


def openapi_document(group: str, version: str, types: list[ResourceType]) -> dict:
    """One group-version document with what kubectl needs: a PATCH operation carrying
    x-kubernetes-group-version-kind and a fieldValidation parameter per kind (server-side validation)."""
    schemas = model_schemas([rt.model for rt in types if rt.model] + ["V1ObjectMeta"])
    paths: dict[str, dict] = {}
    field_validation = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True},
                        "description": "Ignore, Warn or Strict"}
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    for rt in types:
        gvk = {"group": group, "version": version, "kind": rt.kind}
        name = rt.model or f"{group}.{version}.{rt.kind}"
        if not rt.model:
            schema = dict(rt.schemas.get(version) or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
            props = dict(schema.get("properties") or {})
            props["metadata"] = {"allOf": [{"$ref": "#/components/schemas/V1ObjectMeta"}]}
            schema["properties"] = props
            schemas[name] = schema
        schemas[name] = {**schemas[name], "x-kubernetes-group-version-kind": [gvk]}
        ref = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}
        base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"

        def op(verb: str, extra: list | None = None) -> dict:
            return {"operationId": f"{verb}{rt.kind}", "x-kubernetes-action": verb,
                    "x-kubernetes-group-version-kind": gvk, "parameters": extra or [],
                    "responses": {"200": {"description": "OK", **ref}}}

        paths[base] = {"get": op("list"), "post": {**op("post", [field_validation]), "requestBody": ref}}
        paths[base + "/{name}"] = {
            "get": op("get"), "put": {**op("put", [field_validation]), "requestBody": ref},
            "patch": op("patch", [field_validation]), "delete": op("delete"),
        }
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": paths, "components": {"schemas": schemas}}

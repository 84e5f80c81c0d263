"""/openapi/v2: the Swagger 2.0 document, as JSON or as the protobuf kubectl asks for
(`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`, gnostic's openapi_v2.Document).

Built from the same schemas as the OpenAPI v3 documents (refs rewritten to #/definitions/). Only what
clients read is encoded: definitions with their types, refs, descriptions, items, properties,
additionalProperties, required and vendor extensions (x-kubernetes-group-version-kind, patch strategies),
whose values gnostic carries as YAML. Field numbers are those of gnostic's OpenAPIv2.proto.
"""

from __future__ import annotations

import yaml

def _v2_refs(value):
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "$ref" and isinstance(v, str):
                out[k] = v.replace("#/components/schemas/", "#/definitions/")
            else:
                out[k] = _v2_refs(v)
        if set(out) == {"allOf"} and len(out["allOf"]) == 1:  # v3 wraps refs to allow siblings
            return out["allOf"][0]
        if "allOf" in out and len(out["allOf"]) == 1 and "$ref" in out["allOf"][0]:
            merged = {k: v for k, v in out.items() if k != "allOf"}
            return {"$ref": out["allOf"][0]["$ref"], **({"description": merged["description"]}
                                                          if "description" in merged else {})}
        return out
    if isinstance(value, list):
        return [_v2_refs(v) for v in value]
    return value


def swagger(definitions: dict[str, dict], version: str) -> dict:
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": version}, "paths": {},
            "definitions": {name: _v2_refs(schema) for name, schema in sorted(definitions.items())}}


# --- protobuf ------------------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _str(number: int, text: str) -> bytes:
    return _field(number, text.encode()) if text else b""


def _named(name: str, value: bytes) -> bytes:
    return _str(1, name) + _field(2, value)


def _schema(schema: dict) -> bytes:
    out = bytearray()
    if not isinstance(schema, dict):
        return b""
    out += _str(1, schema.get("$ref", ""))
    out += _str(2, schema.get("format", ""))
    out += _str(4, schema.get("description", ""))
    for name in schema.get("required") or []:
        out += _str(19, name)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        out += _field(21, _field(1, _schema(extra)))
    elif isinstance(extra, bool):
        out += _field(21, _varint(2 << 3 | 0) + _varint(int(extra)))
    types = schema.get("type")
    if types:
        out += _field(22, b"".join(_str(1, t) for t in ([types] if isinstance(types, str) else types)))
    if isinstance(schema.get("items"), dict):
        out += _field(23, _field(1, _schema(schema["items"])))
    for sub in schema.get("allOf") or []:
        out += _field(24, _schema(sub))
    props = schema.get("properties")
    if isinstance(props, dict) and props:
        out += _field(25, b"".join(_field(1, _named(k, _schema(v))) for k, v in props.items()))
    for key, value in schema.items():
        if key.startswith("x-"):
            text = yaml.safe_dump(value, default_flow_style=False, sort_keys=False)
            out += _field(31, _named(key, _str(2, text)))
    return bytes(out)


def to_protobuf(doc: dict) -> bytes:
    info = doc.get("info") or {}
    out = _str(1, doc.get("swagger", "2.0"))
    out += _field(2, _str(1, info.get("title", "")) + _str(2, info.get("version", "")))
    out += _field(8, b"")  # paths: none (clients look kinds up by x-kubernetes-group-version-kind)
    out += _field(9, b"".join(_field(1, _named(name, _schema(schema)))
                               for name, schema in (doc.get("definitions") or {}).items()))
    return out

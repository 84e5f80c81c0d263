"""Field descriptions and list/patch extensions of the built-in types from the official OpenAPI, as
shipped by kubernetes-validate (the Kubernetes 1.32 definitions, generated from the API's own spec).

The validation schemas (schema.py) come from the official client's models, which carry field names and
types but no documentation; this pairs each client model with its definition by walking both trees
from the kinds (group, version, kind) down, so `kubectl explain` prints the real descriptions.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from airflow_gpu.localcluster.registry.resources import BUILTINS
from airflow_gpu.localcluster.registry.schema import model_fields

KUBE_MINOR = "1.32"
EXTENSIONS = ("x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key", "x-kubernetes-list-type",
              "x-kubernetes-list-map-keys", "x-kubernetes-map-type")
_INNER = re.compile(r"^(?:list|dict)\[(?:str, )?(.+)\]$")


def load_definitions() -> dict[str, dict]:
    """The official definitions; {} without kubernetes-validate (a test extra): no descriptions then."""
    try:
        import kubernetes_validate
    except ImportError:
        return {}
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    folders = sorted(root.glob(f"v{KUBE_MINOR}.*-local")) or sorted(root.glob("v*-local"))
    if not folders:
        return {}
    return json.loads((folders[-1] / "_definitions.json").read_text())["$defs"]


def _ref(prop: dict) -> str | None:
    for holder in (prop, prop.get("items") or {}, prop.get("additionalProperties") or {},
                   *(prop.get("allOf") or [])):
        if isinstance(holder, dict) and holder.get("$ref"):
            return holder["$ref"].rsplit("/", 1)[-1]
    return None


def _roots(definitions: dict[str, dict]) -> dict[tuple[str, str, str], str]:
    out = {}
    for name, schema in definitions.items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            out.setdefault((gvk.get("group", ""), gvk["version"], gvk["kind"]), name)
    return out


class Docs:
    """model name -> its definition's description, and per json field: description and extensions."""

    def __init__(self, definitions: dict[str, dict]) -> None:
        self.definitions = definitions
        self.roots = _roots(definitions)
        self.models: dict[str, str] = {}  # client model -> definition name

    def add_root(self, model: str, group: str, version: str, kind: str) -> None:
        definition = self.roots.get((group, version, kind))
        if definition is not None:
            self._pair(model, definition)

    def _pair(self, model: str, definition: str) -> None:
        if model in self.models or definition not in self.definitions:
            return
        self.models[model] = definition
        props = self.definitions[definition].get("properties") or {}
        for json_name, (_, typ) in model_fields(model).items():
            inner = _INNER.match(typ)
            child = inner.group(1) if inner else typ
            if child[:1].isupper() and json_name in props:
                ref = _ref(props[json_name])
                if ref:
                    self._pair(child, ref)

    def model_description(self, model: str) -> str | None:
        definition = self.models.get(model)
        return self.definitions[definition].get("description") if definition else None

    def field_extras(self, model: str, json_name: str) -> dict:
        definition = self.models.get(model)
        if definition is None:
            return {}
        prop = (self.definitions[definition].get("properties") or {}).get(json_name) or {}
        out = {k: prop[k] for k in EXTENSIONS if k in prop}
        if prop.get("description"):
            out["description"] = prop["description"]
        return out


@lru_cache(maxsize=1)
def builtin_docs() -> dict[str, tuple[str | None, dict[str, dict]]]:
    """model -> (description, {json field: description and extensions}) for every built-in kind and
    the models below it; computed once (the 1.3 MB definitions are read and dropped)."""
    definitions = load_definitions()
    if not definitions:
        return {}
    docs = Docs(definitions)
    for rt in BUILTINS:
        if rt.model:
            for version in rt.versions:
                docs.add_root(rt.model, rt.group, version, rt.kind)
    return {model: (docs.model_description(model),
                    {name: extras for name in model_fields(model) if (extras := docs.field_extras(model, name))})
            for model in docs.models}


def annotate(schemas: dict[str, dict]) -> None:
    """Add descriptions and list/patch extensions to the model schemas of one OpenAPI v3 document."""
    known = builtin_docs()
    for model, schema in schemas.items():
        if model not in known:
            continue
        description, fields = known[model]
        if description:
            schema["description"] = description
        for name, prop in (schema.get("properties") or {}).items():
            if name in fields:
                prop.update(fields[name])

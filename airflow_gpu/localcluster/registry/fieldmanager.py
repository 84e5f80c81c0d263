"""Server-side apply: managedFields, conflicts and field removal, as structured-merge-diff does them.

An apply (PATCH application/apply-patch+yaml, fieldManager=M) is merged into the live object: maps
merge, associative lists (x-kubernetes-list-type map, keyed by their list-map-keys) merge item by item,
set lists merge by value, other lists and scalars are replaced. Fields M applied before and leaves out
now are removed unless another manager owns them. A field M applies with a different value than the one
another manager set is a 409 conflict unless force=true (then M takes it over). Other writes that name
a fieldManager (kubectl create/edit/scale/apply client-side do) record an Update entry owning what they
changed. Writes without one (the Python clients, the in-process controllers) leave managedFields as they
are: that keeps the hot path of the local cluster free of field-set arithmetic.

List semantics come from the official definitions (openapidocs) for built-in kinds and from the CRD's
schema for custom resources; a list whose type is unknown is atomic, as in structured-merge-diff.
Subresource writes (status, scale) are not tracked.
"""

from __future__ import annotations

import json

from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.registry.openapidocs import builtin_docs
from airflow_gpu.localcluster.registry.patch import MERGE_KEYS
from airflow_gpu.localcluster.podutil import now_iso
from airflow_gpu.localcluster.registry.schema import model_fields

UNTRACKED_META = {"managedFields", "resourceVersion", "uid", "creationTimestamp", "generation", "selfLink",
                  "deletionTimestamp", "deletionGracePeriodSeconds", "name", "namespace"}
_LIST = "list["
_DICT = "dict[str, "


class TypeNode:
    """What is known of the type at one place in an object: a client model, a CRD schema, or nothing."""

    __slots__ = ("model", "typ", "schema", "extras")

    def __init__(self, model: str | None = None, typ: str | None = None, schema: dict | None = None,
                 extras: dict | None = None):
        self.model, self.typ, self.schema, self.extras = model, typ, schema, extras or {}

    def field(self, name: str) -> "TypeNode":
        if self.model:
            spec = model_fields(self.model).get(name)
            if spec is None:
                return TypeNode()
            typ = spec[1]
            extras = (builtin_docs().get(self.model) or (None, {}))[1].get(name, {})
            if not extras and name in MERGE_KEYS:  # no official definitions installed: the known merge keys
                extras = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [MERGE_KEYS[name]]}
            return TypeNode(typ if typ[:1].isupper() and not typ.startswith(("list", "dict")) else None, typ,
                            extras=extras)
        if self.typ and self.typ.startswith(_DICT):
            return _of(self.typ[len(_DICT):-1])
        if self.schema is not None:
            props = self.schema.get("properties") or {}
            if name in props:
                return TypeNode(schema=props[name], extras=props[name])
            extra = self.schema.get("additionalProperties")
            if isinstance(extra, dict):
                return TypeNode(schema=extra, extras=extra)
        return TypeNode()

    def item(self) -> "TypeNode":
        if self.typ and self.typ.startswith(_LIST):
            return _of(self.typ[len(_LIST):-1])
        if self.schema is not None and isinstance(self.schema.get("items"), dict):
            return TypeNode(schema=self.schema["items"], extras=self.schema["items"])
        return TypeNode()

    @property
    def list_type(self) -> str:
        return self.extras.get("x-kubernetes-list-type") or "atomic"

    @property
    def list_keys(self) -> list[str]:
        return list(self.extras.get("x-kubernetes-list-map-keys") or [])

    @property
    def is_map_of_values(self) -> bool:  # map[string]X: the map itself is a tracked node (".")
        return bool(self.typ and self.typ.startswith(_DICT)) or (
            self.schema is not None and "additionalProperties" in self.schema and "properties" not in self.schema)


def _of(typ: str) -> TypeNode:
    if typ[:1].isupper():
        return TypeNode(typ, typ)
    return TypeNode(None, typ)


def root_node(rt, version: str) -> TypeNode:
    if rt.model:
        return TypeNode(rt.model, rt.model)
    schema = rt.schemas.get(version) or rt.schemas.get(rt.versions[0]) or {}
    props = dict(schema.get("properties") or {})
    props["metadata"] = {"type": "object"}
    return TypeNode(schema={**schema, "properties": props})


# --- paths -------------------------------------------------------------------------------------------
def _key_of(item: dict, keys: list[str]) -> str:
    return "k:" + json.dumps({k: item.get(k) for k in keys}, separators=(",", ":"), sort_keys=True)


def _walk(value, node: TypeNode, prefix: tuple, out: set, root: bool = False) -> None:
    if isinstance(value, dict):
        if node.is_map_of_values and prefix:
            out.add(prefix + (".",))
        for name, child in value.items():
            if root and name in ("apiVersion", "kind"):
                continue
            if prefix == ("f:metadata",) and name in UNTRACKED_META:
                continue
            _walk(child, node.field(name), prefix + (f"f:{name}",), out)
        if not value and not node.is_map_of_values:
            out.add(prefix)
        return
    if isinstance(value, list) and node.list_type == "map" and node.list_keys and all(isinstance(v, dict) for v in value):
        inner = node.item()
        for item in value:
            key = prefix + (_key_of(item, node.list_keys),)
            out.add(key + (".",))
            for name, child in item.items():
                _walk(child, inner.field(name), key + (f"f:{name}",), out)
        return
    if isinstance(value, list) and node.list_type == "set":
        for item in value:
            out.add(prefix + ("v:" + json.dumps(item, separators=(",", ":")),))
        return
    out.add(prefix)  # scalar or atomic list


def field_paths(obj: dict, rt, version: str, skip_status: bool = True) -> set[tuple]:
    body = {k: v for k, v in obj.items() if not (skip_status and k == "status")}
    out: set[tuple] = set()
    _walk(body, root_node(rt, version), (), out, root=True)
    out.discard(())
    return out


def _leaf_value(obj, path: tuple):
    """The value at a path (None if absent); "." is the container itself."""
    cur = obj
    for part in path:
        if part == ".":
            return cur
        if part.startswith("f:"):
            if not isinstance(cur, dict) or part[2:] not in cur:
                return None
            cur = cur[part[2:]]
        elif part.startswith("k:"):
            want = json.loads(part[2:])
            cur = next((i for i in cur or [] if isinstance(i, dict) and all(i.get(k) == v for k, v in want.items())),
                       None) if isinstance(cur, list) else None
            if cur is None:
                return None
        elif part.startswith("v:"):
            value = json.loads(part[2:])
            return value if isinstance(cur, list) and value in cur else None
    return cur


def readable(path: tuple) -> str:
    out = ""
    for part in path:
        if part == ".":
            continue
        if part.startswith("f:"):
            out += "." + part[2:]
        elif part.startswith("k:"):
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(part[2:]).items()) + "]"
        elif part.startswith("v:"):
            out += f"[{part[2:]}]"
    return out


# --- fieldsV1 <-> path sets -------------------------------------------------------------------------------
def to_fields_v1(paths: set[tuple]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        cur = tree
        for part in path:
            cur = cur.setdefault(part, {})
    return tree


def from_fields_v1(tree: dict, prefix: tuple = ()) -> set[tuple]:
    out: set[tuple] = set()
    for part, sub in (tree or {}).items():
        path = prefix + (part,)
        if part == "." or not sub:
            out.add(path)
        if sub:
            out |= from_fields_v1(sub, path)
    return out


def _entries(obj: dict) -> list[dict]:
    return [dict(e) for e in obj["metadata"].get("managedFields") or []]


def _set_of(entry: dict) -> set[tuple]:
    return from_fields_v1(entry.get("fieldsV1") or {})


def _entry(manager: str, operation: str, api_version: str, paths: set[tuple]) -> dict:
    return {"manager": manager, "operation": operation, "apiVersion": api_version, "time": now_iso(),
            "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)}


# --- merge ----------------------------------------------------------------------------------------------
def _merge(live, applied, node: TypeNode):
    if isinstance(applied, dict) and isinstance(live, dict):
        out = dict(live)
        for name, value in applied.items():
            out[name] = _merge(live.get(name), value, node.field(name))
        return out
    if isinstance(applied, list) and isinstance(live, list):
        if node.list_type == "map" and node.list_keys and all(isinstance(i, dict) for i in applied + live):
            keys = node.list_keys
            index = {_key_of(i, keys): n for n, i in enumerate(live)}
            out = list(live)
            inner = node.item()
            for item in applied:
                k = _key_of(item, keys)
                if k in index:
                    out[index[k]] = _merge(out[index[k]], item, inner)
                else:
                    out.append(item)
            return out
        if node.list_type == "set":
            return live + [v for v in applied if v not in live]
    return applied


def _remove(obj, path: tuple) -> None:
    """Remove the field, list item or set value at path (a trailing "." removes the container)."""
    if path and path[-1] == ".":
        path = path[:-1]
    parents = [obj]
    cur = obj
    for part in path[:-1]:
        nxt = _leaf_value(cur, (part,))
        if nxt is None:
            return
        parents.append(nxt)
        cur = nxt
    last = path[-1] if path else None
    if last is None:
        return
    if last.startswith("f:") and isinstance(cur, dict):
        cur.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(cur, list):
        want = json.loads(last[2:])
        cur[:] = [i for i in cur if not (isinstance(i, dict) and all(i.get(k) == v for k, v in want.items()))]
    elif last.startswith("v:") and isinstance(cur, list):
        value = json.loads(last[2:])
        cur[:] = [i for i in cur if i != value]


def _base(path: tuple) -> tuple:
    """The field a path names: a trailing "." stands for the map or list item itself."""
    return path[:-1] if path and path[-1] == "." else path


def _is_key_field(path: tuple) -> bool:
    return len(path) >= 2 and path[-1].startswith("f:") and path[-2].startswith("k:") \
        and path[-1][2:] in json.loads(path[-2][2:])


def _fresh(obj):
    return json.loads(json.dumps(obj))


def apply(rt, version: str, live: dict | None, applied: dict, manager: str, force: bool) -> dict:
    """The object after server-side apply of `applied` by `manager` (live None: a create)."""
    if not manager:
        raise errors.bad_request("fieldManager is required for apply requests (?fieldManager=NAME)")
    if not isinstance(applied, dict):
        raise errors.bad_request("an apply patch must be an object (the fields this manager wants set)")
    api_version = rt.api_version(version)
    applied = _fresh(applied)
    mine = field_paths(applied, rt, version, skip_status=rt.has_status)
    if live is None:
        result = applied
        result.setdefault("metadata", {})["managedFields"] = [_entry(manager, "Apply", api_version, mine)]
        return result
    entries = _entries(live)
    own = next((e for e in entries if e["manager"] == manager and e["operation"] == "Apply"
                and not e.get("subresource")), None)
    conflicts: list[tuple[str, tuple]] = []
    for e in entries:
        if e is own or e.get("subresource"):
            continue
        for path in mine & _set_of(e):
            if path[-1] != "." and _leaf_value(live, path) != _leaf_value(applied, path):
                conflicts.append((e["manager"], path))
    if conflicts and not force:
        raise conflict_error(conflicts, api_version)
    taken = {p for _, p in conflicts}
    others = set().union(*[_set_of(e) - taken for e in entries if e is not own and not e.get("subresource")]) \
        if entries else set()
    result = _fresh(live)
    kept = others | mine
    # Containers before what is inside them, in a fixed order: removing a list item's key field first
    # would leave the rest of the item behind, unfindable (a set's order changes with the hash seed).
    for path in sorted((_set_of(own) if own else set()) - kept, key=lambda p: (len(_base(p)), p)):
        base = _base(path)
        if any(o[:len(base)] == base and o != base for o in kept):
            continue  # the map or list item stays: another manager (or this apply) owns a field inside
        if _is_key_field(path):
            continue  # a list item's key goes with the item, never alone
        _remove(result, path)
    result = _merge(result, applied, root_node(rt, version))
    present = field_paths(result, rt, version, skip_status=rt.has_status)
    new_entries = []
    for e in entries:
        if e is own:
            continue
        if not e.get("subresource"):
            remaining = (_set_of(e) - taken) & present
            if not remaining:
                continue
            e = {**e, "fieldsV1": to_fields_v1(remaining)}
        new_entries.append(e)
    new_entries.append(_entry(manager, "Apply", api_version, mine))
    result["metadata"]["managedFields"] = new_entries
    return result


def record_update(rt, version: str, old: dict | None, new: dict, manager: str | None) -> None:
    """A create/update/patch that names a fieldManager: it owns what it changed (an Update entry)."""
    if not manager:
        return
    api_version = rt.api_version(version)
    present = field_paths(new, rt, version, skip_status=rt.has_status)
    if old is None:
        new["metadata"]["managedFields"] = [_entry(manager, "Update", api_version, present)]
        return
    changed = {p for p in present if p[-1] != "." and _leaf_value(old, p) != _leaf_value(new, p)}
    changed |= {p for p in present if p[-1] == "." and _leaf_value(old, p) is None}
    entries = []
    mine = set()
    for e in _entries(old):
        if e.get("subresource"):
            entries.append(e)
            continue
        paths = _set_of(e) & present
        if e["manager"] == manager and e["operation"] == "Update":
            mine = paths
            continue
        paths -= changed
        if paths:
            entries.append({**e, "fieldsV1": to_fields_v1(paths)})
    if changed or mine:
        entries.append(_entry(manager, "Update", api_version, mine | changed))
    new["metadata"]["managedFields"] = entries


def conflict_error(conflicts: list[tuple[str, tuple]], api_version: str) -> errors.ApiError:
    lines = [f'conflict with "{m}" using {api_version}: {readable(p)}' for m, p in conflicts]
    message = (f"Apply failed with {len(conflicts)} conflict{'s' if len(conflicts) > 1 else ''}: "
               + ("\n".join(lines) if len(lines) > 1 else lines[0]))
    return errors.ApiError(409, "Conflict", message, {"causes": [
        {"reason": "FieldManagerConflict", "message": f'conflict with "{m}" using {api_version}',
         "field": readable(p)} for m, p in conflicts]})

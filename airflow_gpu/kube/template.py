"""A pod template (KubernetesPodOperator's `pod_template_file` / `pod_template_dict` / `full_pod_spec`,
and the KPO-style arguments that have no WorkloadSpec field of their own) applied to every member
of a gang.

The template gives what the gang does not decide (sidecars, init containers, volumes, security
contexts, image pull secrets, affinity, ...). What the gang decides wins, and a template that sets
one of those fields to something else is an error naming the field: silently dropping it would run
something other than what the author wrote.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from airflow_gpu import constants as C
from airflow_gpu.kube.spec import WorkloadSpecError

# pod fields the gang decides: the scheduler, its priority, the rendezvous DNS names, no restarts
GANG_OWNED_SPEC = frozenset({"schedulerName", "priorityClassName", "priority", "hostname", "subdomain",
                             "restartPolicy"})
# lists merged item by item on this key (equal items once; the same key with another value: an error)
_KEYED_LISTS = {"volumes": "name", "initContainers": "name", "imagePullSecrets": "name"}


def _where(path: str) -> str:
    return f"pod template {path}"


def merge_templates(base: Mapping | None, over: Mapping | None) -> dict:
    """`over` laid on `base` (both Pod wire dicts): mappings merged, lists of named items merged by
    name, other lists concatenated, scalars from `over`. The KPO-style arguments are laid on the
    author's template this way, as KubernetesPodOperator lays its arguments on pod_template_file."""
    if not base:
        return copy.deepcopy(dict(over or {}))
    if not over:
        return copy.deepcopy(dict(base))
    return _merge(copy.deepcopy(dict(base)), over)


def _merge(base, over):
    if isinstance(base, dict) and isinstance(over, Mapping):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(over, list):
        if all(isinstance(x, Mapping) and "name" in x for x in base + over):
            out = {x["name"]: x for x in base}
            for x in over:
                out[x["name"]] = _merge(out[x["name"]], x) if x["name"] in out else copy.deepcopy(x)
            return list(out.values())
        return base + [x for x in over if x not in base]
    return copy.deepcopy(over)


def apply_pod_template(pod: dict, template: Mapping, container_name: str, simple_affinity: bool = False) -> dict:
    """The gang member `pod` (wire dict, as kube.manifests builds it) with `template` under it.
    simple_affinity: the airflow-gpu scheduler places by a required node affinity of one term of
    `In` with one value (as a nodeSelector) and refuses richer ones; refuse them here, at parse."""
    tmeta = template.get("metadata") or {}
    meta = pod["metadata"]
    for part in ("labels", "annotations"):
        merged = dict(tmeta.get(part) or {})
        for key, value in (meta.get(part) or {}).items():
            if key in merged and merged[key] != value:
                raise WorkloadSpecError(f"{_where(f'metadata.{part}[{key!r}]')}={merged[key]!r}: the gang sets it "
                                        f"to {value!r}; remove it from the template")
            merged[key] = value
        if merged:
            meta[part] = merged
    tspec = copy.deepcopy(dict(template.get("spec") or {}))
    spec = pod["spec"]
    out = dict(tspec)
    for key, value in spec.items():
        theirs = tspec.get(key)
        if theirs is None:
            out[key] = value
        elif key == "containers":
            out[key] = _containers(theirs, value)
        elif key == "nodeSelector":
            out[key] = _mapping(theirs, value, "spec.nodeSelector")
        elif key in _KEYED_LISTS:
            out[key] = _keyed(theirs, value, f"spec.{key}", _KEYED_LISTS[key])
        elif key == "tolerations":
            out[key] = theirs + [t for t in value if t not in theirs]
        elif theirs != value:
            if key in GANG_OWNED_SPEC:
                raise WorkloadSpecError(f"{_where(f'spec.{key}')}={theirs!r}: the gang sets it to {value!r} "
                                        f"(airflow-gpu decides it); remove it from the template")
            out[key] = value  # the operator's own argument (e.g. service_account_name) wins, as in KPO
    _check_affinity(out, simple_affinity)
    pod["spec"] = out
    if len(out.get("containers") or []) > 1:  # sidecars: `kubectl logs` without -c reads the training container
        meta.setdefault("annotations", {}).setdefault(C.ANNOTATION_DEFAULT_CONTAINER, container_name)
    return pod


def _mapping(theirs: Mapping, ours: Mapping, path: str) -> dict:
    out = dict(theirs)
    for key, value in ours.items():
        if key in out and out[key] != value:
            raise WorkloadSpecError(f"{_where(f'{path}[{key!r}]')}={out[key]!r} contradicts the gang's {value!r}; "
                                    "remove it from the template")
        out[key] = value
    return out


def _keyed(theirs: list, ours: list, path: str, key: str) -> list:
    out = {x.get(key): x for x in theirs}
    for item in ours:
        name = item.get(key)
        if name in out and out[name] != item:
            raise WorkloadSpecError(f"{_where(f'{path}[{name!r}]')}: defined twice, differently (template and "
                                    "arguments); give it once")
        out[name] = item
    return list(out.values())


def _containers(theirs: list, ours: list) -> list:
    """The template's containers in its order (sidecars may come first: the training container is
    found by name, never by position), the one named like ours (KPO's `base`) merged under ours;
    ours first when the template does not name it."""
    mine = {c["name"]: c for c in ours}
    merged = [_container(c, mine.pop(c.get("name"))) if c.get("name") in mine else c for c in theirs]
    return list(mine.values()) + merged


def _container(theirs: dict, ours: dict) -> dict:
    name = ours["name"]
    out = dict(theirs)
    for key, value in ours.items():
        have = theirs.get(key)
        if have is None:
            out[key] = value
        elif key == "env":  # the rank env and env_vars may not be set differently by the template
            out[key] = _keyed(have, value, f"spec.containers[{name!r}].env", "name")
        elif key == "resources":
            out[key] = {part: _resources(have.get(part) or {}, (value or {}).get(part) or {}, name, part)
                        for part in ("requests", "limits") if have.get(part) or (value or {}).get(part)}
        elif key in ("envFrom", "volumeMounts", "ports"):
            out[key] = have + [x for x in value if x not in have]
        else:
            out[key] = value  # image, command, args: the operator's arguments win, as in KPO
    return out


def _resources(theirs: Mapping, ours: Mapping, name: str, part: str) -> dict:
    out = dict(theirs)
    for key in theirs:
        if key.startswith((C.RESOURCE_GPU, C.RESOURCE_MIG_PREFIX)) and ours.get(key) != theirs[key]:
            raise WorkloadSpecError(f"{_where(f'spec.containers[{name!r}].resources.{part}[{key!r}]')}: GPUs come "
                                    "from gpus_per_worker or mig_profile; remove it from the template")
    out.update(ours)
    return out


def _check_affinity(spec: dict, simple: bool) -> None:
    """A required node affinity that no node carrying the gang's nodeSelector can satisfy (e.g. the
    capacity type the scheduler chose) would leave the gang pending forever: an error instead."""
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    if simple and terms:
        rich = len(terms) > 1 or terms[0].get("matchFields") or any(
            e.get("operator") != "In" or len(e.get("values") or []) != 1 for e in terms[0].get("matchExpressions") or [])
        if rich:
            raise WorkloadSpecError("affinity: the airflow-gpu scheduler takes a required node affinity of one "
                                    "nodeSelectorTerm whose matchExpressions are operator In with one value (or "
                                    "node_selector); preferred affinity and pod (anti-)affinity are kept as given")
    selector = spec.get("nodeSelector") or {}
    if not terms or not selector:
        return
    reasons = []
    for term in terms:
        reason = _contradiction(term, selector)
        if reason is None:
            return
        reasons.append(reason)
    raise WorkloadSpecError(f"affinity: no nodeSelectorTerm can match the gang's nodes ({'; '.join(reasons)}); "
                            "drop the contradicting requirement")


def _contradiction(term: Mapping, selector: Mapping) -> str | None:
    for expr in term.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if key not in selector:
            continue
        have = selector[key]
        if (op == "In" and have not in values) or (op == "NotIn" and have in values) or op == "DoesNotExist":
            return f"{key} {op} {values} but nodeSelector {key}={have}"
    return None


__all__ = ["GANG_OWNED_SPEC", "apply_pod_template", "merge_templates"]

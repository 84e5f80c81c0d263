"""Defaults and validation of the workload APIs (apps/v1 Deployment and ReplicaSet, batch/v1 Job,
policy/v1 PodDisruptionBudget), with the real API server's defaults and 422 messages.

Called from admission (create and update); the controllers that act on these objects are in workloads.py.
"""

from __future__ import annotations

import math

from airflow_gpu import constants as C
from airflow_gpu.localcluster.registry.selectors import label_selector_object_matches

WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "Job", "PodDisruptionBudget")
JOB_MAX_BACKOFF = 2147483647


def int_or_percent(value, total: int, round_up: bool, field: str = "") -> int:
    """An intstr value (3 or "25%") resolved against total, as intstr.GetScaledValueFromIntOrPercent."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if text.endswith("%") and text[:-1].isdigit():
        scaled = int(text[:-1]) * total / 100
        return math.ceil(scaled) if round_up else math.floor(scaled)
    if text.isdigit():
        return int(text)
    raise ValueError(f"{field or 'value'}: {text!r} must be an integer or a percentage such as '25%'")


def _template_defaults(template: dict, restart_policy: str = "Always") -> None:
    spec = template.setdefault("spec", {})
    spec.setdefault("restartPolicy", restart_policy)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if isinstance(c, dict):
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            image = str(c.get("image") or "")
            c.setdefault("imagePullPolicy", "Always" if image.endswith(":latest") or ":" not in image else "IfNotPresent")
            c.setdefault("resources", {})
    template.setdefault("metadata", {})


def apply_defaults(kind: str, obj: dict) -> None:
    spec = obj.setdefault("spec", {})
    if kind == "Deployment":
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxUnavailable", "25%")
            rolling.setdefault("maxSurge", "25%")
        _template_defaults(spec.setdefault("template", {}))
    elif kind == "ReplicaSet":
        spec.setdefault("replicas", 1)
        _template_defaults(spec.setdefault("template", {}))
    elif kind == "Job":
        _job_defaults(obj)


def _job_defaults(job: dict) -> None:
    spec, meta = job["spec"], job["metadata"]
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", JOB_MAX_BACKOFF if spec.get("backoffLimitPerIndex") is not None else 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
    template = spec.setdefault("template", {})
    _template_defaults(template, restart_policy="")
    if not spec.get("manualSelector") and meta.get("uid"):
        ids = {C.LABEL_JOB_CONTROLLER_UID: meta["uid"], C.LABEL_JOB_NAME: meta["name"],
               C.LABEL_JOB_CONTROLLER_UID_LEGACY: meta["uid"], C.LABEL_JOB_NAME_LEGACY: meta["name"]}
        if not spec.get("selector"):
            spec["selector"] = {"matchLabels": {C.LABEL_JOB_CONTROLLER_UID: meta["uid"]}}
        template["metadata"]["labels"] = {**(template["metadata"].get("labels") or {}), **ids}


def causes(kind: str, obj: dict, old: dict | None) -> list[tuple[str, str, str]]:
    """Validation causes (field, reason, message) of a workload object; old: the stored one on update."""
    spec = obj.get("spec") or {}
    out: list[tuple[str, str, str]] = []
    if kind in ("Deployment", "ReplicaSet", "Job"):
        template = spec.get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        selector = spec.get("selector")
        if not selector:
            out.append(("spec.selector", "FieldValueRequired", "Required value"))
        elif not selector.get("matchLabels") and not selector.get("matchExpressions"):
            out.append(("spec.selector", "FieldValueInvalid",
                        "Invalid value: \"{}\": empty selector is invalid for deployment"))
        elif not label_selector_object_matches(selector, labels):
            out.append(("spec.template.metadata.labels", "FieldValueInvalid",
                        f"Invalid value: {labels}: `selector` does not match template `labels`"))
        if not (template.get("spec") or {}).get("containers"):
            out.append(("spec.template.spec.containers", "FieldValueRequired", "Required value"))
        for field in ("replicas", "parallelism", "completions", "backoffLimit", "minReadySeconds",
                      "revisionHistoryLimit"):
            value = spec.get(field)
            if value is not None and (not isinstance(value, int) or value < 0):
                out.append((f"spec.{field}", "FieldValueInvalid",
                            f"Invalid value: {value}: must be greater than or equal to 0"))
        if old is not None and kind in ("Deployment", "ReplicaSet") and \
                (old.get("spec") or {}).get("selector") != selector:
            out.append(("spec.selector", "FieldValueInvalid",
                        f"Invalid value: {selector}: field is immutable"))
    if kind == "Deployment":
        out += _deployment_causes(spec)
    if kind == "Job":
        out += _job_causes(spec, old)
    if kind == "PodDisruptionBudget":
        if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
            out.append(("spec", "FieldValueInvalid",
                        "Invalid value: ...: minAvailable and maxUnavailable cannot be both set"))
        for field in ("minAvailable", "maxUnavailable"):
            try:
                int_or_percent(spec.get(field), 100, True, f"spec.{field}")
            except ValueError as exc:
                out.append((f"spec.{field}", "FieldValueInvalid", f"Invalid value: {exc}"))
    return out


def _deployment_causes(spec: dict) -> list[tuple[str, str, str]]:
    out = []
    strategy = spec.get("strategy") or {}
    if strategy.get("type") not in ("RollingUpdate", "Recreate"):
        out.append(("spec.strategy.type", "FieldValueNotSupported",
                    f'Unsupported value: "{strategy.get("type")}": supported values: "Recreate", "RollingUpdate"'))
    if strategy.get("type") == "Recreate" and strategy.get("rollingUpdate"):
        out.append(("spec.strategy.rollingUpdate", "FieldValueForbidden",
                    "Forbidden: may not be specified when strategy `type` is 'Recreate'"))
    rolling = strategy.get("rollingUpdate") or {}
    values = {}
    for field in ("maxSurge", "maxUnavailable"):
        try:
            values[field] = int_or_percent(rolling.get(field), 100, True, field)
        except ValueError as exc:
            out.append((f"spec.strategy.rollingUpdate.{field}", "FieldValueInvalid", f"Invalid value: {exc}"))
    if strategy.get("type") == "RollingUpdate" and values.get("maxSurge") == 0 and values.get("maxUnavailable") == 0:
        out.append(("spec.strategy.rollingUpdate.maxUnavailable", "FieldValueInvalid",
                    "Invalid value: 0: may not be 0 when `maxSurge` is 0"))
    if str(rolling.get("maxUnavailable", "")).endswith("%") and values.get("maxUnavailable", 0) > 100:
        out.append(("spec.strategy.rollingUpdate.maxUnavailable", "FieldValueInvalid",
                    f"Invalid value: \"{rolling['maxUnavailable']}\": must not be greater than 100%"))
    return out


def _job_causes(spec: dict, old: dict | None) -> list[tuple[str, str, str]]:
    out = []
    template_spec = (spec.get("template") or {}).get("spec") or {}
    policy = template_spec.get("restartPolicy")
    if policy not in ("OnFailure", "Never"):
        out.append(("spec.template.spec.restartPolicy", "FieldValueNotSupported",
                    f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"'))
    if spec.get("completionMode") not in ("NonIndexed", "Indexed"):
        out.append(("spec.completionMode", "FieldValueNotSupported",
                    f'Unsupported value: "{spec.get("completionMode")}": supported values: "NonIndexed", "Indexed"'))
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        out.append(("spec.completions", "FieldValueRequired",
                    "Required value: when completion mode is Indexed"))
    failure_policy = spec.get("podFailurePolicy")
    if failure_policy:
        if policy != "Never":
            out.append(("spec.podFailurePolicy", "FieldValueInvalid",
                        "Invalid value: ...: only \"Never\" is supported when podFailurePolicy is specified"))
        for i, rule in enumerate(failure_policy.get("rules") or []):
            where = f"spec.podFailurePolicy.rules[{i}]"
            if rule.get("action") not in ("FailJob", "FailIndex", "Ignore", "Count"):
                out.append((f"{where}.action", "FieldValueNotSupported",
                            f'Unsupported value: "{rule.get("action")}": supported values: "Count", "FailIndex", '
                            '"FailJob", "Ignore"'))
            if bool(rule.get("onExitCodes")) == bool(rule.get("onPodConditions")):
                out.append((where, "FieldValueInvalid",
                            "Invalid value: specifying one of OnExitCodes and OnPodConditions is required"))
            codes = rule.get("onExitCodes") or {}
            if codes and codes.get("operator") not in ("In", "NotIn"):
                out.append((f"{where}.onExitCodes.operator", "FieldValueNotSupported",
                            f'Unsupported value: "{codes.get("operator")}": supported values: "In", "NotIn"'))
    if old is not None:
        old_spec = old.get("spec") or {}
        for field in ("template", "completions", "completionMode", "podFailurePolicy", "selector"):
            if field == "completions" and spec.get("completions") == spec.get("parallelism"):
                continue  # elastic indexed jobs may scale completions with parallelism
            if old_spec.get(field) != spec.get(field) and not (field == "template" and old_spec.get("suspend")):
                out.append((f"spec.{field}", "FieldValueInvalid", "Invalid value: ...: field is immutable"))
    return out

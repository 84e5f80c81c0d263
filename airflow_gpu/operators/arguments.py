"""GpuTrainingOperator's arguments as DAG authors write them for KubernetesPodOperator, turned into
the plain values WorkloadSpec takes, and the checks that run after rendering, before anything is
created.

- KPO types: env_vars as a dict or a list of V1EnvVar (valueFrom included), KPO `Secret` objects
  (env, envFrom, volume), V1ResourceRequirements, and the pod-level arguments with no WorkloadSpec
  field of their own (image_pull_secrets, affinity, security contexts, init containers, env_from),
  which become a pod template laid over the author's pod_template_file / pod_template_dict /
  full_pod_spec (kube/template.py merges it under every member; the gang's own fields win).
- No credential in a pod spec, by value: a rendered value that Airflow's secrets masker would
  redact (a connection's password or extra, a sensitive Variable) is refused. The error never
  contains the value.
- A deterministic argument error at run time fails the task without spending a retry
  (AirflowFailException), naming the argument.

Parsing stays cheap: nothing here imports the Kubernetes client or the cncf provider; objects of
those types are recognised by their attributes and converted by kube.wire.as_dict, which imports
the client only when such an object is there (so the author already imported it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpu.kube.wire import as_dict

# arguments that decide the pool, pool_slots and priority: known when the DAG file is parsed
POOL_ARGUMENTS = ("config_file", "team", "tier", "workers", "gpus_per_worker", "mig_profile", "gpu_products",
                  "pod_sets")
# arguments whose absence makes no other argument wrong: a mapped task whose expand() takes them from
# XCom (known at run time) has its other arguments checked at parse time without them
INDEPENDENT_ARGUMENTS = frozenset({"cmds", "arguments", "env_vars", "labels", "annotations", "env_from",
                                   "container_resources", "node_selector", "tolerations"})
# where a rendered value ends up in the pod spec, and so is checked against the secrets masker
VALUE_ARGUMENTS = ("env_vars", "cmds", "arguments", "labels", "annotations", "pod_template_dict",
                   "full_pod_spec", "init_containers", "env_from")
KPO_SECRET_FIX = ("a credential is never written into the pod spec (anyone who can read pods could read it). Put it "
                  "in a Kubernetes Secret and pass secrets=[{'secret': NAME, 'key': KEY, 'env': VAR}] (or KPO's "
                  "Secret('env', VAR, NAME, KEY)); README 'Credentials' shows how to create that Secret from an "
                  "Airflow connection")


class ArgumentProblem(ValueError):
    """(argument, message): what is wrong, without the offending value when it may be a secret."""

    def __init__(self, argument: str, message: str):
        self.argument = argument
        super().__init__(argument, message)

    @property
    def message(self) -> str:
        return self.args[1]


# -- KPO types -> plain values -------------------------------------------------------------------

def split_env(env_vars: Any) -> tuple[dict[str, str], list[dict]]:
    """env_vars (a dict, or a list of V1EnvVar / env dicts) -> (literal {name: value}, the entries
    with valueFrom as wire dicts). Literals stay a dict: they are templated, and checked by name and
    by value."""
    if env_vars is None:
        return {}, []
    if isinstance(env_vars, Mapping):
        return dict(env_vars), []
    if isinstance(env_vars, (str, bytes)):
        raise ArgumentProblem("env_vars", "give a dict {NAME: value} or a list of V1EnvVar")
    literal: dict[str, str] = {}
    sources: list[dict] = []
    for i, item in enumerate(env_vars):
        wire = as_dict(item)
        if not isinstance(wire, dict) or not wire.get("name"):
            raise ArgumentProblem("env_vars", f"item {i} is not a V1EnvVar or {{'name': ..., 'value': ...}}")
        if wire.get("valueFrom") is not None:
            sources.append({"name": wire["name"], "valueFrom": wire["valueFrom"]})
        else:
            literal[wire["name"]] = wire.get("value") or ""
    return literal, sources


def _is_kpo_secret(value: Any) -> bool:
    return all(hasattr(value, a) for a in ("deploy_type", "deploy_target", "secret", "key"))


def split_secrets(secrets: Any) -> tuple[list[Any], list[dict]]:
    """secrets (SecretEnv, names, dicts, or KPO `Secret`s) -> (what WorkloadSpec.secrets takes,
    KPO volume secrets as {'secret', 'path', 'items'})."""
    plain: list[Any] = []
    volumes: list[dict] = []
    for item in secrets or ():
        if not _is_kpo_secret(item):
            plain.append(item)
        elif item.deploy_type == "volume":
            if not item.deploy_target:
                raise ArgumentProblem("secrets", f"Secret('volume', ...) of {item.secret!r} needs a mount path")
            volumes.append({"secret": item.secret, "path": item.deploy_target,
                            "items": [as_dict(i) for i in (item.items or [])]})
        elif item.key is not None:
            plain.append({"secret": item.secret, "key": item.key, "env": item.deploy_target})
        else:
            plain.append({"secret": item.secret})
    return plain, volumes


def resources_dict(container_resources: Any) -> dict:
    """container_resources as a dict {'requests': {...}, 'limits': {...}} or a V1ResourceRequirements."""
    if container_resources is None:
        return {}
    wire = as_dict(container_resources)
    if not isinstance(wire, dict):
        raise ArgumentProblem("container_resources", "give {'requests': {...}, 'limits': {...}} or a "
                                                     "V1ResourceRequirements")
    return {k: dict(v) for k, v in wire.items() if v}


def image_pull_secrets_list(value: Any) -> list[dict]:
    """KPO's forms: 'a,b', a list of names, or V1LocalObjectReference objects."""
    if not value:
        return []
    if isinstance(value, str):
        return [{"name": s.strip()} for s in value.split(",") if s.strip()]
    return [{"name": v} if isinstance(v, str) else as_dict(v) for v in value]


def exit_codes(value: Any) -> tuple[int, ...]:
    """skip_on_exit_code: an int or a list of ints, as in KPO."""
    if value is None:
        return ()
    codes = (value,) if isinstance(value, int) else value
    if isinstance(codes, (str, bytes)) or not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
        raise ArgumentProblem("skip_on_exit_code", f"give an exit code or a list of exit codes (got {value!r})")
    return tuple(codes)


def skip_exception(outcome, codes: tuple[int, ...]):
    """AirflowSkipException when the gang failed and every non-zero exit code of its members is one of
    `codes` (a member killed because another failed shows its own code, e.g. 137, and prevents the skip)."""
    failed = {code for code in (outcome.exit_codes or {}).values() if code != 0}
    if outcome.status != "failed" or not codes or not failed or not failed <= set(codes):
        return None
    from airflow.sdk.exceptions import AirflowSkipException

    return AirflowSkipException(f"gang {outcome.gang} exited with {sorted(failed)} (skip_on_exit_code): skipped")


def kpo_pod_template(*, container_name: str, env_sources=(), env_from=(), secret_volumes=(), image_pull_secrets=(),
                     image_pull_policy=None, affinity=None, security_context=None,
                     container_security_context=None, init_containers=()) -> dict | None:
    """The KPO-style arguments with no WorkloadSpec field, as a Pod template (wire dict)."""
    spec: dict = {}
    container: dict = {"name": container_name}
    if env_sources:
        container["env"] = list(env_sources)
    if env_from:
        container["envFrom"] = [as_dict(e) for e in env_from]
    if image_pull_policy:
        container["imagePullPolicy"] = image_pull_policy
    if container_security_context:
        container["securityContext"] = as_dict(container_security_context)
    for s in secret_volumes:
        name = f"secret-{s['secret']}"[:63].rstrip("-.")  # deterministic: the same spec gives the same pods
        volume = {"name": name, "secret": {"secretName": s["secret"], **({"items": s["items"]} if s["items"] else {})}}
        spec.setdefault("volumes", []).append(volume)
        container.setdefault("volumeMounts", []).append({"name": name, "mountPath": s["path"], "readOnly": True})
    if image_pull_secrets:
        spec["imagePullSecrets"] = list(image_pull_secrets)
    if affinity:
        spec["affinity"] = as_dict(affinity)
    if security_context:
        spec["securityContext"] = as_dict(security_context)
    if init_containers:
        spec["initContainers"] = [as_dict(c) for c in init_containers]
    if len(container) > 1:
        spec["containers"] = [container]
    return {"spec": spec} if spec else None


def load_template(pod_template_file: str | None, pod_template_dict: Any, full_pod_spec: Any) -> dict | None:
    """KPO's three forms of a pod template (at most one), as a Pod wire dict."""
    given = [n for n, v in (("pod_template_file", pod_template_file), ("pod_template_dict", pod_template_dict),
                            ("full_pod_spec", full_pod_spec)) if v]
    if len(given) > 1:
        raise ArgumentProblem(given[1], f"give one of pod_template_file, pod_template_dict, full_pod_spec (got "
                                        f"{', '.join(given)})")
    if pod_template_file:
        import yaml

        try:
            with open(pod_template_file) as f:
                value = yaml.safe_load(f)
        except (OSError, yaml.YAMLError) as exc:
            raise ArgumentProblem("pod_template_file", f"cannot read {pod_template_file}: {exc}") from None
        name = "pod_template_file"
    elif pod_template_dict:
        value, name = pod_template_dict, "pod_template_dict"
    elif full_pod_spec:
        value, name = as_dict(full_pod_spec), "full_pod_spec"
    else:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("spec", {}), Mapping):
        raise ArgumentProblem(name, "must be a Pod: a mapping with metadata and spec")
    return dict(value)


# -- no credential by value ------------------------------------------------------------------------

def _maskers():
    """Airflow's secrets maskers: the task SDK's (a rendered `{{ conn.x.password }}` or sensitive
    Variable registers its value there) and airflow-core's (the same values in a dag.test() or an
    older runner). Two import paths are two instances, so both are asked."""
    maskers = []
    for module in ("airflow.sdk._shared.secrets_masker", "airflow._shared.secrets_masker"):
        try:
            maskers.append(__import__(module, fromlist=["_secrets_masker"])._secrets_masker())
        except (ImportError, AttributeError):
            continue
    return maskers


def _strings(value: Any, path: str):
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")
    elif value is not None and hasattr(value, "to_dict"):  # a Kubernetes client model
        yield from _strings(as_dict(value), path)


def credential_by_value(values: Mapping[str, Any]) -> ArgumentProblem | None:
    """The first value that Airflow's secrets masker would redact, as a problem naming where it is
    (never the value). `values`: {argument name: rendered value}."""
    maskers = [m for m in _maskers() if getattr(m, "replacer", None) is not None]
    if not maskers:
        return None
    for argument, value in values.items():
        for path, text in _strings(value, argument):
            if any(m.redact(text) != text for m in maskers):
                return ArgumentProblem(argument, f"{path} holds a value that Airflow masks as a secret (a connection's "
                                                 f"password or extra, or a sensitive Variable); {KPO_SECRET_FIX}")
    return None


def fail_without_retry(task_id: str, problem_or_error: Exception):
    """The non-retryable failure for a deterministic argument error found at run time."""
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(f"{problem_or_error} (an argument error: failing without spending a retry)")


__all__ = ["ArgumentProblem", "INDEPENDENT_ARGUMENTS", "POOL_ARGUMENTS", "VALUE_ARGUMENTS", "credential_by_value", "exit_codes",
           "fail_without_retry", "skip_exception",
           "image_pull_secrets_list", "kpo_pod_template", "load_template", "resources_dict", "split_env",
           "split_secrets"]

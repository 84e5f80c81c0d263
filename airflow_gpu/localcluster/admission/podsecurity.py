"""Pod Security admission (PodSecurity, enforce mode), as kube-apiserver's built-in plugin does it.

A namespace labelled `pod-security.kubernetes.io/enforce: baseline|restricted` refuses a pod that
breaks its level with 403 Forbidden and the message kube-apiserver writes:

    pods "x" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false
    (container "base" must set securityContext.allowPrivilegeEscalation=false), ...

Why the local cluster has it: a platform team's namespaces often enforce a level, and a DAG author's
first run must see the same refusal it would see on a real cluster (and the operator must fail it
without spending a retry: the same spec is refused again). Only `enforce` is modelled (not `warn` or
`audit`), at the latest version; Windows, AppArmor, SELinux and sysctl checks are left out (the local
cluster runs none of them).
"""

from __future__ import annotations

from airflow_gpu.localcluster import errors

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")
# the capabilities a container runtime grants by default: baseline allows adding only these
DEFAULT_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                  "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})
VOLUME_SOURCE_KEYS_IGNORED = frozenset({"name"})


def level_of(namespace: dict | None) -> str:
    """The namespace's enforced level ("privileged" when unlabelled, as the plugin's default)."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    return level if level in LEVELS else "restricted"  # an unknown value is treated as the strictest


def admit_pod(namespace: dict | None, pod: dict) -> None:
    """Refuse `pod` (403) if it breaks its namespace's enforced level."""
    level = level_of(namespace)
    if level == "privileged":
        return
    problems = baseline_problems(pod)
    if level == "restricted":
        problems += restricted_problems(pod)
    if problems:
        raise errors.forbidden("pods", pod["metadata"].get("name", ""),
                               f'violates PodSecurity "{level}:latest": ' + ", ".join(problems))


def _containers(spec: dict) -> list[dict]:
    return [c for field in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(field) or [] if isinstance(c, dict)]


def _ctx(obj: dict) -> dict:
    return obj.get("securityContext") or {}


def _quoted(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _check(problems: list[str], title: str, detail_parts: list[str]) -> None:
    if detail_parts:
        problems.append(f"{title} ({'; '.join(detail_parts)})")


def baseline_problems(pod: dict) -> list[str]:
    spec = pod.get("spec") or {}
    containers = _containers(spec)
    problems: list[str] = []
    hosts = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    _check(problems, "host namespaces", hosts)
    privileged = [c.get("name", "") for c in containers if _ctx(c).get("privileged")]
    _check(problems, "privileged",
           [f"container {_quoted(privileged)} must not set securityContext.privileged=true"] if privileged else [])
    added = [(c.get("name", ""), cap) for c in containers
             for cap in ((_ctx(c).get("capabilities") or {}).get("add") or []) if cap not in DEFAULT_CAPABILITIES]
    _check(problems, "non-default capabilities",
           [f'container "{name}" must not include "{cap}" in securityContext.capabilities.add' for name, cap in added])
    host_paths = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    _check(problems, "hostPath volumes", [f"volume {_quoted(host_paths)}"] if host_paths else [])
    ports = [(c.get("name", ""), p["hostPort"]) for c in containers for p in c.get("ports") or []
             if p.get("hostPort")]
    _check(problems, "hostPort", [f'container "{name}" uses hostPort {port}' for name, port in ports])
    unconfined = [c.get("name", "") for c in containers
                  if (_ctx(c).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if (_ctx(spec).get("seccompProfile") or {}).get("type") == "Unconfined":
        problems.append('seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined")')
    _check(problems, "seccompProfile",
           [f'container {_quoted(unconfined)} must not set securityContext.seccompProfile.type to "Unconfined"']
           if unconfined else [])
    return problems


def restricted_problems(pod: dict) -> list[str]:
    spec = pod.get("spec") or {}
    containers = _containers(spec)
    pod_ctx = _ctx(spec)
    problems: list[str] = []
    volumes = [(v.get("name", ""), kind) for v in spec.get("volumes") or []
               for kind in v if kind not in VOLUME_SOURCE_KEYS_IGNORED and kind not in RESTRICTED_VOLUMES
               and kind != "hostPath"]  # hostPath is baseline's
    _check(problems, "restricted volume types",
           [f'volume "{name}" uses restricted volume type "{kind}"' for name, kind in volumes])
    escalating = [c.get("name", "") for c in containers if _ctx(c).get("allowPrivilegeEscalation") is not False]
    _check(problems, "allowPrivilegeEscalation != false",
           [f"container {_quoted(escalating)} must set securityContext.allowPrivilegeEscalation=false"]
           if escalating else [])
    capability_issues = []
    for c in containers:
        caps = _ctx(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            capability_issues.append(f'container "{c.get("name", "")}" must set securityContext.capabilities.drop=["ALL"]')
        extra = [cap for cap in caps.get("add") or [] if cap != "NET_BIND_SERVICE"]
        if extra:
            capability_issues.append(f'container "{c.get("name", "")}" must not include {_quoted(extra)} in '
                                     "securityContext.capabilities.add")
    _check(problems, "unrestricted capabilities", capability_issues)
    non_root = [c.get("name", "") for c in containers
                if not _ctx(c).get("runAsNonRoot", pod_ctx.get("runAsNonRoot") is True)]
    _check(problems, "runAsNonRoot != true",
           [f"pod or container {_quoted(non_root)} must set securityContext.runAsNonRoot=true"] if non_root else [])
    root = [c.get("name", "") for c in containers if _ctx(c).get("runAsUser", pod_ctx.get("runAsUser")) == 0]
    _check(problems, "runAsUser=0",
           [f"pod or container {_quoted(root)} must not set runAsUser=0"] if root else [])
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    no_seccomp = [c.get("name", "") for c in containers
                  if (_ctx(c).get("seccompProfile") or {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost")]
    _check(problems, "seccompProfile",
           [f'pod or container {_quoted(no_seccomp)} must set securityContext.seccompProfile.type to '
            '"RuntimeDefault" or "Localhost"'] if no_seccomp else [])
    return problems

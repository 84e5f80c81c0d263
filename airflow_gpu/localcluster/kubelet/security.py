"""securityContext for containers that are local processes.

Honoured (the cluster runs as root, as in CI):
- runAsUser / runAsGroup / supplementalGroups / fsGroup: the command runs under `setpriv` with that uid,
  gid (0 when only runAsUser is given: a numeric user an image does not list gets group 0, as in
  containerd) and supplementary groups (fsGroup among them). emptyDir volumes are world-writable and
  volume files keep their modes (0644 by default), as on a node; volume ownership is not changed.
- runAsNonRoot: a container that would run as root does not start: CreateContainerConfigError with the
  kubelet's message, the pod stays Pending.
- readOnlyRootFilesystem: the container's copy-on-write root (and its working dir) is remounted
  read-only; volumes and /dev/shm stay writable.
- allowPrivilegeEscalation: false -> no_new_privs.
- capabilities: every container that is not privileged runs with containerd's default bounding set
  (DEFAULT_CAPS) plus `add` minus `drop`, named or not, and an empty inheritable set, as a node's
  runtime gives them: a root process has exactly those, a non-root one none. privileged: true keeps all
  the cluster's. Where the cluster cannot drop capabilities (no CAP_SETPCAP: not run as root) a
  container naming none keeps the cluster's, and one naming some does not start.
- seccompProfile RuntimeDefault (the container's, else the pod's): containerd's default profile
  (seccomp.py) for the container's capabilities, also for `kubectl exec`; Unconfined, no profile
  (the kubelet's default without SeccompDefault) and privileged containers run unconfined.
Accepted and not enforced (a local process has no such runtime): appArmorProfile RuntimeDefault /
Unconfined, seLinuxOptions (ignored, as by a node without SELinux), the change policies.
Refused at admission with 422 (nothing here could apply them): sysctls, Localhost seccomp and AppArmor
profiles, procMount Unmasked, Windows host processes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from airflow_gpu.localcluster.kubelet import seccomp

SETPRIV = shutil.which("setpriv")
MAX_ID = 2147483647
# containerd's default capabilities for a container (pkg/oci/spec.go defaultUnixCaps, v2.3.4)
DEFAULT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
                "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE")
CAP_SETPCAP = 8


@dataclass(frozen=True)
class Identity:
    """What a container process runs as. uid None: as the cluster (root); caps None: the cluster's."""
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] = ()
    read_only_root: bool = False
    no_new_privs: bool = False
    caps: tuple[str, ...] | None = None  # the bounding set
    caps_named: bool = False  # the container asked for capabilities: they must be set or it must not run
    seccomp: bool = False  # RuntimeDefault

    @property
    def changes_user(self) -> bool:
        return self.uid is not None or self.gid is not None or bool(self.groups)

    @property
    def needs_setpriv(self) -> bool:
        """What only setpriv, run by root, can give; default capabilities are dropped only where possible."""
        return self.changes_user or self.no_new_privs or self.caps_named

    def argv(self) -> list[str]:
        """The prefix of the command line: the seccomp loader, then `setpriv` (empty when nothing changes).
        Raises seccomp.SeccompUnavailable when the profile cannot be compiled."""
        out = []
        if self.seccomp:  # compiled for the container's bounding set, as containerd does
            out = seccomp.loader_argv(seccomp.runtime_default(DEFAULT_CAPS if self.caps is None else self.caps))
        if not (self.changes_user or self.no_new_privs or self.caps is not None):
            return out
        out.append(SETPRIV)
        if self.changes_user:
            out += [f"--reuid={self.uid if self.uid is not None else 0}",
                    f"--regid={self.gid if self.gid is not None else 0}"]
            out += [f"--groups={','.join(map(str, self.groups))}"] if self.groups else ["--clear-groups"]
        if self.no_new_privs:
            out.append("--no-new-privs")
        if self.caps is not None:
            # the runtime sets no inheritable capabilities (runc since CVE-2022-24769); a root process then
            # gets its bounding set at exec, a non-root one nothing
            out += [f"--bounding-set={','.join(['-all'] + [f'+{c.lower()}' for c in self.caps])}", "--inh-caps=-all"]
        return out + ["--"]


def can_drop_capabilities() -> bool:
    """Whether this process can narrow a child's bounding set (CAP_SETPCAP, setpriv)."""
    try:
        with open("/proc/self/status") as fh:
            effective = next(int(line.split()[1], 16) for line in fh if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return SETPRIV is not None and bool(effective & (1 << CAP_SETPCAP))


def _contexts(pod: dict, container: dict) -> tuple[dict, dict]:
    return (pod.get("spec") or {}).get("securityContext") or {}, container.get("securityContext") or {}


def identity(pod: dict, container: dict, can_drop_caps: bool = True) -> Identity:
    """The effective security context (the container's fields over the pod's) of one container.
    can_drop_caps: whether the cluster can give a container the default set (can_drop_capabilities)."""
    pod_sc, sc = _contexts(pod, container)
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    groups = [*(pod_sc.get("supplementalGroups") or [])]
    if pod_sc.get("fsGroup") is not None:
        groups.append(pod_sc["fsGroup"])
    privileged = bool(sc.get("privileged"))
    wanted = sc.get("capabilities") or {}
    named = not privileged and bool(wanted.get("add") or wanted.get("drop"))
    caps = None
    if named or (not privileged and can_drop_caps):
        drop = {_cap(c) for c in wanted.get("drop") or []}
        base = () if "ALL" in drop else DEFAULT_CAPS
        caps = tuple(dict.fromkeys(c for c in [*base, *map(_cap, wanted.get("add") or [])] if c not in drop))
    profile = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    return Identity(uid, gid, tuple(dict.fromkeys(groups)), bool(sc.get("readOnlyRootFilesystem")),
                    sc.get("allowPrivilegeEscalation") is False, caps, named,
                    profile == "RuntimeDefault" and not privileged)


def _cap(name: str) -> str:
    name = str(name).upper()
    return name[4:] if name.startswith("CAP_") else name


def non_root_problem(pod: dict, container: dict) -> str | None:
    """The kubelet's verifyRunAsNonRoot: why this container may not start, or None. Local images have
    no USER, so without runAsUser the process would run as the cluster's root."""
    pod_sc, sc = _contexts(pod, container)
    if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
        return None
    meta = pod["metadata"]
    where = f'(pod: "{meta["name"]}_{meta["namespace"]}({meta.get("uid", "")})", container: {container["name"]})'
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if uid == 0:
        return f"container's runAsUser breaks non-root policy {where}"
    if uid is None:
        return f"container has runAsNonRoot and image will run as root {where}"
    return None


def causes(spec: dict) -> list[tuple[str, str, str]]:
    """422 causes: API validation of the ids, and what a local process cannot be given."""
    out: list[tuple[str, str, str]] = []
    pod_sc = spec.get("securityContext") or {}
    out += _common_causes(pod_sc, "spec.securityContext")
    for i, group in enumerate(pod_sc.get("supplementalGroups") or []):
        out += _id_causes(group, f"spec.securityContext.supplementalGroups[{i}]")
    out += _id_causes(pod_sc.get("fsGroup"), "spec.securityContext.fsGroup")
    if pod_sc.get("sysctls"):
        out.append(("spec.securityContext.sysctls", "FieldValueForbidden",
                    "Forbidden: the local cluster runs containers as host processes and cannot set sysctls"))
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or []):
            where = f"spec.{field}[{i}].securityContext"
            sc = c.get("securityContext") or {}
            out += _common_causes(sc, where)
            if sc.get("procMount") not in (None, "Default"):
                out.append((f"{where}.procMount", "FieldValueForbidden",
                            f"Forbidden: the local cluster supports only procMount Default, not {sc['procMount']!r}"))
            if sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False:
                out.append((f"{where}", "FieldValueInvalid",
                            "Invalid value: \"\": cannot set `allowPrivilegeEscalation` to false and `privileged` to true"))
    return out


def _common_causes(sc: dict, where: str) -> list[tuple[str, str, str]]:
    out = _id_causes(sc.get("runAsUser"), f"{where}.runAsUser") + _id_causes(sc.get("runAsGroup"), f"{where}.runAsGroup")
    for field, kind in (("seccompProfile", "seccomp"), ("appArmorProfile", "AppArmor")):
        if (sc.get(field) or {}).get("type") == "Localhost":
            out.append((f"{where}.{field}.type", "FieldValueForbidden",
                        f"Forbidden: Localhost {kind} profiles cannot be loaded by the local cluster (its containers "
                        "are host processes); use RuntimeDefault or Unconfined"))
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append((f"{where}.windowsOptions.hostProcess", "FieldValueForbidden",
                    "Forbidden: the local cluster's nodes are Linux"))
    return out


def _id_causes(value, where: str) -> list[tuple[str, str, str]]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        return [(where, "FieldValueInvalid", f"Invalid value: {value}: must be between 0 and {MAX_ID}, inclusive")]
    return []

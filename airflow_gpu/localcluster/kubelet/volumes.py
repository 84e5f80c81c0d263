"""Pod volumes, as the kubelet's volume plugins make them: each volume is a directory under the pod's
directory (`<pod dir>/volumes/<name>`), written once when the pod starts, and bound by isolation.py at
the mountPath each container asked for.

Supported: emptyDir (medium Memory too: it is backed by the pod directory, so /dev/shm for torchrun
works and is shared by the pod's containers; sizeLimit is not enforced), configMap, secret, downwardAPI
and projected (serviceAccountToken, configMap, secret, downwardAPI). Refused at admission, with the
field and the alternative: hostPath (a container would write to the host) and every volume that needs
storage the local cluster does not have (persistentVolumeClaim, ephemeral, csi, nfs, ...).
configMap/secret contents are not refreshed while the pod runs (the real kubelet syncs them about
every minute); service-account tokens are issued for the whole lifetime the pod asked for.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path, PurePosixPath

from airflow_gpu.localcluster.kubelet.isolation import Bind
from airflow_gpu.localcluster.admission.serviceaccounts import INJECTED_TOKEN_SECONDS

SUPPORTED = ("emptyDir", "configMap", "secret", "downwardAPI", "projected")
NOT_SUPPORTED_HINT = "use emptyDir, configMap, secret, downwardAPI or projected"
REFUSED = {
    "hostPath": "hostPath volumes are refused by the local cluster: a container's writes would land on the host "
                "outside its pod directory",
    "persistentVolumeClaim": "the local cluster has no persistent volumes or storage classes",
}
DEFAULT_MODE = 0o644
# the API server extends the token of the admission-injected kube-api-access volume (3607 s) to a year
# (--service-account-extend-token-expiration); the kubelet here does not rotate tokens
EXTENDED_TOKEN_SECONDS = 365 * 24 * 3600


class VolumeError(Exception):
    """A volume that cannot be set up yet (a missing ConfigMap or Secret): the kubelet retries."""


def volume_causes(spec: dict) -> list[tuple[str, str, str]]:
    """Admission: every volume of a known, supported type; every mount naming a volume; sane paths."""
    causes = []
    names = set()
    for i, vol in enumerate(spec.get("volumes") or []):
        where = f"spec.volumes[{i}]"
        name = vol.get("name") if isinstance(vol, dict) else None
        if not name:
            causes.append((f"{where}.name", "FieldValueRequired", "Required value"))
            continue
        if name in names:
            causes.append((f"{where}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
        names.add(name)
        kinds = [k for k in vol if k != "name"]
        if len(kinds) != 1:
            causes.append((where, "FieldValueRequired" if not kinds else "FieldValueForbidden",
                           "must specify exactly one volume type" if kinds else "Required value: must specify a volume type"))
            continue
        kind = kinds[0]
        if kind not in SUPPORTED:
            why = REFUSED.get(kind, f"{kind} volumes are not supported by the local cluster")
            causes.append((f"{where}.{kind}", "FieldValueNotSupported",
                           f'Unsupported value: volume "{name}": {why}; {NOT_SUPPORTED_HINT}'))
        for j, path in enumerate(_item_paths(vol[kind] or {}, kind)):
            if path.startswith("/") or ".." in PurePosixPath(path).parts:
                causes.append((f"{where}.{kind}.items[{j}].path", "FieldValueInvalid",
                               f'Invalid value: "{path}": must be a relative path without \'..\''))
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or []):
            targets = set()
            for j, mount in enumerate((c.get("volumeMounts") if isinstance(c, dict) else None) or []):
                where = f"spec.{field}[{i}].volumeMounts[{j}]"
                if mount.get("name") not in names:
                    causes.append((f"{where}.name", "FieldValueNotFound", f'Not found: "{mount.get("name")}"'))
                path = mount.get("mountPath") or ""
                if not path:
                    causes.append((f"{where}.mountPath", "FieldValueRequired", "Required value"))
                elif not path.startswith("/"):
                    causes.append((f"{where}.mountPath", "FieldValueInvalid",
                                   f'Invalid value: "{path}": the local cluster needs an absolute mountPath'))
                elif path in targets:
                    causes.append((f"{where}.mountPath", "FieldValueInvalid", f'Invalid value: "{path}": must be unique'))
                targets.add(path)
                sub = mount.get("subPath") or ""
                if sub.startswith("/") or ".." in PurePosixPath(sub).parts:
                    causes.append((f"{where}.subPath", "FieldValueInvalid",
                                   f'Invalid value: "{sub}": must be a relative path without \'..\''))
    return causes


def _item_paths(source: dict, kind: str) -> list[str]:
    if kind == "projected":
        return [p for s in source.get("sources") or [] for k, v in s.items() for p in _item_paths(v or {}, k)]
    if kind == "serviceAccountToken":
        return [source.get("path", "")]
    return [item.get("path", "") for item in source.get("items") or []]


class PodVolumes:
    """Materialises a pod's volumes; `binds` maps them to a container's mounts."""

    def __init__(self, store, env, issue_token):
        self.store, self.env = store, env
        self.issue_token = issue_token  # (pod, audience, seconds) -> token

    def materialise(self, run, pod: dict) -> dict[str, Path]:
        base = run.workdir / "volumes"
        paths = {}
        for vol in pod["spec"].get("volumes") or []:
            target = base / vol["name"]
            kind = next(k for k in vol if k != "name")
            source = vol[kind] or {}
            if kind == "emptyDir":
                target.mkdir(parents=True, exist_ok=True)  # kept across container restarts, as a real emptyDir
                target.chmod(0o777)  # as the kubelet makes it: writable whatever user the containers run as
            else:
                files = self._files(kind, source, run, pod, vol["name"])
                if files is not None:
                    _write_all(target, files, source.get("defaultMode", DEFAULT_MODE))
                else:
                    target.mkdir(parents=True, exist_ok=True)  # optional and absent: an empty directory
            paths[vol["name"]] = target
        return paths

    def _files(self, kind: str, source: dict, run, pod: dict, volume: str) -> dict[str, tuple[bytes, int | None]] | None:
        ns = pod["metadata"]["namespace"]
        if kind in ("configMap", "secret"):
            data = self._object_data(ns, kind, source, volume)
            return None if data is None else _select(data, source.get("items"), kind, source, volume)
        if kind == "downwardAPI":
            return self._downward(source, run, pod)
        files: dict[str, tuple[bytes, int | None]] = {}
        for part in source.get("sources") or []:
            if "serviceAccountToken" in part:
                token_src = part["serviceAccountToken"]
                seconds = int(token_src.get("expirationSeconds") or 3600)
                if seconds == INJECTED_TOKEN_SECONDS:
                    seconds = EXTENDED_TOKEN_SECONDS
                token = self.issue_token(pod, token_src.get("audience") or None, seconds)
                files[token_src["path"]] = (token.encode(), None)
            for sub_kind in ("configMap", "secret"):
                if sub_kind in part:
                    data = self._object_data(ns, sub_kind, part[sub_kind], volume)
                    if data is not None:
                        files.update(_select(data, part[sub_kind].get("items"), sub_kind, part[sub_kind], volume))
            if "downwardAPI" in part:
                files.update(self._downward(part["downwardAPI"], run, pod))
        return files

    def _object_data(self, ns: str, kind: str, source: dict, volume: str) -> dict[str, bytes] | None:
        name = source.get("name") if kind == "configMap" else source.get("secretName", source.get("name"))
        obj = self.store.get("/configmaps" if kind == "configMap" else "/secrets", ns, name or "")
        if obj is None:
            if source.get("optional"):
                return None
            raise VolumeError(f'MountVolume.SetUp failed for volume "{volume}" : {kind.lower()} "{name}" not found')
        if kind == "configMap":
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        else:
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
            data.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
        return data

    def _downward(self, source: dict, run, pod: dict) -> dict[str, tuple[bytes, int | None]]:
        first = next(iter(run.containers.values()))
        return {item["path"]: ((self.env.value_from(item, run, first, pod) or "").encode(), item.get("mode"))
                for item in source.get("items") or []}

    @staticmethod
    def binds(container: dict, paths: dict[str, Path]) -> list[Bind]:
        out = []
        for mount in container.get("volumeMounts") or []:
            source = paths[mount["name"]]
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if not source.exists():  # as the kubelet: a missing subPath becomes a directory
                    source.mkdir(parents=True)
            out.append(Bind(str(source), mount["mountPath"], bool(mount.get("readOnly")), source.is_file()))
        # a parent is mounted before what is mounted inside it
        return sorted(out, key=lambda b: b.target.count("/"))


def _select(data: dict[str, bytes], items: list | None, kind: str, source: dict, volume: str):
    if not items:
        return {k: (v, None) for k, v in data.items()}
    out = {}
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise VolumeError(f'MountVolume.SetUp failed for volume "{volume}" : {kind.lower()} key "{item["key"]}" not found')
        out[item["path"]] = (data[item["key"]], item.get("mode"))
    return out


def _write_all(target: Path, files: dict[str, tuple[bytes, int | None]], default_mode: int) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for rel, (content, mode) in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        os.chmod(tmp, mode if mode is not None else default_mode)
        os.replace(tmp, path)

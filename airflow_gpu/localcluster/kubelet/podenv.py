"""A container's environment as the kubelet builds it: plain values with $(VAR) expansion, envFrom,
fieldRef (metadata, labels/annotations, status.podIP, spec.nodeName), resourceFieldRef (limits fall back
to the node's allocatable), configMap/secret keys; plus the device plugin's NVIDIA_VISIBLE_DEVICES and
KUBERNETES_SERVICE_HOST/PORT of the API server's in-cluster (TLS) endpoint. Pods never get the admin
kubeconfig: in-cluster clients authenticate with their service account's projected token."""

from __future__ import annotations

import base64
import os
import re
import sys
from pathlib import Path

from airflow_gpu.localcluster.podutil import quantity

VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
POD_KEY, NODE_KEY = "/pods", "/nodes"


class PodEnv:
    def __init__(self, store, api_address: str):
        self.store, self.api_address = store, api_address

    def build(self, run, c, pod: dict) -> dict[str, str]:
        env = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(run.workdir), "HOSTNAME": run.name, "LANG": os.environ.get("LANG", "C.UTF-8"),
            "KUBERNETES_SERVICE_HOST": self.api_address.split(":")[0],
            "KUBERNETES_SERVICE_PORT": self.api_address.split(":")[1],
        }
        if os.environ.get("PYTHONPATH"):  # the "image" is this project's Python: its import path as the cluster's
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if run.gpus:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(run.gpus)
        for src in c.spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            data = self.source_data(run.namespace, src.get("configMapRef"), src.get("secretRef"))
            for k, v in data.items():
                env[prefix + k] = v
        for item in c.spec.get("env") or []:
            name = item.get("name")
            if "value" in item:
                env[name] = VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(item.get("value") or ""))
            elif item.get("valueFrom"):
                value = self.value_from(item["valueFrom"], run, c, pod)
                if value is not None:
                    env[name] = value
        return env

    def source_data(self, ns: str, cm_ref: dict | None, secret_ref: dict | None) -> dict[str, str]:
        if cm_ref:
            cm = self.store.get("/configmaps", ns, cm_ref.get("name", ""))
            return dict((cm or {}).get("data") or {})
        if secret_ref:
            secret = self.store.get("/secrets", ns, secret_ref.get("name", ""))
            data = {k: base64.b64decode(v).decode(errors="replace") for k, v in ((secret or {}).get("data") or {}).items()}
            data.update((secret or {}).get("stringData") or {})
            return data
        return {}

    def value_from(self, source: dict, run, c, pod: dict) -> str | None:
        if "fieldRef" in source:
            path = source["fieldRef"].get("fieldPath", "")
            current = self.store.get(POD_KEY, run.namespace, run.name) or pod
            m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
            if m:
                return (current["metadata"].get(m.group(1)) or {}).get(m.group(2), "")
            if path in ("metadata.labels", "metadata.annotations"):
                items = current["metadata"].get(path.split(".")[1]) or {}
                return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
            simple = {"metadata.name": current["metadata"]["name"], "metadata.namespace": current["metadata"]["namespace"],
                      "metadata.uid": current["metadata"]["uid"], "spec.nodeName": current["spec"].get("nodeName", ""),
                      "spec.serviceAccountName": current["spec"].get("serviceAccountName", ""),
                      "status.podIP": (current.get("status") or {}).get("podIP", ""),
                      "status.hostIP": (current.get("status") or {}).get("hostIP", ""),
                      "status.podIPs": (current.get("status") or {}).get("podIP", ""),
                      "status.hostIPs": (current.get("status") or {}).get("hostIP", "")}
            return simple.get(path, "")
        if "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            target = run.containers.get(ref.get("containerName") or c.name, c)
            kind, _, res = ref.get("resource", "").partition(".")
            values = (target.spec.get("resources") or {}).get(kind) or {}
            if res not in values:
                if kind == "limits":  # unset limit -> node allocatable
                    node = self.store.get(NODE_KEY, "", run.node) or {}
                    values = (node.get("status") or {}).get("allocatable") or {}
                else:
                    return "0"
            divisor = quantity(ref.get("divisor") or "1")
            value = quantity(values.get(res, "0")) / divisor
            return str(int(-(-value // 1)))  # ceiling, as the kubelet does
        if "configMapKeyRef" in source or "secretKeyRef" in source:
            ref = source.get("configMapKeyRef") or source.get("secretKeyRef")
            data = self.source_data(run.namespace, source.get("configMapKeyRef") and ref, source.get("secretKeyRef") and ref)
            if ref.get("key") not in data and not ref.get("optional"):
                return ""
            return data.get(ref.get("key"))
        return None

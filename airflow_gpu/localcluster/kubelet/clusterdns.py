"""Cluster DNS for the local cluster's pods, as a kubelet-managed /etc/hosts.

A real cluster gives every pod a kubelet-managed /etc/hosts (localhost, the pod's own IP and
hostname) and resolves Service names through the cluster DNS (CoreDNS). Here pods are processes on
one machine, each with its own IP in 127.0.0.0/8 (nodeagent.PodIPs), so the kubelet writes each
pod's hosts file with the machine's entries (what the image's copy of /etc/hosts had: localhost and
the machine's name, which gethostname() answers in every pod), the pod's own line and the records the cluster DNS would serve for the
headless Services of the pod's namespace: for a pod with `hostname` and `subdomain` matching a
headless Service that selects it, `<hostname>.<subdomain>.<namespace>.svc.cluster.local` (and the
shorter forms a pod's DNS search path resolves: `<hostname>.<subdomain>.<namespace>.svc`,
`<hostname>.<subdomain>`), and the Service's own name for each such pod. A pod is listed once it has
an IP and until it ends, ready or not when the Service publishes not-ready addresses (as an
EndpointSlice lists it). The files are rewritten when pods or Services of the namespace change, so
a launcher that retries its lookups finds workers that started after it.

Limits: names of the pod's own namespace only; no ClusterIP Services (there is no Service proxy);
only containers confined with podIsolation: mountns see the file (it is their /etc/hosts, a
symlink to the file in the pod's directory, replaced atomically).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

POD_KEY = "/pods"
SERVICE_KEY = "/services"
CLUSTER_DOMAIN = "cluster.local"
HOSTS_FILE = "etc-hosts"  # in the pod's directory; the container's /etc/hosts links to it
FLUSH_DELAY = 0.05  # a burst of pod updates (a gang starting) is one rewrite
HEADER = ("# Kubernetes-managed hosts file (the local cluster's kubelet: also the cluster DNS records\n"
          "# of this namespace's headless Services).\n")


def _machine_hosts() -> str:
    """The machine's own /etc/hosts (what containers had before): localhost, and the machine's name,
    which gethostname() answers in every pod here (no UTS namespace)."""
    try:
        with open("/etc/hosts", encoding="utf-8", errors="replace") as fh:
            text = fh.read(65536)
    except OSError:
        text = ""
    return text if text.endswith("\n") or not text else text + "\n"


MACHINE_HOSTS = _machine_hosts() or "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _terminal(pod: Mapping) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _ready(pod: Mapping) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def service_records(namespace: str, services: Iterable[Mapping], pods: Iterable[Mapping]) -> list[tuple[str, str]]:
    """(ip, names) lines the cluster DNS serves for the headless Services of `namespace`."""
    pods = [p for p in pods if (p.get("status") or {}).get("podIP") and not _terminal(p)
            and not (p.get("metadata") or {}).get("deletionTimestamp")]
    lines = []
    for svc in sorted(services, key=lambda s: s["metadata"]["name"]):
        spec = svc.get("spec") or {}
        if spec.get("clusterIP") != "None":
            continue
        name = svc["metadata"]["name"]
        fqdn = f"{name}.{namespace}.svc"
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            if not _matches(spec.get("selector") or {}, (pod.get("metadata") or {}).get("labels") or {}):
                continue
            if not (spec.get("publishNotReadyAddresses") or _ready(pod)):
                continue
            ip = pod["status"]["podIP"]
            pspec = pod.get("spec") or {}
            if pspec.get("hostname") and pspec.get("subdomain") == name:
                host = pspec["hostname"]
                lines.append((ip, f"{host}.{fqdn}.{CLUSTER_DOMAIN} {host}.{fqdn} {host}.{name}"))
            lines.append((ip, f"{fqdn}.{CLUSTER_DOMAIN} {fqdn} {name}"))
    return lines


def own_line(pod: Mapping) -> str:
    """The kubelet's line for the pod itself: its IP, FQDN (with a subdomain) and hostname."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ip = (pod.get("status") or {}).get("podIP") or "127.0.0.1"
    host = spec.get("hostname") or meta.get("name", "")
    names = [f"{host}.{spec['subdomain']}.{meta.get('namespace')}.svc.{CLUSTER_DOMAIN}"] if spec.get("subdomain") else []
    return f"{ip}\t{' '.join(names + [host])}\n"


def hosts_text(pod: Mapping, records: list[tuple[str, str]]) -> str:
    return HEADER + MACHINE_HOSTS + own_line(pod) + "".join(f"{ip}\t{names}\n" for ip, names in records)


class ClusterHosts:
    """Keeps the hosts file of every running pod that has one up to date (store listener)."""

    def __init__(self, store) -> None:
        self.store = store
        self.files: dict[tuple[str, str], tuple[Path, str]] = {}  # (ns, pod) -> (file, text written)
        self._dirty: set[str] = set()
        self._scheduled = False
        store.listeners.append(self._on_event)

    def add(self, pod: Mapping, pod_dir: Path) -> Path:
        """Write the pod's hosts file now and keep it updated; returns its path."""
        meta = pod["metadata"]
        path = pod_dir / HOSTS_FILE
        self.files[(meta["namespace"], meta["name"])] = (path, "")
        self._write_namespace(meta["namespace"])
        return path

    def remove(self, namespace: str, name: str) -> None:
        self.files.pop((namespace, name), None)

    def _on_event(self, etype: str, key: str, obj: dict, old: dict | None) -> None:
        if key == SERVICE_KEY or (key == POD_KEY and (obj.get("spec") or {}).get("subdomain")):
            ns = obj["metadata"].get("namespace", "")
            if not any(k[0] == ns for k in self.files):
                return
            self._dirty.add(ns)
            if not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_later(FLUSH_DELAY, self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        dirty, self._dirty = self._dirty, set()
        for ns in dirty:
            self._write_namespace(ns)

    def _write_namespace(self, ns: str) -> None:
        records = service_records(ns, self.store.values(SERVICE_KEY, ns), self.store.values(POD_KEY, ns))
        for (pns, name), (path, written) in list(self.files.items()):
            if pns != ns:
                continue
            pod = self.store.get(POD_KEY, ns, name)
            if pod is None:
                continue
            text = hosts_text(pod, records)
            if text == written:
                continue
            tmp = path.with_name(path.name + ".tmp")
            try:
                tmp.write_text(text)
                os.chmod(tmp, 0o644)
                os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
            except OSError:
                continue  # the pod's directory is gone: it ended
            self.files[(pns, name)] = (path, text)

"""LocalCluster: API server + kubelets + default scheduler + controllers in one asyncio process.

`airflow-gpu cluster up` runs one in the foreground. Its state dir holds the store log (state kept
across restarts), each pod's working directory and logs, `kubeconfig` and `cluster.json` (pid, server,
token) which `airflow-gpu cluster interrupt` and `airflow_gpu.localcluster.control` read.

Two listeners serve the same API: the server of the kubeconfig (plain http without a token: the one
local user, admin; https with one) and the in-cluster endpoint, always https with the cluster's CA,
which pods reach through KUBERNETES_SERVICE_HOST/PORT with their service-account token (RBAC applies).
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import gc
import json
import logging
import math
import os
import resource
import shutil
import socket
from pathlib import Path

import uvicorn
import yaml

from airflow_gpu import constants as C
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.kubelet import upgrades
from airflow_gpu.localcluster.admission.admission import share_pod_values
from airflow_gpu.localcluster.handlers.apiserver import APIServer
from airflow_gpu.localcluster.handlers.audit import AuditLog
from airflow_gpu.localcluster.controllers.controllers import Controllers
from airflow_gpu.localcluster.events import Recorder
from airflow_gpu.localcluster.faults import MODES, Faults
from airflow_gpu.localcluster.kubelet.kubelet import Kubelet
from airflow_gpu.localcluster.kubelet.nodelease import NodeHeartbeats
from airflow_gpu.localcluster.kubelet.nodeagent import node_status
from airflow_gpu.localcluster.registry.objects import ObjectAPI, deep_copy
from airflow_gpu.localcluster.kubelet.podstream import PodStreams
from airflow_gpu.localcluster.handlers.rbac import Access
from airflow_gpu.localcluster.registry.resources import CRD_KEY, Registry
from airflow_gpu.localcluster.controllers.scheduler import DefaultScheduler
from airflow_gpu.localcluster.kubelet.simkubelet import SimulatedKubelet
from airflow_gpu.localcluster.admission.serviceaccounts import TokenIssuer, namespace_created
from airflow_gpu.localcluster.spec import ClusterSpec, initial_nodes, node_manifest
from airflow_gpu.localcluster.registry.store import Store
from airflow_gpu.localcluster.handlers.tls import ensure_certificate
from airflow_gpu.localcluster.controllers.workloads import Workloads

log = logging.getLogger(__name__)
BUNDLED_CRDS = sorted((Path(__file__).parent / "crds").glob("*.yaml"))
NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
SYSTEM_PRIORITY_CLASSES = (("system-node-critical", 2000001000), ("system-cluster-critical", 2000000000))
CONTEXT = "airflow-gpu-local"


class StateDirBusy(RuntimeError):
    pass


class LocalCluster:
    def __init__(self, spec: ClusterSpec, state_dir: str | Path, port: int = 0, token: str | None = None,
                 bookmark_seconds: float = 5.0, fresh: bool = False, audit_log: str | Path | None = None,
                 fsync: bool = False, header_timeout: float = 10.0, max_connections: int | None = None):
        self.spec = spec
        # half-open and slow clients cannot hold the API server's fds (see upgrades.HttpProtocol)
        self.http_protocol = upgrades.http_protocol(header_timeout, max_connections or default_max_connections())
        self.state_dir = Path(state_dir).resolve()
        self.port = port
        self.token = token
        self.bookmark_seconds = bookmark_seconds
        self.fresh = fresh
        self.fsync = fsync
        self.audit_log = Path(audit_log) if audit_log else None
        self._server: uvicorn.Server | None = None
        self.tls: tuple[Path, Path] | None = None
        self._gc_task: asyncio.Task | None = None
        self._serve_task: asyncio.Task | None = None
        self._sock: socket.socket | None = None
        self._incluster_sock: socket.socket | None = None
        self.incluster_port = 0
        self._servers: list[tuple[uvicorn.Server, asyncio.Task]] = []
        self.stopped = asyncio.Event()

    @property
    def server_url(self) -> str:
        return f"{'https' if self.token else 'http'}://127.0.0.1:{self.port}"

    @property
    def incluster_url(self) -> str:
        return f"https://127.0.0.1:{self.incluster_port}"

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfig"

    # --- start / stop ------------------------------------------------------------------------
    async def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)  # the store log holds every Secret, cluster.json the token
        self._lock = open(self.state_dir / "lock", "a+")
        try:  # one cluster per state dir: two would interleave their writes to store.log
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            raise StateDirBusy(f"state dir {self.state_dir} is in use by another cluster (pid {self._lock.read().strip()}); "
                               "stop it or pass another --state-dir") from None
        self._lock.truncate(0)
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        if self.fresh:  # only now: the lock says no running cluster owns these files
            for name in ("store.log", "pods", "used-node-names"):
                target = self.state_dir / name
                if target.is_dir():
                    shutil.rmtree(target)
                else:
                    target.unlink(missing_ok=True)
        self.incluster_tls = ensure_certificate(self.state_dir / "tls")
        if self.token:
            self.tls = self.incluster_tls
        self._sock, self.port = _bind(self.port)
        self._incluster_sock, self.incluster_port = _bind(self.incluster_port)
        self.store = Store(self.state_dir, history_size=self.spec.watch_history, fsync=self.fsync,
                           share={"/pods": share_pod_values})
        restored = self.store.load()
        self.registry = Registry()
        self.registry.sync_crds(self.store.values(CRD_KEY))
        self.store.listeners.append(self._on_crd)
        self.objects = ObjectAPI(self.store, self.registry)
        self.events = Recorder(self.objects)
        ca_pem = self.incluster_tls[0].read_text()
        self.objects.on_created.append(
            lambda rt, obj: rt.key == "/namespaces" and namespace_created(self.objects, obj["metadata"]["name"], ca_pem))
        self.issuer = TokenIssuer(self.state_dir / "tls", self.store)
        self.access = Access(self.store, self.issuer, self.token, set() if self.token else {self.port})
        scale = self.spec.mode == "scale"
        self.kubelet = Kubelet(self.store, self.objects, self.events, self.state_dir, f"127.0.0.1:{self.incluster_port}",
                               self.spec.sim_default_seconds, "none" if scale else self.spec.pod_isolation,
                               self.issuer.issue_for_pod, run_pods=not scale)
        # scale mode: pods and nodes simulated as KWOK does (simkubelet.py), no per-node heartbeats
        self.sim_kubelet = SimulatedKubelet(self.objects, self.spec.sim_default_seconds) if scale else None
        self.controllers = Controllers(self.objects, self.events, self.spec.pod_gc_seconds, self.spec.event_ttl_seconds)
        self.scheduler = DefaultScheduler(self.objects, self.events)
        self.workloads = Workloads(self.objects, self.events)
        self.heartbeats = None if scale else NodeHeartbeats(
            self.objects, self.kubelet.unresponsive, self.spec.node_lease_seconds, self.spec.node_status_seconds)
        self.faults = Faults(self)
        self._bootstrap(restored)
        self.controllers.rebuild()
        for node in self.store.values("/nodes"):
            self.kubelet.devices.register(node)
        self._recover_pods(restored)
        (self.sim_kubelet or self.kubelet).resync()
        self.scheduler.start()
        self.scheduler._wake.set()
        self.controllers.start()
        self.workloads.resync()
        if self.heartbeats is not None:
            self.heartbeats.start()
        self.audit = AuditLog(self.audit_log) if self.audit_log else None
        self.streams = PodStreams(self.kubelet)
        self.api = APIServer(self.store, self.registry, self.objects, f"127.0.0.1:{self.port}", self.token,
                             self.kubelet.logs, self.control, self.bookmark_seconds, self.audit, self.streams,
                             self.access)
        await self._serve()
        if os.environ.get(C.ENV_CLUSTER_GC_FREEZE, "1") != "0":
            self._gc_task = asyncio.get_running_loop().create_task(self._gc_freezer())
        self._write_kubeconfig()

    @staticmethod
    async def _gc_freezer(every: float = 1.0, full_every: float = 300.0) -> None:
        """Keep the stored objects out of the cyclic GC: a full collection over 10,000 stored pods
        pauses the loop for ~50-100 ms (watch latency spikes). Stored objects are acyclic dicts, freed by
        reference counting even when frozen; a full collection still runs every few minutes for the rest."""
        loop = asyncio.get_running_loop()
        last_full = loop.time()
        while True:
            await asyncio.sleep(every)
            if loop.time() - last_full > full_every:
                gc.unfreeze()
                gc.collect()
                last_full = loop.time()
            gc.freeze()

    def _on_crd(self, etype: str, key: str, obj: dict, old: dict | None) -> None:
        if key == CRD_KEY:
            self.registry.sync_crds(self.store.values(CRD_KEY))

    def _bootstrap(self, restored: bool) -> None:
        ns_rt = self.registry.by_key("/namespaces")
        for name in NAMESPACES:
            if self.store.get("/namespaces", "", name) is None:
                self.objects.create(ns_rt, {"metadata": {"name": name}}, admit=False)
        if self.store.get("/services", "default", "kubernetes") is None:  # as every cluster has
            self.objects.create(self.registry.by_key("/services"), {
                "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "targetPort": self.port}]},
            }, "default", admit=False)
        pc_rt = self.registry.by_key("scheduling.k8s.io/priorityclasses")
        for name, value in SYSTEM_PRIORITY_CLASSES:
            if self.store.get(pc_rt.key, "", name) is None:
                self.objects.create(pc_rt, {"metadata": {"name": name}, "value": value,
                                            "description": "Used for system critical pods that must not be moved from their current node."},
                                    admit=False)
        ca_pem = self.incluster_tls[0].read_text()
        for ns in self.store.values("/namespaces"):  # state from before namespaces got them
            if not ns["metadata"].get("deletionTimestamp"):
                namespace_created(self.objects, ns["metadata"]["name"], ca_pem)
        self.access.bootstrap(self.objects)
        crd_rt = self.registry.by_key(CRD_KEY)
        for path in BUNDLED_CRDS + [Path(p) for p in self.spec.crds]:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition" and \
                        self.store.get(CRD_KEY, "", doc["metadata"]["name"]) is None:
                    self.objects.create(crd_rt, doc, admit=False)
        if not restored:
            node_rt = self.registry.by_key("/nodes")
            for manifest in initial_nodes(self.spec):
                self.add_node(manifest, node_rt)

    def add_node(self, manifest: dict, node_rt=None) -> dict:
        node_rt = node_rt or self.registry.by_key("/nodes")
        manifest["status"] = node_status(manifest)
        node = self.objects.create(node_rt, manifest, admit=False)
        self.events.record(node, "Normal", "RegisteredNode", f"Node {node['metadata']['name']} event: Registered Node "
                           f"{node['metadata']['name']} in Controller", "node-controller")
        return node

    def add_replacement_node(self, old_name: str) -> dict | None:
        pool_name = old_name.rsplit("-", 1)[0]
        pool = next((p for p in self.spec.pools if p.name == pool_name), None)
        if pool is None:
            return None
        # never reuse a name: pods still bound to the old node would look as if they ran on the new one
        used = self.state_dir / "used-node-names"
        used.mkdir(exist_ok=True)
        taken = {n["metadata"]["name"] for n in self.store.values("/nodes")}
        index = pool.count
        while f"{pool.name}-{index}" in taken or (used / f"{pool.name}-{index}").exists():
            index += 1
        (used / f"{pool.name}-{index}").touch()
        number = sum(p.count for p in self.spec.pools) + index
        return self.add_node(node_manifest(self.spec, pool, index, number))

    def _recover_pods(self, restored: bool) -> None:
        """After a cold restart the pod processes are gone: like a rebooted node, pods that must not
        restart (restartPolicy Never) end Failed; the others are started again by their kubelet."""
        if not restored:
            return
        for pod in self.store.values("/pods"):
            status = pod.get("status") or {}
            if pod["spec"].get("nodeName") and status.get("startTime") and status.get("phase") not in ("Succeeded", "Failed"):
                new = deep_copy(pod)
                if pod["spec"].get("restartPolicy") == "Never" or pod["metadata"].get("deletionTimestamp"):
                    new["status"].update(phase="Failed", reason="NodeRestart",
                                         message="the local cluster was restarted; the pod's processes were stopped")
                    self.objects.update_status("/pods", new)
                    if pod["metadata"].get("deletionTimestamp"):
                        self.store.delete("/pods", pod["metadata"]["namespace"], pod["metadata"]["name"], "pods")
                else:
                    new["status"] = {k: v for k, v in status.items() if k in ("conditions", "qosClass")}
                    new["status"]["phase"] = "Pending"
                    self.objects.update_status("/pods", new)

    async def _serve(self) -> None:
        self._servers = []
        for sock, port, tls in ((self._sock, self.port, self.tls), (self._incluster_sock, self.incluster_port,
                                                                     self.incluster_tls)):
            config = uvicorn.Config(self.api, host="127.0.0.1", port=port, http=self.http_protocol, loop="none",
                                    lifespan="off", log_level="warning", access_log=False, timeout_keep_alive=120,
                                    ws=upgrades.WebSocketProtocol, ws_per_message_deflate=False,
                                    timeout_graceful_shutdown=2, backlog=2048,
                                    ssl_certfile=str(tls[0]) if tls else None, ssl_keyfile=str(tls[1]) if tls else None)
            server = uvicorn.Server(config)
            task = asyncio.get_running_loop().create_task(server._serve(sockets=[sock]))
            self._servers.append((server, task))
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        self._server, self._serve_task = self._servers[0]

    async def _stop_serving(self) -> None:
        if self._server is None:
            return
        self.store.close_watchers()
        for server, _ in self._servers:
            server.should_exit = True
        for _, task in self._servers:
            try:
                await asyncio.wait_for(task, 5)
            except (asyncio.TimeoutError, Exception):
                pass
        self._server = None
        self._servers = []

    async def restart_apiserver(self, down_seconds: float = 0.5) -> None:
        """Stop serving, drop the in-memory state, reload it from the state dir, serve again on the
        same port. Watches end (clients re-watch from their last resourceVersion); pods keep running."""
        await self._stop_serving()
        await asyncio.sleep(down_seconds)
        self.store.load()
        self.registry.sync_crds(self.store.values(CRD_KEY))
        self.scheduler.resync()
        self.controllers.rebuild()
        self.workloads.resync()
        self._sock, _ = _bind(self.port)
        self._incluster_sock, _ = _bind(self.incluster_port)
        await self._serve()
        (self.sim_kubelet or self.kubelet).resync()

    async def stop(self) -> None:
        if self._gc_task is not None:
            self._gc_task.cancel()
        await self.scheduler.stop()
        self.controllers.stop()
        self.workloads.stop()
        if self.heartbeats is not None:
            self.heartbeats.stop()
        if getattr(self, "streams", None) is not None:
            self.streams.close()
        await self.kubelet.close()
        await self._stop_serving()
        for task in list(self.faults.tasks):
            task.cancel()
        self.store.close()
        if self.audit is not None:
            self.audit.close()
        (self.state_dir / "cluster.json").unlink(missing_ok=True)
        self.stopped.set()

    # --- control endpoint (faults from the CLI / Python) ------------------------------------------
    async def control(self, action: str, body) -> dict:
        """Faults asked for over POST /_localcluster/<action>: a body that is not an object, a field of
        the wrong type or range, an unknown field or node is a 400/422 Status naming it (never a 500)."""
        fields = CONTROL_FIELDS.get(action)
        if fields is None:
            raise errors.no_such_path()
        if not isinstance(body, dict):
            raise errors.bad_request(f"/_localcluster/{action}: the body must be a JSON object with the fields "
                                     f"{', '.join(fields)}, not {type(body).__name__}")
        unknown = sorted(set(body) - set(fields))
        if unknown:
            raise _control_invalid(action, unknown[0], f"unknown field; {action} takes {', '.join(fields)}")
        if action == "latency":
            self.api.latency = _seconds(body, action, "seconds", 0.0)
            return {"latency": self.api.latency}
        if action == "restart-apiserver":
            down = _seconds(body, action, "downSeconds", 0.5)
            asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(self.restart_apiserver(down)))
            return {"restarting": True, "downSeconds": down}
        node = body.get("node")
        if not isinstance(node, str) or not node:
            raise _control_invalid(action, "node", "required: the name of a node (a string)")
        if self.store.get("/nodes", "", node) is None:
            names = sorted(n["metadata"]["name"] for n in self.store.values("/nodes"))
            raise _control_invalid(action, "node", f'node "{node[:100]}" not found; nodes are {", ".join(names[:20])}'
                                   + (" ..." if len(names) > 20 else ""))
        if action == "interrupt":
            mode = body.get("mode", "eviction")
            if mode not in MODES:
                raise _control_invalid(action, "mode", f"must be one of {', '.join(MODES)}, not {str(mode)[:40]!r}")
            return self.faults.interrupt(node, _seconds(body, action, "notice", 120.0),
                                         _seconds(body, action, "replaceAfter", None), mode)
        if action == "not-ready":
            return self.faults.not_ready(node, _seconds(body, action, "seconds", None))
        return self.faults.ready(node)

    # --- files ---------------------------------------------------------------------------------
    def _write_kubeconfig(self) -> None:
        user = {"token": self.token} if self.token else {}
        cluster = {"server": self.server_url}
        if self.tls:
            cluster["certificate-authority-data"] = base64.b64encode(self.tls[0].read_bytes()).decode()
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": CONTEXT, "cluster": cluster}],
            "users": [{"name": CONTEXT, "user": user}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": "default"}}],
            "current-context": CONTEXT,
        }
        tmp = self.kubeconfig_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.kubeconfig_path)
        info = {"pid": os.getpid(), "server": self.server_url, "inClusterServer": self.incluster_url, "token": self.token,
                "kubeconfig": str(self.kubeconfig_path), "name": self.spec.name,
                "ca": str(self.tls[0]) if self.tls else None, "inClusterCA": str(self.incluster_tls[0])}
        tmp = self.state_dir / "cluster.json.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write(json.dumps(info, indent=2))
        os.replace(tmp, self.state_dir / "cluster.json")


def default_max_connections() -> int:
    """Per server (two: host and in-cluster): 4096, less where the fd limit would not hold both plus
    ~1,000 fds for the store, pod logs and processes."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(64, min(4096, (soft - 1024) // 2))


def _bind(port: int) -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock, sock.getsockname()[1]


# the fields each control action takes (see localcluster.control for the client side)
CONTROL_FIELDS = {"interrupt": ("node", "notice", "replaceAfter", "mode"), "not-ready": ("node", "seconds"),
                  "ready": ("node",), "restart-apiserver": ("downSeconds",), "latency": ("seconds",)}
MAX_CONTROL_SECONDS = 7 * 86400


def _control_invalid(action: str, field: str, message: str) -> errors.ApiError:
    return errors.invalid("LocalClusterControl", action, [(field, "FieldValueInvalid", message)])


def _seconds(body: dict, action: str, key: str, default: float | None) -> float | None:
    """A number of seconds in [0, a week]; null or absent gives the default."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_CONTROL_SECONDS:
        raise _control_invalid(action, key, f"must be a number of seconds from 0 to {MAX_CONTROL_SECONDS}, "
                                            f"not {json.dumps(value)[:40]}")
    return float(value)

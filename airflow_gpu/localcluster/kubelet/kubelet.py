"""Kubelet for every simulated node: runs bound pods as local processes and reports their status.

A container with a command is a subprocess in its own process group (so signals reach everything
it starts), in a working directory of its own under the state dir, with the pod's environment; its
stdout/stderr is its log. A container without a command is simulated: it "runs" for the seconds in
the ANNOTATION_SIM_DURATION annotation (or until the pod is deleted) and exits with
ANNOTATION_SIM_EXIT_CODE. Deletion follows the kubelet: SIGTERM, the grace period, SIGKILL.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from airflow_gpu import constants as C
from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.kubelet import seccomp, security
from airflow_gpu.localcluster.kubelet.containerlog import LogReader, LogWriter
from airflow_gpu.localcluster.events import Recorder
from airflow_gpu.localcluster.kubelet import isolation
from airflow_gpu.localcluster.kubelet.clusterdns import ClusterHosts
from airflow_gpu.localcluster.kubelet.isolation import ImageRoot, MountPlan, image_root, probe
from airflow_gpu.localcluster.kubelet.nodeagent import Devices, PodIPs, admit
from airflow_gpu.localcluster.registry.objects import ObjectAPI, deep_copy
from airflow_gpu.localcluster.kubelet.podenv import VAR_REF, PodEnv
from airflow_gpu.localcluster.podutil import is_terminal, now_iso, pod_requests, set_condition
from airflow_gpu.localcluster.registry.store import Store
from airflow_gpu.localcluster.admission.serviceaccounts import TOKEN_MOUNT_PATH
from airflow_gpu.localcluster.kubelet.volumes import PodVolumes, VolumeError

log = logging.getLogger(__name__)
POD_KEY = "/pods"
NODE_KEY = "/nodes"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
MOUNT_RETRY_SECONDS = 2.0
ISOLATION_FIX = ("run the cluster as root (it needs CAP_SYS_ADMIN for a private mount namespace), or set "
                 "podIsolation: none in the cluster spec to run pods on the host filesystem, unconfined")
_libc = ctypes.CDLL(None, use_errno=True)


def _no_tokens(pod, audience, seconds) -> str:
    raise VolumeError("MountVolume.SetUp failed: this kubelet has no token issuer for serviceAccountToken volumes")


TERMINATION_MESSAGE_MAX = 4096  # what a kubelet keeps of a container's termination message
HOST_BOUND = ("/dev/", "/proc/", "/sys/")  # bound from the host into the container's root: never read


def _termination_message_file(plan: MountPlan, spec: dict) -> Path | None:
    """The container's terminationMessagePath, as a kubelet provides it: an empty file there (its
    directories created) before the container starts, in the container's copy-on-write root."""
    path = spec.get("terminationMessagePath") or ""
    if not path.startswith("/") or path.startswith(HOST_BOUND) or ".." in path.split("/"):
        return None
    target = plan.rootfs / "upper" / path.lstrip("/")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(mode=0o666)
        os.chmod(target, 0o666)  # the container's user may not be root
    except OSError:
        return None
    return target


def _termination_message(path: Path | None) -> str | None:
    """The termination message: the file's first TERMINATION_MESSAGE_MAX bytes (None when empty)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read(TERMINATION_MESSAGE_MAX)
    except OSError:
        return None
    return data.decode("utf-8", "replace") or None


def _missing_executable(program: str, env: dict, plan: MountPlan) -> bool:
    """The container's root shows host directories at their paths, so the host tells which of them
    holds the program, except for a path inside a volume."""
    if not os.path.isabs(program):
        candidates = [os.path.join(d, program) for d in (env.get("PATH") or "").split(":") if d]
        return not any(os.access(p, os.X_OK) and not os.path.isdir(p) and plan.image.shows(p) for p in candidates)
    if any(program.startswith(b.target.rstrip("/") + "/") for b in plan.binds):
        return False
    return not (os.access(program, os.X_OK) and plan.image.shows(program))


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the cluster process dies, as when a node vanishes,
    so a crashed or killed cluster leaves no pod processes behind."""
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class ContainerRun:
    name: str
    spec: dict
    init: bool = False
    proc: asyncio.subprocess.Process | None = None
    log_path: Path | None = None
    restarts: int = 0
    running: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # simulated containers wait on this
    started_at: str | None = None
    finished_at: str | None = None
    reason: str | None = None  # terminated reason other than Completed/Error (StartError)
    message: str | None = None
    last_state: dict | None = None
    waiting: tuple[str, str] | None = None  # (reason, message) of a container that cannot be created


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    node: str
    workdir: Path
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    task: asyncio.Task | None = None
    terminating: bool = False
    terminate_grace: float = 30.0
    terminate_reason: tuple[str, str] | None = None  # (reason, message) of the pod when it ends
    terminated: asyncio.Event = field(default_factory=asyncio.Event)  # termination was asked for
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # every container has stopped
    gpus: list[str] = field(default_factory=list)
    finished: bool = False
    volume_paths: dict[str, Path] = field(default_factory=dict)  # volume name -> its directory


class Kubelet:
    """All nodes' kubelets in one object; per node it tracks responsiveness and device allocation."""

    def __init__(self, store: Store, objects: ObjectAPI, events: Recorder, state_dir: Path, api_address: str,
                 sim_default_seconds: float | None = None, isolation: str = "mountns", issue_token=None,
                 run_pods: bool = True):
        self.store, self.objects, self.events = store, objects, events
        self.state_dir = state_dir
        self.pods_dir = state_dir / "pods"
        self.api_address = api_address
        self.sim_default_seconds = sim_default_seconds
        self.env = PodEnv(store, api_address)
        self.volumes = PodVolumes(store, self.env, issue_token or _no_tokens)
        self.isolation = isolation
        # why containers cannot be confined here (None: they can); checked once, not per container
        self.isolation_problem: str | None = None
        self.image: ImageRoot | None = None  # what every container's root is made of (podIsolation: mountns)
        if isolation == "mountns":
            try:
                self.image = image_root(state_dir)
            except OSError as exc:
                self.isolation_problem = f"the container's root could not be composed: {exc}"
            else:
                self.isolation_problem = probe(state_dir, self.image)
        if self.isolation_problem:
            log.warning("kubelet: containers with a command will not start: %s; %s", self.isolation_problem, ISOLATION_FIX)
        # a container naming no capabilities gets the runtime's default set only where they can be dropped
        self.can_drop_caps = security.can_drop_capabilities()
        if not self.can_drop_caps:
            log.warning("kubelet: this process cannot drop capabilities (it needs CAP_SETPCAP and util-linux's "
                        "setpriv): containers naming none run with the cluster's, not the runtime's default set")
        self.runs: dict[str, PodRun] = {}  # by pod uid
        self.unresponsive: set[str] = set()  # nodes whose kubelet does not talk to the API (NotReady fault)
        self.devices = Devices()
        self._pending: set[tuple[str, str]] = set()
        self._closed = False
        self.pod_ips = PodIPs()
        # confined containers get a kubelet-managed /etc/hosts with the namespace's Service records
        self.hosts = ClusterHosts(store) if self.image is not None else None
        if run_pods:  # scale mode's SimulatedKubelet runs them instead
            store.listeners.append(self._on_event)

    # --- reconcile ---------------------------------------------------------------------------
    def _on_event(self, etype: str, key: str, obj: dict, old: dict | None) -> None:
        if key == NODE_KEY and etype == "ADDED":
            self.devices.register(obj)
        if key != POD_KEY or self._closed:
            return
        if etype == "DELETED":
            run = self.runs.get(obj["metadata"]["uid"])
            if run is not None and run.finished:
                self.runs.pop(run.uid, None)
            elif run is not None and not run.terminating:
                self._terminate(run, 0)  # force deletion: the kubelet kills what is left
            return
        node = (obj.get("spec") or {}).get("nodeName")
        if not node:
            return
        ident = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if ident not in self._pending:
            self._pending.add(ident)
            asyncio.get_running_loop().call_soon(self._sync, ident)

    def resync(self) -> None:
        for pod in self.store.values(POD_KEY):
            if (pod.get("spec") or {}).get("nodeName"):
                self._sync((pod["metadata"]["namespace"], pod["metadata"]["name"]))

    def _sync(self, ident: tuple[str, str]) -> None:
        self._pending.discard(ident)
        pod = self.store.get(POD_KEY, *ident)
        if pod is None or self._closed:
            return
        node = pod["spec"].get("nodeName")
        if node in self.unresponsive or self.store.get(NODE_KEY, "", node) is None:
            return
        uid = pod["metadata"]["uid"]
        run = self.runs.get(uid)
        deleting = pod["metadata"].get("deletionTimestamp")
        if deleting:
            grace = pod["metadata"].get("deletionGracePeriodSeconds", 0)
            if run is None or run.finished:
                self._finish_deletion(pod)
            elif not run.terminating or grace < run.terminate_grace:
                self._terminate(run, grace)
            return
        if run is None and not is_terminal(pod):
            self._start(pod)

    def _finish_deletion(self, pod: dict) -> None:
        meta = pod["metadata"]
        if meta.get("finalizers"):
            return
        try:
            self.store.delete(POD_KEY, meta["namespace"], meta["name"], "pods")
        except errors.ApiError:
            pass
        run = self.runs.pop(meta["uid"], None)
        if run is not None:
            self._release(run)

    # --- pod start -----------------------------------------------------------------------------
    def _start(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        node = self.store.get(NODE_KEY, "", spec["nodeName"])
        on_node = [self.store.get(POD_KEY, r.namespace, r.name) for r in self.runs.values()
                   if r.node == spec["nodeName"] and not r.finished]
        rejection = admit(pod, node, [p for p in on_node if p is not None])
        if rejection:
            reason, message = rejection
            new = deep_copy(pod)
            new["status"].update(phase="Failed", reason=reason, message=message)
            self.objects.update_status(POD_KEY, new)
            self.events.pod(pod, "Warning", reason, message)
            return
        workdir = self.pods_dir / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}"
        workdir.mkdir(parents=True, exist_ok=True)
        run = PodRun(meta["uid"], meta["namespace"], meta["name"], spec["nodeName"], workdir)
        for c in spec.get("initContainers") or []:
            run.containers[c["name"]] = ContainerRun(c["name"], c, init=True)
        for c in spec.get("containers") or []:
            run.containers[c["name"]] = ContainerRun(c["name"], c)
        run.gpus = self.devices.allocate(run.node, pod_requests(pod))
        self.runs[run.uid] = run
        run.task = asyncio.get_running_loop().create_task(self._run_pod(run, node))

    def _write(self, run: PodRun, mutate) -> dict | None:
        """Apply mutate(status, pod) to a fresh copy of the pod and store it (no await in between)."""
        pod = self.store.get(POD_KEY, run.namespace, run.name)
        if pod is None or pod["metadata"]["uid"] != run.uid:
            return None
        new = deep_copy(pod)
        new.setdefault("status", {})
        mutate(new["status"], new)
        if new["status"] != pod.get("status"):
            return self.objects.update_status(POD_KEY, new)
        return pod

    def _container_status(self, c: ContainerRun, pod: dict) -> dict:
        status = {"name": c.name, "image": c.spec.get("image", ""), "imageID": f"local://{c.spec.get('image', '')}",
                  "containerID": f"local://{pod['metadata']['uid'][:8]}-{c.name}-{c.restarts}",
                  "restartCount": c.restarts, "ready": c.running and not c.init, "started": c.running}
        if c.running:
            status["state"] = {"running": {"startedAt": c.started_at}}
        elif c.exit_code is not None:
            status["state"] = {"terminated": self._terminated_state(c)}
        elif c.waiting:
            status["state"] = {"waiting": {"reason": c.waiting[0], "message": c.waiting[1]}}
        else:
            status["state"] = {"waiting": {"reason": "PodInitializing" if not c.init else "ContainerCreating"}}
        if c.last_state:
            status["lastState"] = {"terminated": c.last_state}
        return status

    @staticmethod
    def _terminated_state(c: ContainerRun) -> dict:
        code = c.exit_code
        reason = c.reason or ("Completed" if code == 0 else "Error")
        state = {"exitCode": code, "reason": reason, "startedAt": c.started_at, "finishedAt": c.finished_at or now_iso(),
                 "containerID": f"local://{c.name}-{c.restarts}"}
        if c.message:
            state["message"] = c.message
        return state

    def _refresh_statuses(self, run: PodRun, extra=None) -> None:
        def mutate(status, pod):
            status["containerStatuses"] = [
                self._container_status(c, pod) for c in run.containers.values() if not c.init]
            inits = [self._container_status(c, pod) for c in run.containers.values() if c.init]
            if inits:
                status["initContainerStatuses"] = inits
            mains = [c for c in run.containers.values() if not c.init]
            all_ready = all(c.running for c in mains) and not run.terminating
            set_condition(status, "ContainersReady", "True" if all_ready else "False",
                          None if all_ready else "ContainersNotReady",
                          None if all_ready else f"containers with unready status: [{' '.join(c.name for c in mains if not c.running)}]")
            set_condition(status, "Ready", "True" if all_ready else "False",
                          None if all_ready else "ContainersNotReady",
                          None if all_ready else f"containers with unready status: [{' '.join(c.name for c in mains if not c.running)}]")
            if extra:
                extra(status, pod)
        self._write(run, mutate)

    async def _run_pod(self, run: PodRun, node: dict) -> None:
        try:
            await self._run_pod_inner(run, node)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("kubelet: pod %s/%s failed", run.namespace, run.name)
        finally:
            run.finished = True
            run.terminated.set()
            run.ended.set()
            self._release(run)
            if self.hosts is not None:
                self.hosts.remove(run.namespace, run.name)
            pod = self.store.get(POD_KEY, run.namespace, run.name)
            if pod is None or pod["metadata"]["uid"] != run.uid:
                self.runs.pop(run.uid, None)
            elif pod["metadata"].get("deletionTimestamp") and not self._closed and run.node not in self.unresponsive:
                self._finish_deletion(pod)

    async def _run_pod_inner(self, run: PodRun, node: dict) -> None:
        pod_ip = self.pod_ips.next(node)

        def started(status, pod):
            status.update(phase="Pending", hostIP="127.0.0.1", hostIPs=[{"ip": "127.0.0.1"}], podIP=pod_ip,
                          podIPs=[{"ip": pod_ip}], startTime=status.get("startTime") or now_iso())
            set_condition(status, "PodReadyToStartContainers", "True")
            set_condition(status, "PodScheduled", "True")
            has_init = any(c.init for c in run.containers.values())
            set_condition(status, "Initialized", "False" if has_init else "True",
                          "ContainersNotInitialized" if has_init else None,
                          "containers with incomplete status: [" + " ".join(c.name for c in run.containers.values() if c.init) + "]" if has_init else None)
        self._refresh_statuses(run, started)
        pod = self.store.get(POD_KEY, run.namespace, run.name)
        if pod is None:
            return
        if any(c.spec.get("command") or c.spec.get("args") for c in run.containers.values()):
            await self._mount_volumes(run, pod)  # simulated containers have no filesystem to mount into
        spec = pod["spec"]
        policy = spec.get("restartPolicy", "Always")
        deadline = spec.get("activeDeadlineSeconds")
        deadline_task = None
        if deadline:
            deadline_task = asyncio.get_running_loop().call_later(deadline, self._deadline, run)
        try:
            # init containers, one after the other
            for c in [c for c in run.containers.values() if c.init]:
                while True:
                    if run.terminating:
                        return await self._finish(run)
                    await self._run_container(run, c, pod)
                    if c.exit_code == 0 or run.terminating:
                        break
                    if policy == "Never":
                        return await self._finish(run)
                    c.last_state, c.exit_code = self._terminated_state(c), None
                    c.restarts += 1
                    await self._backoff(run, c)
            if run.terminating:
                return await self._finish(run)
            self._refresh_statuses(run, lambda s, p: set_condition(s, "Initialized", "True"))
            mains = [c for c in run.containers.values() if not c.init]
            await asyncio.gather(*(self._supervise(run, c, pod, policy) for c in mains))
            await self._finish(run)
        finally:
            if deadline_task is not None:
                deadline_task.cancel()

    async def _mount_volumes(self, run: PodRun, pod: dict) -> None:
        """Until every volume is ready (or the pod is deleted): a missing ConfigMap or Secret keeps the
        pod in ContainerCreating with FailedMount Events, as on a real node."""
        while not run.terminating:
            try:
                run.volume_paths = self.volumes.materialise(run, pod)
                return
            except VolumeError as exc:
                self.events.pod(pod, "Warning", "FailedMount", str(exc))
            try:
                await asyncio.wait_for(run.terminated.wait(), MOUNT_RETRY_SECONDS)
            except asyncio.TimeoutError:
                pass

    def _mount_plan(self, run: PodRun, c: ContainerRun, who: security.Identity) -> MountPlan:
        binds = PodVolumes.binds(c.spec, run.volume_paths)
        plan = MountPlan(run.workdir / ".rootfs" / f"{c.name}-{c.restarts}", run.workdir, self.image, run.workdir,
                         binds, shm_is_volume=any(b.target.rstrip("/") == "/dev/shm" for b in binds),
                         read_only_root=who.read_only_root)
        plan.prepare()
        self._link_hosts(run, plan)
        return plan

    def _link_hosts(self, run: PodRun, plan: MountPlan) -> None:
        """The container's /etc/hosts: a link to the pod's kubelet-managed hosts file (clusterdns.py)."""
        pod = self.store.get(POD_KEY, run.namespace, run.name)
        if self.hosts is None or pod is None:
            return
        target = self.hosts.add(pod, run.workdir)
        link = plan.rootfs / "upper" / "etc" / "hosts"
        try:
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(target)
        except OSError as exc:
            log.warning("kubelet: pod %s/%s gets the image's /etc/hosts: %s", run.namespace, run.name, exc)

    async def _config_error(self, run: PodRun, c: ContainerRun, pod: dict, message: str) -> None:
        """A container the kubelet will not create (CreateContainerConfigError): it waits, the pod stays
        Pending, until the pod is deleted."""
        c.waiting = ("CreateContainerConfigError", message)
        self.events.pod(pod, "Warning", "Failed", f"Error: {message}", field_path=f"spec.containers{{{c.name}}}")
        self._refresh_statuses(run)
        await run.terminated.wait()
        c.done.set()

    def _start_error(self, run: PodRun, c: ContainerRun, pod: dict, log: LogWriter, message: str) -> None:
        log.close()
        c.exit_code, c.reason = 128, "StartError"
        c.message = message
        c.finished_at = now_iso()
        c.done.set()
        self.events.pod(pod, "Warning", "Failed", f"Error: {c.message}", field_path=f"spec.containers{{{c.name}}}")
        self._refresh_statuses(run)

    async def _supervise(self, run: PodRun, c: ContainerRun, pod: dict, policy: str) -> None:
        while True:
            await self._run_container(run, c, pod)
            if run.terminating:
                return
            if policy == "Never" or (policy == "OnFailure" and c.exit_code == 0):
                return
            c.last_state = self._terminated_state(c)
            c.exit_code = None
            c.restarts += 1
            await self._backoff(run, c)
            if run.terminating:
                return

    async def _backoff(self, run: PodRun, c: ContainerRun) -> None:
        delay = min(10.0, 0.5 * 2 ** min(c.restarts, 5))

        def waiting(status, pod):
            for cs in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
                if cs["name"] == c.name:
                    cs["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                               "message": f"back-off {delay:.0f}s restarting failed container={c.name} pod={run.name}"}}
        self._refresh_statuses(run, waiting)
        try:
            await asyncio.wait_for(run.terminated.wait(), delay)
        except asyncio.TimeoutError:
            pass

    async def _run_container(self, run: PodRun, c: ContainerRun, pod: dict) -> None:
        c.done = asyncio.Event()
        c.stop = asyncio.Event()
        c.reason = c.message = None
        c.log_path = run.workdir / f"{c.name}.{c.restarts}.log"
        command = list(c.spec.get("command") or []) + list(c.spec.get("args") or [])
        env = self.env.build(run, c, pod)
        command = [VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(a)) for a in command]
        image = c.spec.get("image", "")
        self.events.pod(pod, "Normal", "Pulled", f'Container image "{image}" already present on machine',
                        field_path=f"spec.containers{{{c.name}}}")
        refused = security.non_root_problem(pod, c.spec)
        if refused:
            return await self._config_error(run, c, pod, refused)
        c.started_at = now_iso()
        log = LogWriter(c.log_path)
        pumps = []
        message_file = None
        if command:
            plan = None
            who = security.identity(pod, c.spec, self.can_drop_caps)
            if self.isolation_problem:
                return self._start_error(run, c, pod, log, "failed to create task for container: the container's "
                                         f"filesystem cannot be confined: {self.isolation_problem}; {ISOLATION_FIX}")
            if who.needs_setpriv and (security.SETPRIV is None or os.geteuid() != 0):
                return self._start_error(run, c, pod, log, "failed to create task for container: its securityContext "
                                         "(user, groups, capabilities or no_new_privs) needs the cluster to run as root "
                                         "with util-linux's setpriv")
            if self.isolation == "mountns":
                plan = self._mount_plan(run, c, who)
                message_file = _termination_message_file(plan, c.spec)
            elif [m for m in c.spec.get("volumeMounts") or [] if m.get("mountPath") != TOKEN_MOUNT_PATH] \
                    or who.read_only_root:
                # the injected service-account token alone is left out (nothing can show it at its path):
                # such a pod runs, without in-cluster credentials
                return self._start_error(run, c, pod, log, "failed to create task for container: volumeMounts and "
                                         "readOnlyRootFilesystem need podIsolation: mountns (with podIsolation: none "
                                         "the container sees the host's filesystem)")

            def child_setup():
                _die_with_parent()
                if plan is not None:
                    plan.apply()
            if plan is not None and _missing_executable(command[0], env, plan):
                # as the runtime's exec reports it (under dumb-init it would only be a failed exit)
                return self._start_error(run, c, pod, log, f'failed to create task for container: exec: '
                                                           f'"{command[0]}": executable file not found in $PATH')
            try:  # dumb-init, in the PID namespace, runs the seccomp loader, setpriv, then the command
                argv = who.argv() + command
            except seccomp.SeccompUnavailable as exc:
                return self._start_error(run, c, pod, log, f"failed to create task for container: seccomp "
                                                           f"profile RuntimeDefault: {exc}")
            argv = isolation.container_argv(argv) if plan is not None else argv
            try:
                c.proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=str(run.workdir), env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
                    preexec_fn=child_setup)
            except OSError as exc:
                return self._start_error(run, c, pod, log,
                                         f'failed to create task for container: exec: "{command[0]}": {exc.strerror}')
            except subprocess.SubprocessError:
                return self._start_error(run, c, pod, log, "failed to create task for container: setting up the "
                                         f"container's filesystem failed: {plan.setup_error() if plan else 'unknown error'}")
            loop = asyncio.get_running_loop()
            pumps = [loop.create_task(log.pump(c.proc.stdout, b"stdout")),
                     loop.create_task(log.pump(c.proc.stderr, b"stderr"))]
        else:
            log.write(b"stdout", f"simulated container {c.name} (image {image}) started".encode())
            c.proc = None
        self.events.pod(pod, "Normal", "Created", f"Created container {c.name}", field_path=f"spec.containers{{{c.name}}}")
        self.events.pod(pod, "Normal", "Started", f"Started container {c.name}", field_path=f"spec.containers{{{c.name}}}")
        c.running = True
        if run.terminating:  # deletion arrived while the container was starting
            self._signal(c, signal.SIGTERM if run.terminate_grace > 0 else signal.SIGKILL)
            asyncio.get_running_loop().create_task(self._kill_after(run, run.terminate_grace))

        def running(status, p):
            if not c.init:
                status["phase"] = "Running"
        self._refresh_statuses(run, running)
        if c.proc is not None:
            code = await c.proc.wait()
            c.exit_code = 128 - code if code < 0 else code  # killed by signal N -> 128+N
            c.message = _termination_message(message_file)
            # drain the pipes; a leftover grandchild holding them open does not keep the container alive
            _, left = await asyncio.wait(pumps, timeout=0.5)
            for task in left:
                task.cancel()
        else:
            annotations = pod["metadata"].get("annotations") or {}
            seconds = annotations.get(C.ANNOTATION_SIM_DURATION)
            seconds = float(seconds) if seconds not in (None, "") else self.sim_default_seconds
            try:
                await asyncio.wait_for(c.stop.wait(), seconds)
                c.exit_code = 128 + signal.SIGTERM
            except asyncio.TimeoutError:
                c.exit_code = int(annotations.get(C.ANNOTATION_SIM_EXIT_CODE, "0") or 0)
            log.write(b"stdout", f"simulated container {c.name} exited with code {c.exit_code}".encode())
        log.close()
        c.running = False
        c.finished_at = now_iso()
        c.done.set()
        self._refresh_statuses(run)

    def _deadline(self, run: PodRun) -> None:
        if not run.terminating and not run.finished:
            run.terminate_reason = ("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
            pod = self.store.get(POD_KEY, run.namespace, run.name)
            if pod is not None:
                self.events.pod(pod, "Normal", "DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
                self._terminate(run, pod["spec"].get("terminationGracePeriodSeconds", 30))

    # --- stopping ----------------------------------------------------------------------------
    def _terminate(self, run: PodRun, grace: float) -> None:
        """SIGTERM every container now, SIGKILL what is left after `grace` seconds."""
        run.terminate_grace = grace
        if run.terminating:
            asyncio.get_running_loop().create_task(self._kill_after(run, grace))
            return
        run.terminating = True
        run.terminated.set()
        pod = self.store.get(POD_KEY, run.namespace, run.name)
        for c in run.containers.values():
            if c.running:
                if pod is not None and grace > 0:
                    self.events.pod(pod, "Normal", "Killing", f"Stopping container {c.name}",
                                    field_path=f"spec.containers{{{c.name}}}")
                self._signal(c, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        asyncio.get_running_loop().create_task(self._kill_after(run, grace))

    async def _kill_after(self, run: PodRun, grace: float) -> None:
        await asyncio.sleep(max(grace, 0))
        for c in run.containers.values():
            if c.running:
                self._signal(c, signal.SIGKILL)

    @staticmethod
    def _signal(c: ContainerRun, sig: int) -> None:
        if c.proc is not None and c.proc.returncode is None:
            try:
                os.killpg(c.proc.pid, sig)
            except ProcessLookupError:
                pass
        elif c.proc is None:
            c.stop.set()

    async def _finish(self, run: PodRun) -> None:
        """Wait for every container, then set the pod's terminal phase."""
        for c in run.containers.values():
            if c.running:
                await c.done.wait()
        mains = [c for c in run.containers.values() if not c.init]
        succeeded = all(c.exit_code == 0 for c in mains) and not run.terminate_reason

        def final(status, pod):
            status["phase"] = "Succeeded" if succeeded else "Failed"
            if run.terminate_reason:
                status["reason"], status["message"] = run.terminate_reason
            for ctype in ("Ready", "ContainersReady"):
                set_condition(status, ctype, "False", "PodCompleted" if succeeded else "PodFailed")
        self._refresh_statuses(run, final)

    def _release(self, run: PodRun) -> None:
        self.devices.release(run.node, run.gpus)
        run.gpus = []

    def shutdown_node(self, node: str, grace_cap: float | None = None) -> list[PodRun]:
        """Graceful node shutdown: every pod is terminated and ends Failed/Terminated (pods stay)."""
        runs = [r for r in self.runs.values() if r.node == node and not r.finished]
        for run in runs:
            pod = self.store.get(POD_KEY, run.namespace, run.name)
            grace = (pod or {}).get("spec", {}).get("terminationGracePeriodSeconds", 30)
            if grace_cap is not None:
                grace = min(grace, grace_cap)
            run.terminate_reason = ("Terminated", SHUTDOWN_MESSAGE)
            self._terminate(run, grace)
        return runs

    def kill_node(self, node: str) -> None:
        """The machine is gone: SIGKILL everything still running there, no status is written."""
        for run in [r for r in self.runs.values() if r.node == node]:
            for c in run.containers.values():
                self._signal(c, signal.SIGKILL)
            if run.task is not None:
                run.task.cancel()
            self.runs.pop(run.uid, None)
        self.devices.forget(node)

    async def close(self, timeout: float = 5.0) -> None:
        """Cluster shutdown: SIGTERM every pod process, SIGKILL after `timeout`."""
        self._closed = True
        procs = [c for r in self.runs.values() for c in r.containers.values() if c.proc and c.proc.returncode is None]
        for c in procs:
            self._signal(c, signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + timeout
        for c in procs:
            left = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(c.proc.wait(), max(left, 0.01))
            except asyncio.TimeoutError:
                pass
        for c in procs:
            self._signal(c, signal.SIGKILL)
        for run in self.runs.values():
            if run.task is not None:
                run.task.cancel()

    def forget_pod_dirs(self) -> None:
        shutil.rmtree(self.pods_dir, ignore_errors=True)

    # --- logs --------------------------------------------------------------------------------
    async def logs(self, namespace: str, name: str, container: str, options: dict):
        pod = self.store.get(POD_KEY, namespace, name)
        run = self.runs.get(pod["metadata"]["uid"]) if pod else None
        c = run.containers.get(container) if run else None
        path = None
        if c is not None and c.log_path is not None:
            path = c.log_path
            if options.get("previous") in ("true", "1", "True"):
                path = run.workdir / f"{c.name}.{c.restarts - 1}.log"
        elif pod is not None and pod["spec"].get("nodeName"):
            workdir = self.pods_dir / namespace / f"{name}-{pod['metadata']['uid'][:8]}"
            logs = sorted(workdir.glob(f"{container}.*.log"), key=lambda p: int(p.name.split(".")[-2]))
            path = logs[-1] if logs else None
        if path is None or not path.exists():
            raise errors.bad_request(f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')
        follow = options.get("follow") in ("true", "1", "True")
        async for chunk in LogReader(path, options).stream(follow, lambda: c is None or c.done.is_set()):
            yield chunk

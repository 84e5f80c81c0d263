"""The local GPU cluster as a child process: `airflow-gpu cluster up` on a free port, stopped by PID.
Used by the tests' fixtures and by `make demo`; callers talk to it only through its kubeconfig."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from airflow_gpu import constants as C
from airflow_gpu.devtools.processes import ManagedProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SPEC = REPO_ROOT / "examples" / "cluster-small.yaml"


@dataclass
class KubeCluster:
    kubeconfig: Path
    server: str
    state_dir: Path
    process: ManagedProcess
    token: str | None = None
    ca_file: str | None = None  # set when the server speaks TLS (a token implies https)

    @property
    def pid(self) -> int:
        return self.process.pid

    def api_client(self):
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        return client.ApiClient(configuration)

    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client())

    def kubectl_env(self) -> dict[str, str]:
        home = self.state_dir / "kubectl-home"  # own discovery cache per cluster
        home.mkdir(exist_ok=True)
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(home)}

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess:
        result = subprocess.run(["kubectl", *args], capture_output=True, text=True, input=input,
                                env=self.kubectl_env(), timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
        return result

    def interrupt(self, node: str, notice: float = 1.0, replace_after: float | None = None, mode: str = "eviction") -> dict:
        from airflow_gpu.localcluster import control

        return control.interrupt(node, notice, replace_after, mode, kubeconfig=self.kubeconfig)

    def not_ready(self, node: str, seconds: float | None = None) -> dict:
        from airflow_gpu.localcluster import control

        return control.not_ready(node, seconds, kubeconfig=self.kubeconfig)

    def ready(self, node: str) -> dict:
        from airflow_gpu.localcluster import control

        return control.ready(node, kubeconfig=self.kubeconfig)

    def restart_apiserver(self, down_seconds: float = 0.3) -> None:
        from airflow_gpu.localcluster import control

        control.restart_apiserver(down_seconds, kubeconfig=self.kubeconfig)
        time.sleep(down_seconds + 0.1)
        self.wait_ready(20)

    def wait_ready(self, timeout: float = 30.0) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while True:
            try:
                if requests.get(f"{self.server}/readyz", verify=self.ca_file or True, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.server} not ready after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def audit_events(self) -> list[dict]:
        """The audit log (clusters started with audit=True): one dict per request, with verb and
        objectRef {apiGroup, resource, subresource, namespace, name}."""
        path = self.state_dir / "audit.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def log_tail(self, lines: int = 60) -> str:
        return self.process.log_tail(lines)


@contextmanager
def start_kube_cluster(tmp_dir: Path, spec: str | Path | dict | None = None, token: str | None = None,
                       bookmark_seconds: float = 1.0, timeout: float = 60.0,
                       env: dict[str, str] | None = None, audit: bool = False,
                       fsync: bool = False, launcher: tuple[str, ...] = (),
                       args: tuple[str, ...] = ()) -> Iterator[KubeCluster]:
    """Start `airflow-gpu cluster up` in tmp_dir; yields a KubeCluster; stops it (and its pods) by PID.
    fsync: `--fsync` (every answered write is fdatasync'ed first). launcher: a command line the cluster
    runs under (e.g. setpriv dropping a capability); it must exec the cluster so the PID is its.
    args: more `cluster up` flags (e.g. --header-timeout 1)."""
    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    if spec is None:
        spec_path = DEFAULT_SPEC
    elif isinstance(spec, dict):
        spec_path = tmp_dir / "cluster-spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec))
    else:
        spec_path = Path(spec)
    state_dir = tmp_dir / "state"
    for stale in ("cluster.json", "kubeconfig"):  # from an earlier run on the same state dir
        (state_dir / stale).unlink(missing_ok=True)
    # --port 0: the cluster binds a free port itself and writes it to cluster.json; a port picked
    # here and bound there could be taken in between by another test's server
    argv = [*launcher, sys.executable, "-m", "airflow_gpu", "cluster", "up", "--spec", str(spec_path), "--port", "0",
            "--state-dir", str(state_dir), "--bookmark-seconds", str(bookmark_seconds)]
    if audit:  # every request as an audit.k8s.io Event: KubeCluster.audit_events()
        argv += ["--audit-log", str(state_dir / "audit.log")]
    if fsync:
        argv.append("--fsync")
    argv += list(args)
    env = {**os.environ, **(env or {})}
    if token:
        env[C.ENV_CLUSTER_TOKEN] = token
    else:
        env.pop(C.ENV_CLUSTER_TOKEN, None)
    process = ManagedProcess("localcluster", argv, tmp_dir / "cluster.log", env=env, cwd=str(tmp_dir)).start()
    try:
        deadline = time.monotonic() + timeout
        info_path = state_dir / "cluster.json"
        while not (info_path.exists() and (state_dir / "kubeconfig").exists()):
            if not process.alive():
                raise RuntimeError(f"cluster up exited with {process.popen.returncode}:\n{process.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster did not start within {timeout:.0f}s:\n{process.log_tail()}")
            time.sleep(0.05)
        info = json.loads(info_path.read_text())
        cluster = KubeCluster(Path(info["kubeconfig"]), info["server"], state_dir, process, token, info.get("ca"))
        cluster.wait_ready(timeout)
        yield cluster
    finally:
        process.stop(timeout=15)

"""The local platform for your own DAGs (`airflow-gpu dev up --dags DIR`), and the one `make demo` runs on.

Everything on 127.0.0.1, every process started and stopped by PID: SeaweedFS (S3, auth on), the local
cluster, the GPU scheduler, Airflow on SQLite (api-server, scheduler, dag-processor, triggerer;
LocalExecutor) with the pools synced from the quota file, the `kubernetes_default` connection, per
team a bucket and the S3 credentials Secret in its namespace, and `[airflow_gpu]` settings. The
caller's `AIRFLOW__*` settings are kept (except the ones that wire the processes together); task
logs at INFO.

`dev up` stays in the foreground and writes `<workdir>/dev.json` (its PID, the UI URL and login, the
PIDs of what it started); Ctrl-C, SIGTERM or `airflow-gpu dev down` stop everything by PID.
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from airflow_gpu.devtools.processes import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED_CLUSTER = REPO_ROOT / "examples" / "cluster-seed.yaml"
SEED_QUOTAS = REPO_ROOT / "examples" / "seed-quotas.yaml"
S3_SECRET = "s3-credentials"
BUCKET = "airflow-gpu-dev-{team}"
STATE_FILE = "dev.json"
DEFAULT_WORKDIR = Path(".airflow-gpu-dev")


@dataclass
class Platform:
    s3: object
    cluster: object
    scheduler: object
    airflow: object
    config: object

    def pids(self) -> dict[str, int]:
        out = {"seaweedfs": self.s3.pid, "cluster": self.cluster.pid, "gpu-scheduler": self.scheduler.pid}
        out.update({f"airflow-{name}": p.pid for name, p in self.airflow.processes.items()})
        return out


def start_platform(stack: ExitStack, workdir: Path, dags: Path, quotas: Path = SEED_QUOTAS,
                   cluster_spec: Path = SEED_CLUSTER, say: Callable[[str], None] = print,
                   extra_env: dict[str, str] | None = None, keep_airflow_env: bool = True,
                   log_level: str = "INFO", bucket: str = BUCKET,
                   s3_endpoint: Callable[[Any], str] | None = None) -> Platform:
    """Start everything; each stop is registered on `stack` (closing it stops all by PID).
    `s3_endpoint(s3)`: the S3 endpoint the pods and the Airflow workers are given (default S3's own;
    the soak puts a proxy it can cut in front of it)."""
    import subprocess
    import sys

    from kubernetes import client

    from airflow_gpu.config import load_config
    from airflow_gpu.devtools.airflow_stack import AirflowStack
    from airflow_gpu.devtools.gangs import scheduler_process
    from airflow_gpu.devtools.kube import start_kube_cluster
    from airflow_gpu.devtools.seaweedfs import SeaweedFS, create_team_secrets

    def cli(*args: str, env: dict | None = None) -> str:
        return subprocess.run([sys.executable, "-m", "airflow_gpu", *args], capture_output=True, text=True,
                              timeout=120, check=True, env=env).stdout

    workdir, dags, quotas = Path(workdir).resolve(), Path(dags).resolve(), Path(quotas).resolve()
    s3 = stack.enter_context(SeaweedFS(root=workdir / "s3"))
    say(f"S3 (SeaweedFS) {s3.endpoint_url}, pid {s3.pid}")
    cluster = stack.enter_context(start_kube_cluster(workdir / "cluster", Path(cluster_spec).resolve()))
    say(f"local cluster {Path(cluster_spec).name}: kubeconfig {cluster.kubeconfig}, pid {cluster.pid}")
    config = load_config(quotas)
    cluster.kubectl("apply", "-f", "-", input=cli("pools", "render-k8s", "--config", str(quotas)))
    for team in config.teams:
        s3.add_team(team.name, bucket.format(team=team.name))
    endpoint = s3_endpoint(s3) if s3_endpoint is not None else s3.endpoint_url
    create_team_secrets(client.CoreV1Api(cluster.api_client()), s3,
                        {t.name: t.namespace for t in config.teams}, S3_SECRET, endpoint_url=endpoint)
    say(f"quotas of {quotas.name} applied; per team a bucket {bucket!r} and Secret {S3_SECRET!r} in its namespace")
    scheduler = scheduler_process(cluster.kubeconfig, workdir / "scheduler.log", config_path=quotas,
                                  identity="dev-scheduler").start()
    stack.callback(scheduler.stop)
    say(f"GPU scheduler pid {scheduler.pid}, log {workdir / 'scheduler.log'}")
    conn = json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(cluster.kubeconfig)}})
    airflow = AirflowStack(home=workdir / "airflow", dags_folder=dags, keep_airflow_env=keep_airflow_env,
                           log_level=log_level, extra_env={
                               **s3.env(),  # the platform's identity: workers read every team's status.json
                               "AWS_ENDPOINT_URL": endpoint,
                               "AIRFLOW_CONN_KUBERNETES_DEFAULT": conn,
                               "AIRFLOW__AIRFLOW_GPU__CONFIG_FILE": str(quotas),
                               "AIRFLOW__AIRFLOW_GPU__QUOTA_CONFIG": str(quotas),
                               "AIRFLOW__AIRFLOW_GPU__KUBECONFIG": str(cluster.kubeconfig),
                               **(extra_env or {})})
    airflow.migrate()
    cli("pools", "sync", "--config", str(quotas), env=airflow.env())
    stack.callback(airflow.stop)
    airflow.start(migrate=False)
    say(f"Airflow {airflow.base_url} ({', '.join(f'{n} {p.pid}' for n, p in airflow.processes.items())}), "
        f"DAGs from {dags}")
    return Platform(s3, cluster, scheduler, airflow, config)


def _stop_on_signal(signum, frame) -> None:
    raise KeyboardInterrupt  # like Ctrl-C: the ExitStack stops every process by PID


def up(dags: Path, workdir: Path = DEFAULT_WORKDIR, quotas: Path = SEED_QUOTAS,
       cluster_spec: Path = SEED_CLUSTER) -> int:
    """`airflow-gpu dev up`: start, print the UI and login, wait for Ctrl-C / SIGTERM / `dev down`."""
    workdir = Path(workdir).resolve()
    state = workdir / STATE_FILE
    if state.exists() and _alive(json.loads(state.read_text()).get("pid")):
        print(f"a dev platform already runs from {workdir} (pid {json.loads(state.read_text())['pid']}); "
              "`airflow-gpu dev down` first")
        return 1
    workdir.mkdir(parents=True, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # SIGINT too: ignored when started with `&`
        signal.signal(sig, _stop_on_signal)
    stack = ExitStack()
    try:
        with stack:
            stack.callback(lambda: state.unlink(missing_ok=True))
            platform = start_platform(stack, workdir, Path(dags), quotas, cluster_spec,
                                      say=lambda text: print(text, flush=True))
            af = platform.airflow
            state.write_text(json.dumps({"pid": os.getpid(), "ui": af.base_url, "username": af.username,
                                         "password": af.password, "kubeconfig": str(platform.cluster.kubeconfig),
                                         "pids": platform.pids()}, indent=2) + "\n")
            print(f"\nAirflow UI: {af.base_url}  (user {af.username}, password {af.password})\n"
                  f"kubectl: KUBECONFIG={platform.cluster.kubeconfig}\n"
                  f"Ctrl-C, `kill -TERM {os.getpid()}` or `airflow-gpu dev down --workdir {workdir}` stops it all.",
                  flush=True)
            while all(p.alive() for p in af.processes.values()) and platform.scheduler.alive():
                time.sleep(1)
            print("a component exited; stopping everything", flush=True)
            return 1
    except KeyboardInterrupt:
        print("stopped: every process was stopped by PID", flush=True)
        return 0


def down(workdir: Path = DEFAULT_WORKDIR, timeout: float = 120.0) -> int:
    """`airflow-gpu dev down`: SIGTERM the `dev up` process, wait until it and what it started are gone."""
    state = Path(workdir).resolve() / STATE_FILE
    if not state.exists():
        print(f"no dev platform in {Path(workdir).resolve()}")
        return 0
    info = json.loads(state.read_text())
    pid, children = info.get("pid"), list((info.get("pids") or {}).values())
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
    try:
        gone = wait_until(lambda: not any(_alive(p) for p in [pid, *children]), timeout=timeout,
                          what="the dev platform stopped")
    except TimeoutError:
        gone = False
    if not gone:
        for p in [*children, pid]:  # by PID, never by name
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    state.unlink(missing_ok=True)
    print("dev platform stopped" + ("" if gone else " (some processes needed SIGKILL)"))
    return 0


def _alive(pid) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True

"""Real Airflow components as separate child processes, started and stopped by PID.

`airflow standalone` orphans its children on SIGTERM, so each component is its own process group:
api-server, scheduler, dag-processor, triggerer. All of them share one JWT secret and API secret key
(the scheduler's task workers authenticate to the api-server's execution API with it), and
`execution_api_server_url` points at the chosen port. The simple auth manager gets one admin user
whose password is written before start, so a token is one `POST /auth/token` away.

    with AirflowStack(home=tmp, dags_folder=dags) as stack:   # migrates the DB, starts, waits healthy
        api = stack.api()                                       # authenticated REST v2 client
        ...

Command line (for demos): `python -m airflow_gpu.devtools.airflow_stack --home DIR --dags DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from airflow_gpu.airflow_api import AirflowApi, fetch_token
from airflow_gpu.devtools.processes import ManagedProcess, free_port, wait_for_http

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# settings that connect the components (DB, ports, secrets, users): never taken from the caller
_WIRING = frozenset({
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__API__HOST", "AIRFLOW__API__PORT", "AIRFLOW__API__BASE_URL", "AIRFLOW__API__SECRET_KEY",
    "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__EXECUTOR",
})
# monitor/health key of each component that heartbeats (the api-server answers the request itself)
_HEALTH_KEY = {"scheduler": "scheduler", "dag-processor": "dag_processor", "triggerer": "triggerer"}


@dataclass
class AirflowStack:
    home: Path
    dags_folder: Path
    db_url: str | None = None  # default: SQLite in `home`
    port: int = 0  # 0: a free port
    components: tuple[str, ...] = COMPONENTS
    extra_env: dict[str, str] = field(default_factory=dict)
    username: str = "admin"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    # more simple-auth-manager users: name -> "role" or "role:team1|team2" (multi_team); random passwords
    users: dict[str, str] = field(default_factory=dict)
    # the caller's AIRFLOW__* settings kept (dev up), except the ones that wire the processes together
    keep_airflow_env: bool = False
    log_level: str = "WARNING"
    processes: dict[str, ManagedProcess] = field(default_factory=dict, init=False)
    crashed: list[ManagedProcess] = field(default_factory=list, init=False)  # leaders killed, children alive

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        self.dags_folder = Path(self.dags_folder)
        self.port = self.port or free_port()
        self.db_url = self.db_url or f"sqlite:///{self.home / 'airflow.db'}"
        self._jwt_secret = secrets.token_urlsafe(32)
        self._secret_key = secrets.token_urlsafe(32)
        self.passwords = {self.username: self.password, **{u: secrets.token_urlsafe(12) for u in self.users}}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def passwords_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json"

    def env(self) -> dict[str, str]:
        """The environment every component (and `airflow` CLI calls against this stack) runs with."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                [f"{self.username}:admin"] + [f"{u}:{spec}" for u, spec in self.users.items()]),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.db_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__SECRET_KEY": self._secret_key,
            "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret,
            # new DAG files show up within seconds, not the default five minutes
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": self.log_level,
            # a loaded machine answers the task runners' execution API slowly: wait instead of failing a try
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
        })
        if self.keep_airflow_env:
            env.update({k: v for k, v in os.environ.items() if k.startswith("AIRFLOW__") and k not in _WIRING})
        env.update(self.extra_env)
        return env

    def airflow(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run an `airflow` CLI command against this stack's home and database."""
        result = subprocess.run([sys.executable, "-m", "airflow", *args], env=self.env(), capture_output=True,
                                text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return result

    def migrate(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.dags_folder.mkdir(parents=True, exist_ok=True)
        self.airflow("db", "migrate")

    def start(self, timeout: float = 180.0, migrate: bool = True) -> "AirflowStack":
        if migrate:
            self.migrate()
        self.passwords_file.write_text(json.dumps(self.passwords) + "\n")
        env = self.env()
        try:
            # the api-server first: task workers the scheduler starts report to its execution API at once
            # (a refused connection fails the try), and on a loaded machine it takes tens of seconds to listen
            ordered = sorted(self.components, key=lambda c: c != "api-server")
            for component in ordered:
                self._start_component(component, env)
                if component == "api-server":
                    self._raise_if_dead()
                    wait_for_http(f"{self.base_url}/api/v2/monitor/health", timeout=timeout)
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_component(self, component: str, env: dict[str, str]) -> None:
        argv = [sys.executable, "-m", "airflow", component]
        if component == "api-server":
            argv += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        self.processes[component] = ManagedProcess(
            component, argv, self.home / "logs" / f"{component}.log", env=env, cwd=str(self.home)).start()

    def crash_and_restart(self, component: str, timeout: float = 120.0, keep_children: bool = False) -> None:
        """kill -9 one component's leader (a crash: its children are reaped by the group kill), then start
        a fresh one and wait until the stack is healthy again (fault-injection tests). keep_children: the
        children live on (the scheduler's LocalExecutor workers finish their task, as workers of an
        executor that runs them apart from the scheduler would) and are stopped with the stack."""
        process = self.processes.pop(component)
        process.kill9()
        if keep_children:
            self.crashed.append(process)
        else:
            process.stop(timeout=5)
        self._start_component(component, self.env())
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 180.0) -> None:
        """Until the api-server answers and every started component heartbeats as healthy."""
        deadline = time.monotonic() + timeout
        if "api-server" in self.processes:
            self._raise_if_dead()
            wait_for_http(f"{self.base_url}/api/v2/monitor/health", timeout=timeout)
        wanted = [_HEALTH_KEY[c] for c in self.processes if c in _HEALTH_KEY]
        health: dict = {}
        while time.monotonic() < deadline:
            self._raise_if_dead()
            if "api-server" not in self.processes:
                return
            health = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
            if all((health.get(key) or {}).get("status") == "healthy" for key in wanted):
                return
            time.sleep(0.5)
        raise TimeoutError(f"Airflow components not healthy after {timeout:.0f}s: {health}\n{self._tails()}")

    def stop(self) -> dict[str, int | None]:
        """SIGTERM each component's process group by PID: the others together, then the api-server
        (task runners report their end to it while the scheduler shuts down)."""
        others = [c for c in self.processes if c != "api-server"]
        with ThreadPoolExecutor(max_workers=max(1, len(others))) as pool:
            codes = dict(zip(others, pool.map(lambda c: self.processes[c].stop(timeout=15), others)))
        if "api-server" in self.processes:
            codes["api-server"] = self.processes["api-server"].stop(timeout=15)
        self.processes.clear()
        for process in self.crashed:  # their process groups
            process.stop(timeout=5)
        self.crashed.clear()
        return codes

    def token(self, username: str | None = None) -> str:
        username = username or self.username
        return fetch_token(self.base_url, username, self.passwords[username])

    def api(self) -> AirflowApi:
        return AirflowApi(self.base_url, token=self.token())

    def _raise_if_dead(self) -> None:
        for name, process in self.processes.items():
            if not process.alive():
                raise RuntimeError(f"airflow {name} exited ({process.popen.returncode}):\n{process.log_tail()}")

    def _tails(self) -> str:
        return "\n".join(f"--- {name} ---\n{p.log_tail(15)}" for name, p in self.processes.items())

    def __enter__(self) -> "AirflowStack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run real Airflow components until interrupted.")
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--dags", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    stack = AirflowStack(home=args.home, dags_folder=args.dags, port=args.port).start()
    print(f"Airflow at {stack.base_url} (user {stack.username}, password {stack.password}); Ctrl-C stops it",
          flush=True)
    try:
        while all(p.alive() for p in stack.processes.values()):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""An MPI-style launcher and its workers, the shape of `dags/launcher_workers.py` (stdlib only):

    python -m airflow_gpu.checkpoint.examples.launcher_workers worker     # each GPU worker pod
    python -m airflow_gpu.checkpoint.examples.launcher_workers launcher   # the CPU-only launcher pod

Each worker listens on MASTER_PORT at its own pod address and answers the launcher with its rank,
world size and GPUs (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE); the launcher reaches every worker by its
Service name (AIRFLOW_GPU_HOSTS_WORKER: `<pod>.<gang>.<namespace>.svc`, the gang's headless
Service), retrying while names do not resolve yet and ports do not answer (workers start in any
order, as mpirun's ssh/exec of a real launcher retries), and writes what they said as the task's
result. Exit 1 when a worker stays unreachable past EXAMPLE_TIMEOUT seconds.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from airflow_gpu import constants as C
from airflow_gpu.checkpoint.result import write_result

TIMEOUT = float(os.environ.get("AIRFLOW_GPU_EXAMPLE_TIMEOUT", "120"))


def _say(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def worker() -> int:
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    port = int(os.environ[C.ENV_MASTER_PORT])
    address = socket.gethostbyname(host)  # its own pod IP (the pod's hosts file / the cluster DNS)
    with socket.create_server((address, port)) as server:
        server.settimeout(TIMEOUT)
        _say("listening", host=host, address=address, port=port)
        try:
            conn, peer = server.accept()
        except TimeoutError:
            _say("no launcher", seconds=TIMEOUT)
            return 1
        with conn:
            hello = conn.makefile("r").readline().strip()
            reply = {"rank": int(os.environ[C.ENV_RANK]), "world_size": int(os.environ[C.ENV_WORLD_SIZE]),
                     "gpus": int(os.environ[C.ENV_LOCAL_WORLD_SIZE]), "host": host}
            conn.sendall((json.dumps(reply) + "\n").encode())
            _say("answered", launcher=hello, peer=peer[0], **reply)
    return 0


def _ask(name: str, port: int, deadline: float) -> dict:
    """Connect to worker `name` (retrying until `deadline`) and return its answer."""
    last = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((name, port), timeout=5) as conn:
                conn.sendall(f"hello from {os.environ.get('HOSTNAME', 'launcher')}\n".encode())
                line = conn.makefile("r").readline()
                if line:
                    return json.loads(line)
                last = "closed without an answer"
        except OSError as exc:  # not resolvable yet, or not listening yet
            last = str(exc)
        time.sleep(0.5)
    raise TimeoutError(f"worker {name} unreachable for {TIMEOUT:.0f} s: {last}")


def launcher() -> int:
    names = [h for h in os.environ.get(C.ENV_HOSTS_PREFIX + "WORKER", "").split(",") if h]
    port = int(os.environ[C.ENV_MASTER_PORT])
    _say("launching", workers=names, port=port)
    deadline = time.monotonic() + TIMEOUT
    answers = []
    try:
        for name in names:
            answer = _ask(name, port, deadline)
            _say("worker answered", name=name, **answer)
            answers.append({"name": name, **answer})
    except TimeoutError as exc:
        _say("failed", reason=str(exc))
        return 1
    write_result({"workers": answers})
    _say("done", workers=len(answers))
    return 0


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role not in ("launcher", "worker"):
        sys.exit("usage: python -m airflow_gpu.checkpoint.examples.launcher_workers launcher|worker")
    sys.exit(launcher() if role == "launcher" else worker())

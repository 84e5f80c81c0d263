"""Drive a running local cluster's faults from Python (and from `airflow-gpu cluster interrupt`).

The cluster is found through a kubeconfig (its server URL and token), so this works with the
fixture's kubeconfig path, with `cluster up`'s printed path, or with $KUBECONFIG.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import yaml


class ControlError(RuntimeError):
    pass


def _server(kubeconfig: str | Path | None) -> tuple[str, str | None, ssl.SSLContext | None]:
    path = Path(kubeconfig or os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config")
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ControlError(f"cannot read kubeconfig {path}: {exc.strerror}; pass the path `cluster up` printed") from None
    current = config.get("current-context")
    context = next((c["context"] for c in config.get("contexts", []) if c["name"] == current), None)
    if context is None:
        raise ControlError(f"kubeconfig {path} has no current context")
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next((u.get("user") or {} for u in config.get("users", []) if u["name"] == context.get("user")), {})
    tls = None
    if cluster.get("certificate-authority-data"):
        tls = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return cluster["server"], user.get("token"), tls


def call(action: str, body: dict, kubeconfig: str | Path | None = None, timeout: float = 10.0) -> dict:
    server, token, tls = _server(kubeconfig)
    request = urllib.request.Request(f"{server}/_localcluster/{action}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=tls) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("message", "")
        except ValueError:
            message = ""
        raise ControlError(f"{action} failed: HTTP {exc.code} {message}") from None
    except urllib.error.URLError as exc:
        raise ControlError(f"no local cluster answers at {server} ({exc.reason}); is `airflow-gpu cluster up` running?") from None


def interrupt(node: str, notice: float = 120.0, replace_after: float | None = None, mode: str = "eviction",
              kubeconfig: str | Path | None = None) -> dict:
    """Spot-interrupt `node` (see localcluster.faults for the sequence). Returns the pods marked."""
    return call("interrupt", {"node": node, "notice": notice, "replaceAfter": replace_after, "mode": mode}, kubeconfig)


def not_ready(node: str, seconds: float | None = None, kubeconfig: str | Path | None = None) -> dict:
    """The node's kubelet stops reporting (for `seconds`, or until `ready`)."""
    return call("not-ready", {"node": node, "seconds": seconds}, kubeconfig)


def ready(node: str, kubeconfig: str | Path | None = None) -> dict:
    return call("ready", {"node": node}, kubeconfig)


def restart_apiserver(down_seconds: float = 0.5, kubeconfig: str | Path | None = None) -> dict:
    """Restart the API server in place: connections drop, state is reloaded from the state dir."""
    return call("restart-apiserver", {"downSeconds": down_seconds}, kubeconfig)


def latency(seconds: float, kubeconfig: str | Path | None = None) -> dict:
    """Every API request waits `seconds` before it is served (0 turns it off): a slow API server."""
    return call("latency", {"seconds": seconds}, kubeconfig)

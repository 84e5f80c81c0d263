"""An API client for a kubeconfig file (the official sync client): the UI's reads, the CLI, devtools."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config


def api_client(kubeconfig: str | Path, pool: int = 32) -> client.ApiClient:
    """A client for the kubeconfig's current context; `pool`: connections kept (parallel requests)."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)

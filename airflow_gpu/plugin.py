"""Airflow plugin registration. Kept import-light: the UI app is imported lazily by Airflow."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/airflow-gpu"  # the api-server mounts the app here (airflow_gpu.ui.app.URL_PREFIX)


def _fastapi_apps() -> list[dict]:
    try:
        from airflow_gpu.ui.app import app
    except ImportError:  # outside an api-server install (the in-container checkpoint library)
        return []
    return [{"app": app, "url_prefix": URL_PREFIX, "name": "airflow-gpu"}]


class AirflowGpuPlugin(AirflowPlugin):
    name = "airflow_gpu"
    fastapi_apps = _fastapi_apps()
    external_views = [{
        "name": "GPU queue",
        "href": f"{URL_PREFIX}/",
        "destination": "nav",
        "url_route": "gpu-queue",
        "category": "browse",
    }]

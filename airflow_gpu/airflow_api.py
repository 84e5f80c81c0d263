"""A small client for Airflow's REST API v2 (httpx, which Airflow itself ships).

Authentication: a bearer token, or a username and password exchanged for one at `POST /auth/token`
(simple auth manager and FAB both answer there). Used by the pool manager's REST backend, by code
running inside tasks (where ORM access is forbidden) and by the test harness.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx


class AirflowApiError(RuntimeError):
    def __init__(self, method: str, url: str, status: int | None, detail: str):
        self.status = status
        super().__init__(f"{method} {url} -> {status if status is not None else 'no answer'}: {detail}")


def fetch_token(base_url: str, username: str, password: str, timeout: float = 30.0) -> str:
    """POST /auth/token with a username and password; returns the access token (JWT)."""
    url = base_url.rstrip("/") + "/auth/token"
    try:
        response = httpx.post(url, json={"username": username, "password": password}, timeout=timeout)
    except httpx.HTTPError as exc:
        raise AirflowApiError("POST", url, None, str(exc)) from None
    if response.status_code not in (200, 201):
        raise AirflowApiError("POST", url, response.status_code, _detail(response))
    return response.json()["access_token"]


class AirflowApi:
    """Authenticated JSON calls against one Airflow API server."""

    def __init__(self, base_url: str, token: str | None = None, username: str | None = None,
                 password: str | None = None, timeout: float = 30.0):
        if not token and not (username and password):
            raise ValueError("give a token, or a username and password, for the Airflow API")
        self.base_url = base_url.rstrip("/")
        token = token or fetch_token(self.base_url, username, password, timeout)
        self._client = httpx.Client(
            base_url=self.base_url, timeout=timeout, headers={"Authorization": f"Bearer {token}"})

    def request(self, method: str, path: str, *, json: object = None, params: dict | None = None,
                ok: tuple[int, ...] = (200, 201, 204)) -> object:
        try:
            response = self._client.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise AirflowApiError(method, self.base_url + path, None, str(exc)) from None
        if response.status_code not in ok:
            raise AirflowApiError(method, self.base_url + path, response.status_code, _detail(response))
        return response.json() if response.content else None

    def paginate(self, path: str, key: str, page_size: int = 100) -> list[dict]:
        """Every item of a collection endpoint (`limit`/`offset` paging; the server caps `limit`)."""
        items: list[dict] = []
        while True:
            page = self.request("GET", path, params={"limit": page_size, "offset": len(items)})
            batch = page[key]
            items.extend(batch)
            if not batch or len(items) >= page.get("total_entries", 0):
                return items

    @staticmethod
    def quote(name: str) -> str:
        return quote(name, safe="")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "AirflowApi":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:500]

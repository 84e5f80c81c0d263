"""The plugin's FastAPI app, mounted by the api-server under URL_PREFIX. Every route needs an Airflow
user (401 without a token; FastAPI's generated docs and OpenAPI routes are off) with read access to pools (403 otherwise); with [core] multi_team on, a
user sees the rows of the teams whose pools they may read and the cluster totals, and asking for
another team's rows is 403."""

from __future__ import annotations

import time
from datetime import datetime
from importlib import resources

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_pool
from airflow_gpu.ui import service
from airflow_gpu.ui.queue import pool_parts

URL_PREFIX = "/airflow-gpu"
AUTH = [Depends(requires_access_pool("GET"))]

QUEUE = service.SharedQueue()  # one build serves every user for QUEUE_MAX_AGE s (generated_at says when)
# no generated /docs, /redoc, /openapi.json: FastAPI serves them outside the app's dependencies, so they
# would describe the API to anyone without a login (issue 32)
app = FastAPI(title="airflow-gpu", description="GPU queue, cluster picture and chargeback", dependencies=AUTH,
              docs_url=None, redoc_url=None, openapi_url=None)


def _teams(user, session) -> set[str] | None:
    """Teams whose rows `user` may see; None = every team (multi_team off, or access to every pool)."""
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return None
    pools = get_auth_manager().get_authorized_pools(user=user, method="GET", session=session)
    return {parts[0] for parts in map(pool_parts, pools) if parts}


def _check_team(team: str | None, allowed: set[str] | None) -> None:
    if team is not None and allowed is not None and team not in allowed:
        raise HTTPException(403, f"no access to team {team!r}'s GPU pools")


def _settings() -> service.Settings:
    try:
        return service.Settings.from_airflow()
    except ValueError as exc:
        raise HTTPException(500, str(exc))


def _epoch(value: str | None, default: float, name: str) -> float:
    if value is None:
        return default
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise HTTPException(422, f"{name}: not an ISO date or time (got {value!r}); e.g. 2026-12-01 or 2026-12-01T08:00:00+00:00")


@app.get("/", response_class=HTMLResponse)
def page(user: GetUserDep) -> str:
    return resources.files("airflow_gpu.ui").joinpath("static/index.html").read_text()


@app.get("/api/queue")
def get_queue(user: GetUserDep, session: SessionDep, team: str | None = None) -> Response:
    allowed = _teams(user, session)
    _check_team(team, allowed)
    want = {team} if team else allowed
    try:
        if want is None:  # the whole queue: serialised once per build
            return Response(QUEUE.get_json(session, _settings()), media_type="application/json")
        data = QUEUE.get(session, _settings())
    except service.NotConfigured as exc:
        raise HTTPException(503, str(exc))
    return Response(service.to_json(service.visible(data, want)), media_type="application/json")


def _report(user, session, since, until, policy, team) -> list[dict]:
    allowed = _teams(user, session)
    _check_team(team, allowed)
    now = time.time()
    lo, hi = _epoch(since, now - 30 * 86400, "since"), _epoch(until, now, "until")
    try:
        rows = service.chargeback(session, _settings(), lo, hi, policy)
    except service.NotConfigured as exc:
        raise HTTPException(503, str(exc))
    except ValueError as exc:
        raise HTTPException(422, str(exc))
    want = {team} if team else allowed
    return [r for r in rows if want is None or r["team"] in want]


@app.get("/api/chargeback")
def get_chargeback(user: GetUserDep, session: SessionDep, since: str | None = None, until: str | None = None,
                   policy: str | None = Query(None, description="platform | spot | on-demand"),
                   team: str | None = None) -> dict:
    return {"rows": _report(user, session, since, until, policy, team)}


@app.get("/api/chargeback.csv", response_class=PlainTextResponse)
def get_chargeback_csv(user: GetUserDep, session: SessionDep, since: str | None = None, until: str | None = None,
                       policy: str | None = None, team: str | None = None) -> PlainTextResponse:
    body = service.to_csv(_report(user, session, since, until, policy, team))
    return PlainTextResponse(body, media_type="text/csv",
                             headers={"Content-Disposition": 'attachment; filename="gpu-chargeback.csv"'})

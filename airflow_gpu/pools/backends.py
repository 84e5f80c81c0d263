"""Where pools live: the Airflow metadata database directly, or a remote Airflow over REST API v2.

Both backends read every pool, and apply a list of changes; the plan (what to change) is made in
pools/plan.py, so both backends behave the same. Airflow is imported only when a backend is used.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Protocol

from airflow_gpu.airflow_api import AirflowApi, AirflowApiError
from airflow_gpu.pools.plan import Change, PoolState


class PoolBackend(Protocol):
    def describe(self) -> str: ...
    def multi_team(self) -> bool: ...
    def team_names(self) -> set[str] | None: ...  # None: the backend cannot tell
    def list_pools(self) -> list[PoolState]: ...
    def apply(self, changes: list[Change]) -> None: ...


class PoolBackendError(RuntimeError):
    pass


class DatabaseNotInitialised(PoolBackendError):
    """The metadata database has no Airflow schema yet (a fresh AIRFLOW_HOME)."""


class DatabaseBackend:
    """Airflow's own ORM API (Pool.create_or_update_pool / delete_pool) in one transaction: a sync
    either applies every change or none. Needs AIRFLOW_HOME / sql_alchemy_conn of the target Airflow."""

    def __init__(self, multi_team: bool | None = None):
        from airflow import settings
        from airflow.configuration import conf

        self._settings = settings
        self._conf = conf
        enabled = conf.getboolean("core", "multi_team", fallback=False)
        if multi_team and not enabled:
            raise PoolBackendError("multi_team was asked for but [core] multi_team is off in this Airflow")
        self._multi_team = enabled if multi_team is None else multi_team

    def describe(self) -> str:
        url = self._settings.engine.url.render_as_string(hide_password=True)
        return f"Airflow database {url}"

    def multi_team(self) -> bool:
        return self._multi_team

    def team_names(self) -> set[str]:
        from airflow.models.team import Team

        with self._session() as session:
            return set(Team.get_all_team_names(session=session))

    def list_pools(self) -> list[PoolState]:
        from airflow.models.pool import Pool

        self._require_schema()
        with self._session() as session:
            stats = Pool.slots_stats(session=session)
            return [_state(p.pool, p.slots, p.description, p.include_deferred, p.team_name,
                           _in_use(stats.get(p.pool) or {}))
                    for p in Pool.get_pools(session=session)]

    def apply(self, changes: list[Change]) -> None:
        from airflow.models.pool import Pool

        with self._session() as session:
            # optimistic check inside the write transaction: a pool created or edited by someone else
            # since the plan was made (e.g. an unmanaged pool with a wanted name) is never overwritten
            now = {p.pool: p for p in Pool.get_pools(session=session)}
            for change in changes:
                row = now.get(change.name)
                state = row and _state(row.pool, row.slots, row.description, row.include_deferred, row.team_name)
                if state != change.old:
                    raise PoolBackendError(f"pool {change.name!r} changed while the sync was planned; "
                                           "nothing written, run the sync again")
            for change in changes:
                if change.action == "delete":
                    Pool.delete_pool(change.name, session=session)
                else:
                    new = change.new
                    Pool.create_or_update_pool(
                        new.name, new.slots, new.description, new.include_deferred,
                        team_name=new.team_name, session=session)

    def _require_schema(self) -> None:
        from sqlalchemy import inspect
        from sqlalchemy.exc import SQLAlchemyError

        try:
            present = inspect(self._settings.engine).has_table("slot_pool")
        except SQLAlchemyError as exc:
            raise PoolBackendError(f"cannot reach the {self.describe()}: {exc}") from None
        if not present:
            raise DatabaseNotInitialised(
                f"the {self.describe()} has no Airflow schema; run `airflow db migrate` first")

    @contextmanager
    def _session(self):
        from sqlalchemy.exc import OperationalError, ProgrammingError

        from airflow.utils.session import create_session

        try:
            with create_session() as session:  # commits on success, rolls back on any error
                yield session
        except (OperationalError, ProgrammingError) as exc:
            raise PoolBackendError(
                f"cannot use the {self.describe()}: {exc.orig}. Is it initialised? Run `airflow db migrate`."
            ) from None


class RestBackend:
    """A remote Airflow over REST API v2: GET /api/v2/pools (paged), POST, PATCH, DELETE per pool.

    PATCH /api/v2/pools/{name} is sent with the full body: the server requires `name` and
    `include_deferred` in it even for a partial update (PLATFORM.md). Changes go one request at a
    time, so unlike the database backend a failure midway leaves the earlier ones applied; the sync is
    idempotent, so running it again finishes the job."""

    def __init__(self, api_url: str, token: str | None = None, username: str | None = None,
                 password: str | None = None, multi_team: bool | None = None):
        self.api_url = api_url.rstrip("/")
        self._api = AirflowApi(self.api_url, token=token, username=username, password=password)
        self._multi_team = multi_team

    def describe(self) -> str:
        return f"Airflow REST API {self.api_url}"

    def multi_team(self) -> bool:
        if self._multi_team is None:
            # the UI config endpoint is the one place the server tells; any authenticated user may read it
            try:
                self._multi_team = bool(self._api.request("GET", "/ui/config").get("multi_team", False))
            except AirflowApiError:
                self._multi_team = False
        return self._multi_team

    def team_names(self) -> set[str] | None:
        try:
            return {t["name"] for t in self._api.paginate("/ui/teams", "teams")}
        except AirflowApiError:
            return None

    def list_pools(self) -> list[PoolState]:
        return [_state(p["name"], p["slots"], p.get("description"), p["include_deferred"], p.get("team_name"),
                       _in_use({k.removesuffix("_slots"): v for k, v in p.items() if k.endswith("_slots")}))
                for p in self._api.paginate("/api/v2/pools", "pools")]

    def apply(self, changes: list[Change]) -> None:
        for change in changes:
            if change.action == "delete":
                self._api.request("DELETE", f"/api/v2/pools/{AirflowApi.quote(change.name)}")
                continue
            body = {"name": change.new.name, "slots": change.new.slots,
                    "description": change.new.description, "include_deferred": change.new.include_deferred}
            if change.new.team_name is not None or (change.old and change.old.team_name is not None):
                body["team_name"] = change.new.team_name
            if change.action == "create":
                self._api.request("POST", "/api/v2/pools", json=body)
            else:
                self._api.request("PATCH", f"/api/v2/pools/{AirflowApi.quote(change.name)}", json=body)

    def close(self) -> None:
        self._api.close()


def _state(name, slots, description, include_deferred, team_name, in_use: int = 0) -> PoolState:
    return PoolState(name=name, slots=int(slots), description=description,
                     include_deferred=bool(include_deferred), team_name=team_name, in_use=in_use)


def _in_use(stats: dict) -> int:
    """Slots task instances hold or wait for in a pool: running, queued, scheduled, deferred."""
    return sum(int(stats.get(k) or 0) for k in ("running", "queued", "scheduled", "deferred"))

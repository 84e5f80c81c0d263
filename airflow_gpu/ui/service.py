"""What the plugin's routes and the CLI answer: the queue and the chargeback report, filtered to
what a user may see. Settings from Airflow's config section [airflow_gpu] (env
AIRFLOW__AIRFLOW_GPU__KUBECONFIG / __QUOTA_CONFIG / __LOSS_POLICY / __SCHEDULER_NAME /
__SCHEDULER_NAMESPACE). The queue is the scheduler's published one (one ConfigMap read per build)."""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from dataclasses import dataclass

from airflow_gpu import constants as C
from airflow_gpu.core.chargeback import POLICY_PLATFORM, charge, check_policy
from airflow_gpu.core.tiers import team_of_namespace
from airflow_gpu.ui import ledger, queue, sources

SECTION = "airflow_gpu"
CSV_FIELDS = ("team", "product", "capacity_type", "gpu_hours", "reference_gpu_hours", "lost_interruption_hours",
              "lost_preemption_hours", "lost_restart_hours", "cost")


class NotConfigured(RuntimeError):
    """A setting the view needs is missing; the message names it and the env var that sets it."""


@dataclass
class Settings:
    kubeconfig: str | None
    quota_config: str | None
    loss_policy: str = POLICY_PLATFORM
    base_url: str = ""
    # whose published queue is shown: the scheduler's name and its namespace (its --leader-elect-namespace)
    scheduler_name: str = C.DEFAULT_SCHEDULER_NAME
    scheduler_namespace: str = C.DEFAULT_SCHEDULER_NAMESPACE

    @classmethod
    def from_airflow(cls) -> "Settings":
        from airflow.configuration import conf

        from airflow.exceptions import AirflowConfigException

        def option(name, read):  # a bad value is a ValueError naming the option
            try:
                return read()
            except (ValueError, AirflowConfigException) as exc:
                raise ValueError(f"[{SECTION}] {name}: {exc}") from None

        return cls(conf.get(SECTION, "kubeconfig", fallback=None) or None,
                   conf.get(SECTION, "quota_config", fallback=None) or None,
                   option("loss_policy", lambda: check_policy(conf.get(SECTION, "loss_policy", fallback=POLICY_PLATFORM))),
                   conf.get("api", "base_url", fallback="") or "",
                   conf.get(SECTION, "scheduler_name", fallback=None) or C.DEFAULT_SCHEDULER_NAME,
                   conf.get(SECTION, "scheduler_namespace", fallback=None) or C.DEFAULT_SCHEDULER_NAMESPACE)

    def config(self):
        if not self.quota_config:
            return None
        from airflow_gpu.config import load_config

        return load_config(self.quota_config)


def _kubeconfig(settings: Settings) -> str:
    if not settings.kubeconfig:
        raise NotConfigured("[airflow_gpu] kubeconfig is not set: the GPU queue needs the cluster's kubeconfig "
                          "(AIRFLOW__AIRFLOW_GPU__KUBECONFIG)")
    return settings.kubeconfig


def _view(settings: Settings):
    return sources.read_cluster(_kubeconfig(settings))


def read_published(settings: Settings) -> dict | None:
    """The scheduler's published queue (None: none published); NotConfigured when it cannot be read."""
    try:
        return sources.read_published(_kubeconfig(settings), settings.scheduler_namespace, settings.scheduler_name)
    except sources.Unreadable as exc:
        raise NotConfigured(str(exc)) from exc


def build_queue(session, settings: Settings, now: float | None = None, published=...) -> dict:
    """The queue: the scheduler's published one (default: read now) joined with Airflow's pools and
    task instances."""
    pools, tasks = sources.read_pools_and_tasks(session)
    if published is ...:
        published = read_published(settings)
    where = f"ConfigMap {settings.scheduler_namespace}/{C.QUEUE_CONFIGMAP_PREFIX}{settings.scheduler_name}"
    data = queue.build(queue.Inputs(pools, tasks, published, base_url=settings.base_url, source=where), now)
    data["warnings"] = data["warnings"] + _deployment_warnings()
    return data


def _deployment_warnings() -> list[str]:
    """What a platform team must know about this deployment's trust settings (shown above the queue)."""
    from airflow_gpu.policy import ownership

    warning = ownership().warning
    return [warning] if warning else []


QUEUE_MAX_AGE = 5.0  # seconds one build of the queue serves every request (the page is this fresh at worst)


def to_json(data: dict) -> bytes:
    """The answer as the API sends it (plain json: FastAPI's encoder walks 10,000s of values slowly)."""
    return json.dumps(data, separators=(",", ":"), default=_plain).encode()


def _plain(value):
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class SharedQueue:
    """The queue as last built, shared by every request for `max_age` seconds: it does not depend on the
    user (rows are filtered afterwards, `visible`). One build at a time; the others wait for it."""

    def __init__(self, max_age: float = QUEUE_MAX_AGE):
        self.max_age = max_age
        self._lock = threading.Lock()
        self._built: tuple[float, tuple, dict, bytes] | None = None  # (monotonic time, settings key, data, JSON)

    def get(self, session, settings: "Settings") -> dict:
        return self._get(session, settings)[2]

    def get_json(self, session, settings: "Settings") -> bytes:
        """The whole queue as JSON, serialised once per build."""
        return self._get(session, settings)[3]

    def _get(self, session, settings: "Settings") -> tuple:
        key = (settings.kubeconfig, settings.base_url, settings.scheduler_name, settings.scheduler_namespace)
        with self._lock:
            built = self._built
            if built is None or built[1] != key or time.monotonic() - built[0] > self.max_age:
                data = build_queue(session, settings)
                self._built = built = (time.monotonic(), key, data, to_json(data))
            return built


def visible(data: dict, teams: set[str] | None) -> dict:
    """Only the rows of `teams` (None: all); the cluster picture and totals stay whole."""
    if teams is None:
        return data
    keep = lambda rows: [r for r in rows if r.get("team") in teams]  # noqa: E731
    return {**data, "teams": keep(data["teams"]), "waiting": keep(data["waiting"]), "running": keep(data["running"])}


def chargeback(session, settings: Settings, since: float, until: float, policy: str | None = None,
               now: float | None = None, view_of=None) -> list[dict]:
    """view_of(settings): the cluster's pods and nodes (default: listed now)."""
    now = time.time() if now is None else now
    cfg = settings.config()
    if cfg is None:
        raise NotConfigured("[airflow_gpu] quota_config is not set: chargeback needs the price table "
                            "(AIRFLOW__AIRFLOW_GPU__QUOTA_CONFIG)")
    view = (view_of or _view)(settings)
    records = usage_records(cfg, list(view.pods.values()), view.nodes,
                            sources.read_xcom_results(session, since, until) if session is not None else [], now)
    rows = charge(records, prices_of(cfg), since, min(until, now), policy or settings.loss_policy,
                  cfg.product_speeds())
    return [r.as_dict() for r in rows]


def prices_of(cfg) -> dict[str, tuple[float, float]]:
    return {p.name: (p.price_per_gpu_hour.on_demand, p.price_per_gpu_hour.spot) for p in cfg.products}


def usage_records(cfg, pods: list[dict], nodes: dict, xcom_results: list[dict], now: float):
    """A pod is billed to its namespace's team, as the scheduler counts it on that team's quota
    (core.tiers.team_of_namespace); an `airflow-gpu.io/team` label moves nothing."""
    team_by_ns = {t.namespace: t.name for t in cfg.teams}
    aliases = cfg.node_label_aliases()

    def team_of(pod):
        return team_of_namespace((pod.get("metadata") or {}).get("namespace") or "", team_by_ns)

    records = ledger.usage_from_pods(pods, nodes, team_of, lambda label: aliases.get(label, label or "unknown"), now,
                                     cfg)
    covered = {ledger.try_key((p.get("metadata") or {}).get("labels") or {}) for p in pods} - {None}
    return records + ledger.usage_from_xcom(xcom_results, covered)


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()

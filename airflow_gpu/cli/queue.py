"""`airflow-gpu queue` and `airflow-gpu report chargeback`: the plugin's views in a terminal.

With --api-url they ask a running api-server's plugin (the same JSON the page reads, the same
auth); without it they read the local Airflow database and the [airflow_gpu] kubeconfig
(--kubeconfig / --config override). Exit codes: 0 done, 2 bad input, 1 the source failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime

from airflow_gpu import constants as C

URL_PREFIX = "/airflow-gpu"  # airflow_gpu.plugin.URL_PREFIX


def _source_args(p) -> None:
    p.add_argument("--api-url", help="an Airflow api-server with the airflow-gpu plugin (else the local DB)")
    p.add_argument("--token-file", help=f"file holding the bearer token for --api-url (else ${C.ENV_API_TOKEN})")
    p.add_argument("--username", default=os.environ.get(C.ENV_API_USERNAME), help="user for --api-url")
    p.add_argument("--password-file", help=f"file holding the password for --username (else ${C.ENV_API_PASSWORD})")
    p.add_argument("--kubeconfig", help="local mode: the cluster (default [airflow_gpu] kubeconfig)")
    p.add_argument("--config", help="local mode: quota config (default [airflow_gpu] quota_config)")


def register(subparsers) -> None:
    q = subparsers.add_parser("queue", help="the GPU queue: team pools, waiting tasks with reasons, running gangs")
    q.add_argument("--json", action="store_true", help="print JSON instead of tables")
    q.add_argument("--team", help="only this team's rows")
    _source_args(q)
    q.set_defaults(func=_queue)
    report = subparsers.add_parser("report", help="reports").add_subparsers(dest="report", required=True)
    cb = report.add_parser("chargeback", help="GPU-hours and cost per team, product and capacity type")
    cb.add_argument("--since", required=True, help="ISO date/time, e.g. 2026-12-01")
    cb.add_argument("--until", help="ISO date/time (default now)")
    cb.add_argument("--format", choices=("table", "csv", "json"), default="table")
    cb.add_argument("--policy", choices=("platform", "spot", "on-demand"), help="who pays for lost GPU-hours")
    cb.add_argument("--team")
    _source_args(cb)
    cb.set_defaults(func=_chargeback)


def _epoch(value: str, flag: str) -> float:
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise SystemExit(f"{flag}: not an ISO date or time (got {value!r}); e.g. 2026-12-01T08:00:00+00:00")


def _remote(args, path: str, params: dict) -> object:
    from airflow_gpu.airflow_api import AirflowApi
    from airflow_gpu.cli.secrets import read_secret

    token = read_secret(args.token_file, C.ENV_API_TOKEN, "--token-file")
    password = read_secret(args.password_file, C.ENV_API_PASSWORD, "--password-file")
    if not (token or (args.username and password)):
        raise SystemExit(f"--api-url needs --token-file (or ${C.ENV_API_TOKEN}), or --username and --password-file")
    with AirflowApi(args.api_url, token=token, username=args.username, password=password) as api:
        return api.request("GET", URL_PREFIX + path, params={k: v for k, v in params.items() if v is not None})


def _local_settings(args):
    from airflow_gpu.ui.service import Settings

    s = Settings.from_airflow()
    s.kubeconfig = args.kubeconfig or s.kubeconfig
    s.quota_config = args.config or s.quota_config
    return s


def _queue(args) -> int:
    from airflow_gpu.airflow_api import AirflowApiError
    from airflow_gpu.ui.service import NotConfigured

    try:
        if args.api_url:
            data = _remote(args, "/api/queue", {"team": args.team})
        else:
            from airflow.utils.session import create_session

            from airflow_gpu.ui.service import build_queue, visible

            with create_session() as session:
                data = build_queue(session, _local_settings(args))
            data = visible(data, {args.team} if args.team else None)
    except (AirflowApiError, NotConfigured) as exc:
        print(f"queue: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        print_queue(data)
    return 0


def print_queue(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text  # reasons may hold [brackets]: never markup

    console = Console(width=200)
    for warning in data.get("warnings") or []:
        console.print(Text(f"warning: {warning}", style="bold yellow"))
    at = data.get("published_at")
    console.print(Text("the scheduler has published no queue" if at is None else
                       f"published by the scheduler at {datetime.fromtimestamp(at).isoformat(timespec='seconds')} "
                       f"(cycle {data.get('cycle')}, {data.get('profile')})" + (" - STALE" if data.get("stale") else "")))
    t = Table(title="Team pools")
    for col in ("team", "pool", "slots (GPUs)", "occupied", "deferred", "queued"):
        t.add_column(col)
    for r in data["teams"]:
        t.add_row(r["team"], r["pool"], f"{r['slots']} ({r['gpus']:.1f})", str(r["occupied"]), str(r["deferred"]),
                  str(r["queued"]))
    console.print(t)
    now = data.get("generated_at") or time.time()
    w = Table(title="Waiting")
    for col in ("#", "team #", "task", "team", "tier", "GPUs", "waiting s", "reason", "est. start"):
        w.add_column(col)
    for r in data["waiting"]:
        est = (r.get("estimate_note") or "") if r["estimated_start"] is None else f"in {max(0, r['estimated_start'] - now):.0f} s"
        if r["estimated_start"] is not None and r.get("estimate_error") is not None:
            est += f" ± {r['estimate_error']:.0f} s"
        if r.get("expected_products"):  # the product of the nodes the scheduler expects it to start on
            est += f" on {', '.join(r['expected_products'])}"
        task = f"{r['dag_id']}.{r['task_id']}" if r["dag_id"] else r["gang"]
        waited = str(r["waiting_seconds"])
        if r.get("due_at") is not None:  # its tier's wait bound: newer work goes ahead of it until then
            left = r["due_at"] - now
            waited += " (keeps its place)" if left <= 0 else f" (keeps its place in {left:.0f} s)"
        w.add_row(*map(Text, (str(r["cluster_position"]), str(r["position"]), task, r["team"], r["tier"],
                              str(r["gpus"]), waited, r["reason"], est)))
    console.print(w)
    run = Table(title="Running")
    for col in ("task", "team", "pods", "since checkpoint s", "interruptions", "preemptions"):
        run.add_column(col)
    for r in data["running"]:
        pods = ", ".join(f"{p['name']}@{p['node']} ({p['capacity_type']})" for p in r["pods"])
        run.add_row(*map(Text, (f"{r['dag_id']}.{r['task_id']}" if r["dag_id"] else r["gang"], r["team"], pods,
                                str(r["last_checkpoint_age_seconds"] or ""), str(r["interruptions"]),
                                str(r.get("preemptions", 0)))))
    console.print(run)
    c = data["cluster"]
    console.print(f"cluster: {c['gpus_total']} GPUs on {len(c['nodes'])} nodes, allocation "
                  f"{100 * c['allocation_ratio']:.1f} %, fragmentation (FGD) {100 * c['fragmentation']:.1f} %")


def _chargeback(args) -> int:
    from airflow_gpu.airflow_api import AirflowApiError
    from airflow_gpu.ui.service import NotConfigured
    from airflow_gpu.ui.service import CSV_FIELDS, chargeback, to_csv

    since = _epoch(args.since, "--since")
    until = _epoch(args.until, "--until") if args.until else time.time()
    try:
        if args.api_url:
            rows = _remote(args, "/api/chargeback", {"since": args.since, "until": args.until, "policy": args.policy,
                                                      "team": args.team})["rows"]
        else:
            from airflow.utils.session import create_session

            with create_session() as session:
                rows = chargeback(session, _local_settings(args), since, until, args.policy)
            rows = [r for r in rows if not args.team or r["team"] == args.team]
    except (AirflowApiError, NotConfigured) as exc:
        print(f"report chargeback: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps({"rows": rows}, indent=1))
    elif args.format == "csv":
        sys.stdout.write(to_csv(rows))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title="GPU chargeback")
        for col in CSV_FIELDS:
            t.add_column(col)
        for r in rows:
            t.add_row(*(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in CSV_FIELDS))
        Console().print(t)
    return 0

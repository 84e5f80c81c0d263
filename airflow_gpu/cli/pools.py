"""`airflow-gpu pools`: sync team GPU quotas into Airflow pools; render the Kubernetes side.

Exit codes: 0 done (or nothing to do); 2 bad input (invalid config, an unmanaged pool in the way, an
unknown Airflow team), nothing written; 1 the target Airflow failed.
"""

from __future__ import annotations

import os
import sys

from airflow_gpu import constants as C

EXIT_BAD_INPUT = 2
EXIT_BACKEND = 1


def register(subparsers) -> None:
    parser = subparsers.add_parser("pools", help="team GPU quotas -> Airflow pools and Kubernetes quotas")
    sub = parser.add_subparsers(dest="pools_command", required=True, metavar="SUBCOMMAND")

    sync = sub.add_parser("sync", help="create/update/delete the managed Airflow pools to match the config",
                          allow_abbrev=False)
    sync.add_argument("--config", required=True, help="quota configuration YAML")
    sync.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    sync.add_argument("--api-url", help="a remote Airflow's API server (REST v2) instead of the local database")
    sync.add_argument("--token-file", help=f"file holding the bearer token for --api-url (else ${C.ENV_API_TOKEN})")
    sync.add_argument("--username", default=os.environ.get(C.ENV_API_USERNAME),
                      help=f"user for --api-url, exchanged for a token (env {C.ENV_API_USERNAME})")
    sync.add_argument("--password-file", help=f"file holding the password for --username (else ${C.ENV_API_PASSWORD})")
    sync.add_argument("--multi-team", choices=("auto", "on", "off"), default="auto",
                      help="set pools' team_name; auto asks the target Airflow ([core] multi_team)")
    sync.set_defaults(func=_sync)

    render = sub.add_parser("render-k8s", help="print Namespaces, ResourceQuotas and PriorityClasses as YAML")
    render.add_argument("--config", required=True, help="quota configuration YAML")
    render.set_defaults(func=_render_k8s)


def _load(path: str):
    from airflow_gpu.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return None


def _sync(args) -> int:
    cfg = _load(args.config)
    if cfg is None:
        return EXIT_BAD_INPUT
    from airflow_gpu.cli.secrets import SecretError, read_secret

    try:
        token = read_secret(args.token_file, C.ENV_API_TOKEN, "--token-file")
        password = read_secret(args.password_file, C.ENV_API_PASSWORD, "--password-file")
    except SecretError as exc:
        print(f"pools sync: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.api_url and not (token or (args.username and password)):
        print(f"pools sync: --api-url needs --token-file (or ${C.ENV_API_TOKEN}), or --username and "
              f"--password-file (or ${C.ENV_API_PASSWORD})", file=sys.stderr)
        return EXIT_BAD_INPUT

    from airflow_gpu.airflow_api import AirflowApiError
    from airflow_gpu.pools.backends import PoolBackendError
    from airflow_gpu.pools.sync import PoolConflict, format_plan, sync_pools

    multi_team = {"auto": None, "on": True, "off": False}[args.multi_team]
    try:
        if args.api_url:
            from airflow_gpu.pools.backends import RestBackend

            backend = RestBackend(args.api_url, token=token, username=args.username,
                                  password=password, multi_team=multi_team)
        else:
            from airflow_gpu.pools.backends import DatabaseBackend

            backend = DatabaseBackend(multi_team=multi_team)
        mode = "dry run" if args.dry_run else "sync"
        print(f"pools {mode}: {args.config} -> {backend.describe()} "
              f"(multi_team {'on' if backend.multi_team() else 'off'})")
        plan = sync_pools(cfg, backend, dry_run=args.dry_run)
    except PoolConflict as exc:
        print(f"pools sync: nothing written:\n{exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (AirflowApiError, PoolBackendError) as exc:
        print(f"pools sync failed: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    print(format_plan(plan, args.dry_run))
    return 0


def _render_k8s(args) -> int:
    cfg = _load(args.config)
    if cfg is None:
        return EXIT_BAD_INPUT
    from airflow_gpu.pools.k8s import render_k8s_yaml

    sys.stdout.write(render_k8s_yaml(cfg))
    return 0

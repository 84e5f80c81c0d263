"""`airflow-gpu dev up|down`: the local platform for your own DAGs (airflow_gpu.devtools.devplatform)."""

from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    from airflow_gpu.devtools.devplatform import DEFAULT_WORKDIR, SEED_CLUSTER, SEED_QUOTAS

    parser = subparsers.add_parser(
        "dev", help="a local platform (S3, cluster, GPU scheduler, Airflow) for your own DAGs",
        description="Everything on 127.0.0.1, started and stopped by PID.")
    sub = parser.add_subparsers(dest="dev_command", required=True, metavar="up|down")
    up = sub.add_parser("up", help="start it in the foreground; Ctrl-C, SIGTERM or `dev down` stops it all")
    up.add_argument("--dags", type=Path, required=True, help="your DAG folder")
    up.add_argument("--quotas", type=Path, default=SEED_QUOTAS, help="quota config (default: the seed's)")
    up.add_argument("--cluster", type=Path, default=SEED_CLUSTER, help="local cluster spec (default: the seed's)")
    up.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="state and logs (default: %(default)s)")
    up.set_defaults(func=_up)
    down = sub.add_parser("down", help="stop what `dev up` started, by PID")
    down.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    down.set_defaults(func=_down)


def _up(args) -> int:
    from airflow_gpu.devtools.devplatform import up

    return up(args.dags, args.workdir, args.quotas, args.cluster)


def _down(args) -> int:
    from airflow_gpu.devtools.devplatform import down

    return down(args.workdir)

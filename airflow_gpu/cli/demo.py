"""`airflow-gpu demo`: the seed scenario through Airflow on a local platform (airflow_gpu.demo)."""

from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="the seed scenario end to end through Airflow, on 127.0.0.1",
        description="SeaweedFS, the local GPU cluster, the GPU scheduler and Airflow, started and stopped by PID; "
                    "the example DAGs triggered through the REST API; a spot node interrupted mid-training.")
    parser.add_argument("--headless", action="store_true", help="plain log lines, no spinner (CI, tests)")
    parser.add_argument("--report", type=Path, help="write the outcome as JSON to this file")
    parser.add_argument("--keep-running", action="store_true",
                        help="leave everything running at the end (Ctrl-C stops it)")
    parser.add_argument("--workdir", type=Path, help="state and logs (default: a temp dir, removed after a success)")
    parser.set_defaults(func=_demo)


def _demo(args) -> int:
    from airflow_gpu.demo import run

    return run(args)

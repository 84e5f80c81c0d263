"""`airflow-gpu soak`: a chaos soak through Airflow on a local platform (airflow_gpu.soak)."""

from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "soak", help="checkpointed DAGs through Airflow under seeded faults, invariants checked",
        description="The demo's platform; the soak DAGs of examples/soak_dags run continuously while spot "
                    "interruptions, API-server restarts, S3 outages, kill -9 of the triggerer, Airflow's "
                    "scheduler and the GPU scheduler, and preemptions are injected at seeded times. Exit 1 on "
                    "any invariant violation or a fault kind never injected.")
    parser.add_argument("--minutes", type=float, default=15.0, help="soak time; faults and new runs stop after it "
                        "(default 15); running DAG runs then finish")
    parser.add_argument("--seed", type=int, default=0, help="the fault schedule's seed (printed)")
    parser.add_argument("--json", type=Path, help="write the counts, faults and violations as JSON to this file")
    parser.add_argument("--workdir", type=Path, help="state and logs (default: a temp dir, removed after a success)")
    parser.set_defaults(func=_soak)


def _soak(args) -> int:
    if args.minutes <= 0:
        raise SystemExit("airflow-gpu soak: --minutes must be > 0")
    from airflow_gpu.soak import run

    return run(args)

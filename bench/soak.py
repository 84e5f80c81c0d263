"""The chaos soak as a benchmark (issue 32): 15 minutes of checkpointed DAGs through real Airflow
under seeded faults, every kind several times; the numbers README.md shows.

    python -m bench soak                          # 15 minutes, seed 32
    BENCH_SOAK_MINUTES=5 BENCH_SOAK_SEED=7 python -m bench soak
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

BUILD = Path(__file__).resolve().parents[1] / "build" / "bench"  # the whole report: build/bench/soak.json


def main() -> None:
    from airflow_gpu.soak import run

    minutes = float(os.environ.get("BENCH_SOAK_MINUTES", "15"))
    seed = int(os.environ.get("BENCH_SOAK_SEED", "32"))
    report_path = BUILD / "soak.json"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.unlink(missing_ok=True)
    code = run(argparse.Namespace(minutes=minutes, seed=seed, json=report_path, workdir=None))
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    print(json.dumps({k: report.get(k) for k in ("minutes", "seed", "faults", "dag_runs", "dag_runs_by_state",
                                                  "attempts", "interruptions", "preemptions", "retries_spent",
                                                  "resumed_from_checkpoint", "peak_team_gpus",
                                                  "violations_by_kind", "soak_seconds", "load_average")}, indent=2))
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()

"""Pool manager: `airflow-gpu pools sync` of 1,000 teams against a fresh SQLite Airflow (target < 10 s).

Measured side by side in one run, each in a child process with its own AIRFLOW_HOME (Airflow reads its
configuration at import):
- the CLI end to end (process start and `import airflow` included): first sync (1,000 creates),
  a second sync (no change), every quota changed (1,000 updates), a dry run;
- inside one process, without the import: our sync (one transaction) against the naive loop that
  writes each pool in its own transaction (what a script calling Pool.create_or_update_pool or
  `airflow pools set` per team does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

TEAMS = 1000
SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"


def big_config(path: Path, teams: int, gpus: int) -> Path:
    data = yaml.safe_load(SEED.read_text())
    data.pop("capacity", None)
    data["teams"] = [{"name": f"team-{i:04d}", "namespace": f"team-{i:04d}", "quota": {"a100-80gb": gpus}}
                     for i in range(teams)]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"})
    return env


def _fresh_home(root: Path, name: str) -> Path:
    home = root / name
    home.mkdir()
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=_env(home), check=True,
                   capture_output=True)
    return home


def _timed_cli(home: Path, *args: str) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "airflow_gpu", *args], env=_env(home), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return elapsed, out.stdout.strip().splitlines()[-1]


def _worker(config: str) -> None:
    """In one process: time sync_pools against the per-pool-transaction loop, on two fresh DBs."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    from airflow_gpu.config import load_config
    from airflow_gpu.pools.backends import DatabaseBackend
    from airflow_gpu.pools.plan import desired_pools
    from airflow_gpu.pools.sync import sync_pools

    cfg = load_config(config)
    mode = os.environ["BENCH_MODE"]
    start = time.perf_counter()
    if mode == "ours":
        plan = sync_pools(cfg, DatabaseBackend())
        count = len(plan.changes)
    else:
        count = 0
        for pool in desired_pools(cfg, multi_team=False):
            with create_session() as session:
                Pool.create_or_update_pool(pool.name, pool.slots, pool.description, pool.include_deferred,
                                           session=session)
            count += 1
    print(json.dumps({"seconds": time.perf_counter() - start, "pools": count}))


def _timed_worker(home: Path, config: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.pools_sync", "--worker", str(config)],
                         env={**_env(home), "BENCH_MODE": mode}, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-pools-") as tmp:
        root = Path(tmp)
        config = big_config(root / "teams.yaml", TEAMS, 8)
        changed = big_config(root / "teams-changed.yaml", TEAMS, 6)
        home = _fresh_home(root, "cli")
        print(f"{TEAMS} teams x 1 product, SQLite, `airflow-gpu pools sync` end to end (CLI process):")
        for label, args in (
            ("dry run (1,000 creates listed)", ("--dry-run",)),
            ("first sync (1,000 creates)", ()),
            ("second sync (no change)", ()),
        ):
            seconds, last = _timed_cli(home, "pools", "sync", "--config", str(config), *args)
            print(f"  {label:38s} {seconds:6.2f} s   [{last}]")
        seconds, last = _timed_cli(home, "pools", "sync", "--config", str(changed))
        print(f"  {'every quota changed (1,000 updates)':38s} {seconds:6.2f} s   [{last}]")
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import airflow.models.pool"], env=_env(home), check=True)
        print(f"  {'of which: python + import airflow':38s} {time.perf_counter() - start:6.2f} s")

        ours = _timed_worker(_fresh_home(root, "ours"), config, "ours")
        naive = _timed_worker(_fresh_home(root, "naive"), config, "naive")
        print(f"Creating {TEAMS} pools in-process (import excluded):")
        print(f"  one transaction (pools sync)          {ours['seconds']:6.2f} s")
        print(f"  one transaction per pool (naive loop) {naive['seconds']:6.2f} s")
        print(f"  ratio naive / ours                    {naive['seconds'] / ours['seconds']:6.1f} x")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2])
    else:
        main()

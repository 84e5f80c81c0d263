"""`airflow-gpu pools sync` against a real, migrated Airflow database (SQLite and PostgreSQL):
dry run, create, no change, update one, delete one, unmanaged pools untouched, bad input exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from airflow_gpu import constants

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"
SEED_POOLS = ({f"gpu.{team}.guaranteed" for team in ("nlp", "vision", "recsys", "research", "serving")}
              | {f"gpu.{team}.preemptible" for team in ("nlp", "vision", "recsys", "research")})  # serving: no preemptible tier


def write_config(path: Path, mutate=None) -> Path:
    data = yaml.safe_load(SEED.read_text())
    if mutate:
        mutate(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sync(db, config: Path, *extra: str):
    return db.cli("pools", "sync", "--config", str(config), *extra)


def test_sync_lifecycle(airflow_db, tmp_path):
    """The acceptance sequence, on SQLite and on PostgreSQL."""
    config = write_config(tmp_path / "quotas.yaml")
    airflow_db.execute(
        "INSERT INTO slot_pool (pool, slots, description, include_deferred) VALUES "
        "('notebooks', 3, 'hand-made pool', false), ('gpu.legacy.guaranteed', 5, NULL, false)")
    before = airflow_db.pools()

    # --dry-run lists the creates and writes nothing
    out = sync(airflow_db, config, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"-> Airflow database {airflow_db.kind}" in out.stdout  # really this database
    creates = [line for line in out.stdout.splitlines() if line.strip().startswith("create ")]
    assert sorted(line.split()[1].rstrip(":") for line in creates) == sorted(SEED_POOLS)
    assert "create gpu.nlp.guaranteed: slots 56 (8 GPU)" in out.stdout
    assert "dry run, nothing written: 9 to create" in out.stdout
    assert airflow_db.pools() == before

    # without --dry-run it creates them: slots in 1/7 GPU, include_deferred, marked as managed
    out = sync(airflow_db, config)
    assert out.returncode == 0, out.stderr
    assert "applied: 9 to create, 0 to update, 0 to delete" in out.stdout
    pools = airflow_db.pools()
    assert set(pools) == set(before) | SEED_POOLS
    # 8 GPUs each; research's best-effort may also borrow 8 (that pool is the ceiling); recsys has 16 H100 too
    want = {"gpu.research.preemptible": 112, "gpu.recsys.guaranteed": 168, "gpu.recsys.preemptible": 168}
    for name in SEED_POOLS:
        assert pools[name]["slots"] == want.get(name, 56)
        assert pools[name]["include_deferred"] in (True, 1)
        assert pools[name]["description"].startswith(constants.POOL_DESCRIPTION_MARKER)
        assert pools[name]["team_name"] is None  # multi_team is off
    assert "22 x 1g.10gb, 2 x 3g.40gb" in pools["gpu.serving.guaranteed"]["description"]

    # a second run changes nothing and says so
    out = sync(airflow_db, config)
    assert out.returncode == 0, out.stderr
    assert "no changes: 9 managed pool(s) already match the config" in out.stdout
    assert airflow_db.pools() == pools

    # a changed quota updates only that pool
    def lower_vision(data):
        data["teams"][1]["quota"]["a100-80gb"] = 6
    write_config(config, lower_vision)
    out = sync(airflow_db, config)
    assert out.returncode == 0, out.stderr
    changed = [line.strip() for line in out.stdout.splitlines() if line.startswith("  ")]
    vision = ["gpu.vision.guaranteed", "gpu.vision.preemptible"]
    assert changed == [f"update {name}: slots 56 -> 42 (6 GPU), description" for name in vision]
    after = airflow_db.pools()
    assert [after[name]["slots"] for name in vision] == [42, 42]
    assert [after[name]["id"] for name in vision] == [pools[name]["id"] for name in vision]
    assert {k: v for k, v in after.items() if k not in vision} == {k: v for k, v in pools.items() if k not in vision}

    # a removed team deletes only its managed pool; unmanaged pools (even gpu.* ones) stay
    def lower_vision_drop_recsys(data):
        lower_vision(data)
        del data["teams"][2]
    write_config(config, lower_vision_drop_recsys)
    out = sync(airflow_db, config, "--dry-run")
    assert "delete gpu.recsys.guaranteed: slots 168 -> (deleted)" in out.stdout
    assert "delete gpu.recsys.preemptible: slots 168 -> (deleted)" in out.stdout
    assert airflow_db.pools() == after
    out = sync(airflow_db, config)
    assert out.returncode == 0, out.stderr
    final = airflow_db.pools()
    assert set(final) == set(after) - {"gpu.recsys.guaranteed", "gpu.recsys.preemptible"}
    assert final["notebooks"] == before["notebooks"] and final["gpu.legacy.guaranteed"] == before["gpu.legacy.guaranteed"]
    assert final["default_pool"] == before["default_pool"]


def test_unmanaged_pool_in_the_way_is_never_touched(sqlite_airflow_db, tmp_path):
    db = sqlite_airflow_db
    db.execute("INSERT INTO slot_pool (pool, slots, description, include_deferred) "
               "VALUES ('gpu.nlp.guaranteed', 2, 'made by hand', 0)")
    before = db.pools()
    out = sync(db, write_config(tmp_path / "q.yaml"))
    assert out.returncode == 2
    assert "pool 'gpu.nlp.guaranteed' exists but is not managed by airflow-gpu" in out.stderr
    assert "nothing written" in out.stderr
    assert db.pools() == before  # not even the four pools without a conflict were created


def test_multi_team_sets_team_name(sqlite_airflow_db, tmp_path):
    db = sqlite_airflow_db
    env = db.env(AIRFLOW__CORE__MULTI_TEAM="True")
    config = write_config(tmp_path / "q.yaml", lambda d: d.update(teams=d["teams"][:2]))
    out = db.cli("pools", "sync", "--config", str(config), env=env)
    assert out.returncode == 2
    assert "Airflow team 'nlp' does not exist" in out.stderr and "airflow teams create nlp" in out.stderr
    assert set(db.pools()) == {"default_pool"}
    for team in ("nlp", "vision"):
        db.airflow("teams", "create", team, env=env)
    out = db.cli("pools", "sync", "--config", str(config), env=env)
    assert out.returncode == 0, out.stderr
    pools = db.pools()
    assert {name: pool["team_name"] for name, pool in pools.items() if name != "default_pool"} == {
        "gpu.nlp.guaranteed": "nlp", "gpu.nlp.preemptible": "nlp",
        "gpu.vision.guaranteed": "vision", "gpu.vision.preemptible": "vision"}


BAD = {
    "fractional": (lambda d: d["teams"][2]["quota"].update({"a100-80gb": 2.5}), "teams[2].quota.a100-80gb: must be a whole number"),
    "negative": (lambda d: d["teams"][2]["quota"].update({"a100-80gb": -1}), "teams[2].quota.a100-80gb: must be >= 0"),
    "unknown key": (lambda d: d["teams"][0].update({"gpus": 8}), "teams[0].gpus: unknown key 'gpus'; allowed keys:"),
    "duplicate team": (lambda d: d["teams"][1].update({"name": "nlp"}), "teams[1].name: duplicate team name 'nlp'"),
    "unknown product": (lambda d: d["teams"][1]["quota"].update({"b200": 1}), "teams[1].quota.b200: unknown GPU product"),
    "unknown tier": (lambda d: d["teams"][0].update({"tiers": ["gold"]}), "teams[0].tiers[0]: unknown tier 'gold'"),
    "above capacity": (lambda d: d.update({"capacity": {"a100-80gb": 16}}), "capacity.a100-80gb: the teams' guaranteed quotas sum to 40 GPUs"),
}


def test_bad_configs_exit_2_and_change_nothing(sqlite_airflow_db, tmp_path):
    db = sqlite_airflow_db
    good = write_config(tmp_path / "good.yaml")
    assert sync(db, good).returncode == 0
    before = db.pools()
    for case, (mutate, message) in BAD.items():
        bad = write_config(tmp_path / f"{case.replace(' ', '-')}.yaml", mutate)
        out = sync(db, bad)
        assert out.returncode == 2, (case, out.stdout, out.stderr)
        assert f"{bad}: {message}" in out.stderr, (case, out.stderr)
        assert db.pools() == before, case
    out = db.cli("pools", "render-k8s", "--config", str(tmp_path / "negative.yaml"))
    assert out.returncode == 2 and "teams[2].quota.a100-80gb" in out.stderr and not out.stdout


def test_fresh_airflow_home_dry_run_lists_creates_and_sync_needs_migrate(tmp_path):
    from fixtures.airflow_env import AirflowDb

    db = AirflowDb("sqlite", f"sqlite:///{tmp_path / 'airflow.db'}", tmp_path)
    config = write_config(tmp_path / "q.yaml")
    out = sync(db, config, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "dry run, nothing written: 9 to create" in out.stdout and "run `airflow db migrate` first" in out.stdout
    out = sync(db, config)
    assert out.returncode == 1
    assert "has no Airflow schema; run `airflow db migrate` first" in out.stderr


RACE_SCRIPT = """
import sys
from airflow_gpu.config import load_config
from airflow_gpu.pools.backends import DatabaseBackend, PoolBackendError
from airflow_gpu.pools.sync import plan_sync

backend = DatabaseBackend()
plan = plan_sync(load_config(sys.argv[1]), backend)
# someone creates an unmanaged pool with a wanted name between plan and apply
from airflow.models.pool import Pool
Pool.create_or_update_pool("gpu.nlp.guaranteed", 1, "by hand", False)
try:
    backend.apply(plan.changes)
except PoolBackendError as exc:
    print("refused:", exc)
"""


def test_pool_created_between_plan_and_apply_is_not_overwritten(sqlite_airflow_db, tmp_path):
    db = sqlite_airflow_db
    out = subprocess.run([sys.executable, "-c", RACE_SCRIPT, str(write_config(tmp_path / "q.yaml"))],
                         env=db.env(), capture_output=True, text=True, timeout=120)
    assert "refused: pool 'gpu.nlp.guaranteed' changed while the sync was planned" in out.stdout, out.stderr
    pools = db.pools()
    assert set(pools) == {"default_pool", "gpu.nlp.guaranteed"}  # the transaction wrote nothing
    assert (pools["gpu.nlp.guaranteed"]["slots"], pools["gpu.nlp.guaranteed"]["description"]) == (1, "by hand")


def test_migration_from_per_product_pools(sqlite_airflow_db, tmp_path):
    """Pools of the earlier per-product layout (gpu.<team>.<product>) are replaced by the per-tier-class
    pools in one transaction; the dry run shows it and writes nothing."""
    db = sqlite_airflow_db
    marker = constants.POOL_DESCRIPTION_MARKER
    db.execute("INSERT INTO slot_pool (pool, slots, description, include_deferred) VALUES "
               f"('gpu.nlp.a100-80gb', 56, '{marker} team=nlp product=a100-80gb: quota 8 GPU', 1), "
               f"('gpu.serving.a100-80gb', 56, '{marker} team=serving product=a100-80gb: quota 4 GPU', 1)")
    before = db.pools()
    config = write_config(tmp_path / "q.yaml", lambda d: d.update(teams=[d["teams"][0], d["teams"][4]]))
    out = sync(db, config, "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = [line.strip() for line in out.stdout.splitlines() if line.startswith("  ")]
    assert lines == [
        "create gpu.nlp.guaranteed: slots 56 (8 GPU)",
        "create gpu.nlp.preemptible: slots 56 (8 GPU)",
        "create gpu.serving.guaranteed: slots 56 (8 GPU)",
        "delete gpu.nlp.a100-80gb: slots 56 -> (deleted) (replaced by gpu.nlp.guaranteed, gpu.nlp.preemptible)",
        "delete gpu.serving.a100-80gb: slots 56 -> (deleted) (replaced by gpu.serving.guaranteed)",
    ]
    assert db.pools() == before
    out = sync(db, config)
    assert out.returncode == 0 and "applied: 3 to create, 0 to update, 2 to delete" in out.stdout, out.stdout + out.stderr
    assert set(db.pools()) == {"default_pool", "gpu.nlp.guaranteed", "gpu.nlp.preemptible", "gpu.serving.guaranteed"}


def test_pool_still_in_use_is_retired_then_deleted():
    """A managed pool no longer wanted but used by task instances keeps its slots (a task in a missing pool
    is never scheduled), is marked retired once, and is deleted by the first sync after it empties."""
    from airflow_gpu.config import load_config
    from airflow_gpu.pools.plan import PoolState, desired_pools, diff

    cfg = load_config(SEED)
    desired = desired_pools(cfg, multi_team=False)
    old = PoolState("gpu.nlp.a100-80gb", 56, f"{constants.POOL_DESCRIPTION_MARKER} team=nlp product=a100-80gb", True,
                    in_use=21)
    plan = diff(desired, desired + [old])
    (change,) = plan.changes
    assert change.action == "retire" and change.new.slots == 56 and change.new.include_deferred
    assert change.describe() == ("retire gpu.nlp.a100-80gb: 21 of 56 slots still in use, kept with its slots until no "
                                 "task uses it, then deleted by a later sync (replaced by gpu.nlp.guaranteed, "
                                 "gpu.nlp.preemptible)")
    retired = PoolState(**{**change.new.__dict__, "in_use": 7})
    assert retired.retired and retired.managed
    again = diff(desired, desired + [retired])
    assert again.changes == [] and "gpu.nlp.a100-80gb" in again.unchanged
    assert any("still has 7 slot(s) in use" in note for note in again.notes)
    empty = PoolState(**{**change.new.__dict__, "in_use": 0})
    (delete,) = diff(desired, desired + [empty]).changes
    assert (delete.action, delete.name) == ("delete", "gpu.nlp.a100-80gb")

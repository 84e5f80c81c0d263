"""Any cluster's job history as the replay's input: the generic job CSV, and the rules that map its
teams and tiers onto a quota file's.

One row per job (docs/replay-traces.md is the reference; the exporters in sim/export.py write it):

    job, submit_time, duration                 required: a unique name; seconds (any origin >= 0);
                                               seconds of work on the reference product (> 0)
    workers                                    optional, default 1: pods that run together (a gang)
    gpus_per_worker | gpu_milli                one of the two: whole GPUs per worker, or a share of
                                               one GPU in thousandths (1..1000; 1000 = one GPU)
    cpu_milli, memory_mib                      optional, default 0: per worker
    team, tier                                 optional: mapped by `map_jobs` (empty: see there)
    products                                   optional: GPU models accepted, `|`-separated (node model)
    checkpointable                             optional: true/false/yes/no/1/0, default false
    checkpoint_interval                        optional: seconds between periodic checkpoints
                                               (default 1800 when checkpointable, else 0)

The loader returns `Job`s (sim/workload.py, the replay's one job shape) carrying the trace's own team
and tier; `map_jobs` turns those into the quota file's. The openb loader is the other adapter to the
same shape (workload.openb_jobs).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from airflow_gpu.constants import TIER_BEST_EFFORT_TRAINING, TIER_PRODUCTION_TRAINING
from airflow_gpu.core.model import GPU_MILLI, Node, PodRequest
from airflow_gpu.core.tiers import TierPolicy, tier_of_priority_class
from airflow_gpu.sim.traces import TracePod, TraceError, _integer, _rows, _unique_name
from airflow_gpu.sim.workload import Job

JOB_COLUMNS = ("job", "submit_time", "duration")
OPTIONAL_COLUMNS = ("workers", "gpus_per_worker", "gpu_milli", "cpu_milli", "memory_mib", "team", "tier", "products",
                    "checkpointable", "checkpoint_interval")
DEFAULT_CHECKPOINT_INTERVAL = 1800.0  # as openb_jobs: a checkpointable job saves every 30 min
ANY = "*"  # the --team-map / --tier-map key for every name no other entry maps
_TRUE, _FALSE = ("true", "yes", "1", "y", "t"), ("false", "no", "0", "n", "f", "")


def _cell(row, column) -> str:
    return (row.get(column) or "").strip()


def _number(path, line, row, column, *, integer=False, default=None, minimum=0.0, above=False):
    raw = _cell(row, column)
    if raw == "" and default is not None:
        return default
    try:
        value = _integer(raw) if integer else float(raw)
    except (ValueError, OverflowError):
        kind = "an integer" if integer else "a number (seconds)"
        raise TraceError(f"{path}:{line}: column {column} must be {kind}, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum or (above and value <= minimum):
        bound = f"> {minimum:g}" if above else f">= {minimum:g}"
        raise TraceError(f"{path}:{line}: column {column} must be {bound}, got {raw!r}")
    return value


def _gpu_ask(path, line, row) -> tuple[int, int]:
    """(whole GPUs, share milli) of one worker: exactly one of gpus_per_worker and gpu_milli."""
    whole, share = _cell(row, "gpus_per_worker"), _cell(row, "gpu_milli")
    if whole and share:
        raise TraceError(f"{path}:{line}: columns gpus_per_worker and gpu_milli are both set; give one "
                         "(gpus_per_worker: whole GPUs, gpu_milli: a share of one GPU)")
    if whole:
        return _number(path, line, row, "gpus_per_worker", integer=True, minimum=1), 0
    if share:
        milli = _number(path, line, row, "gpu_milli", integer=True, minimum=1)
        if milli > GPU_MILLI:
            raise TraceError(f"{path}:{line}: column gpu_milli must be 1..{GPU_MILLI} (a share of one GPU), got "
                             f"{milli}; use gpus_per_worker for whole GPUs")
        return (1, 0) if milli == GPU_MILLI else (0, milli)
    raise TraceError(f"{path}:{line}: no GPU ask: set gpus_per_worker (whole GPUs per worker) or gpu_milli "
                     f"(a share of one GPU, 1..{GPU_MILLI})")


def _flag(path, line, row, column) -> bool:
    raw = _cell(row, column).lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise TraceError(f"{path}:{line}: column {column} must be true or false (or yes/no, 1/0), got {raw!r}")


def load_jobs(path) -> list[Job]:
    """The generic job CSV -> jobs with the trace's own team and tier (map_jobs maps them)."""
    jobs: list[Job] = []
    seen: dict[str, int] = {}
    for line, row in _rows(path, JOB_COLUMNS, JOB_COLUMNS + OPTIONAL_COLUMNS):
        name = _unique_name(path, line, row, "job", "job", seen)
        gpus, milli = _gpu_ask(path, line, row)
        checkpointable = _flag(path, line, row, "checkpointable")
        interval = _number(path, line, row, "checkpoint_interval",
                           default=DEFAULT_CHECKPOINT_INTERVAL if checkpointable else 0.0)
        worker = PodRequest(name, cpu_milli=_number(path, line, row, "cpu_milli", integer=True, default=0),
                            memory_mib=_number(path, line, row, "memory_mib", integer=True, default=0),
                            gpus=gpus, gpu_milli=milli,
                            gpu_products=tuple(p.strip() for p in _cell(row, "products").split("|") if p.strip()))
        jobs.append(Job(name, _cell(row, "team"), _cell(row, "tier"), worker,
                        _number(path, line, row, "workers", integer=True, default=1, minimum=1),
                        _number(path, line, row, "submit_time"), _number(path, line, row, "duration", above=True),
                        checkpointable=checkpointable, checkpoint_interval=interval if checkpointable else 0.0))
    if not jobs:
        raise TraceError(f"{path}: no jobs")
    return jobs


def from_zero(jobs: Sequence[Job]) -> tuple[list[Job], float]:
    """The jobs with their submit times counted from the first submission, and that origin: a trace
    in epoch seconds replays the same as one from 0 (the horizon and the plots start at the first job)."""
    origin = min((j.submit for j in jobs), default=0.0)
    return ([replace(j, submit=j.submit - origin) for j in jobs] if origin else list(jobs)), origin


# --- teams and tiers ----------------------------------------------------------------------------


def parse_map(text: str | None, option: str) -> dict[str, str]:
    """'a=nlp,b=vision,*=research' -> {'a': 'nlp', 'b': 'vision', '*': 'research'}."""
    out: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in (text or "").split(","))):
        key, sep, value = entry.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{option}: {entry!r} is not FROM=TO (e.g. {option} 'ml-team=nlp,*=research')")
        out[key.strip()] = value.strip()
    return out


def hashed(name: str, seed: int, names: Sequence[str]) -> str:
    """The documented, seeded spread rule: CRC32 of '<seed>:<name>' modulo the number of names."""
    return names[zlib.crc32(f"{seed}:{name}".encode()) % len(names)]


def default_tier(tiers: Mapping[str, TierPolicy]) -> str:
    """Where work of an unknown tier goes: the lowest-priority preemptible tier (the tier idle quota
    is borrowed at: it never displaces declared work), else the lowest-priority tier."""
    preemptible = [n for n, p in tiers.items() if p.preemptible] or list(tiers)
    return min(preemptible, key=lambda n: (tiers[n].priority, n))


@dataclass(frozen=True)
class Mapped:
    jobs: list[Job]
    teams: dict[str, str]  # trace team ('' = none) -> quota file team, as applied
    tiers: dict[str, str]  # trace tier -> quota file tier
    # the trace's names only a fallback rule placed (the seeded spread, the default tier): said before a replay
    guessed_teams: frozenset[str] = frozenset()
    guessed_tiers: frozenset[str] = frozenset()
    origin: float = 0.0  # the trace's first submit_time: the replay's 0 (from_zero)
    # node models the quota file has no product for: priced as its first product, speed 1.0
    unknown_models: frozenset[str] = frozenset()
    # (team, tier) pairs the quota file does not let the team submit -> jobs (they run all the same)
    disallowed: dict[tuple[str, str], int] = field(default_factory=dict)


def map_jobs(jobs: Sequence[Job], teams: Sequence[str], tiers: Mapping[str, TierPolicy] | None, seed: int,
             team_map: Mapping[str, str] | None = None, tier_map: Mapping[str, str] | None = None,
             namespaces: Mapping[str, str] | None = None) -> Mapped:
    """The trace's teams and tiers -> the quota file's, first rule that applies:

    team: --team-map's entry for it; a quota file team of that name; the team whose namespace it
    names (`namespaces`: namespace -> team; Kueue exports carry namespaces); --team-map's '*';
    else spread by `hashed` over `teams` (by the trace team, or the job's name when the row has none:
    one trace team stays one team).
    tier: --tier-map's entry; a tier of that name; a PriorityClass `airflow-gpu-<tier>`; --tier-map's
    '*'; else `default_tier`. `tiers` None: tier names are taken as mapped (not checked).
    Jobs come back sorted by (submit, name)."""
    team_map, tier_map, namespaces = dict(team_map or {}), dict(tier_map or {}), dict(namespaces or {})
    for option, mapping, known in (("--team-map", team_map, teams), ("--tier-map", tier_map, tiers)):
        bad = sorted({v for v in mapping.values() if known is not None and v not in known})
        if bad:
            raise ValueError(f"{option}: {', '.join(bad)} not in the quota file (choose from "
                             f"{', '.join(sorted(known))})")
    team_of: dict[str, str] = {}
    tier_of: dict[str, str] = {}
    guessed_teams: set[str] = set()
    guessed_tiers: set[str] = set()

    def team(job: Job) -> str:
        key = job.team
        if key not in team_of or not key:
            if key in team_map:
                found = team_map[key]
            elif key in teams:
                found = key
            elif key in namespaces:
                found = namespaces[key]
            elif ANY in team_map:
                found = team_map[ANY]
            else:
                found = hashed(key or job.name, seed, teams)
                guessed_teams.add(key)
            if not key:
                return found
            team_of[key] = found
        return team_of[key]

    def tier(job: Job) -> str:
        key = job.tier
        if key not in tier_of:
            if key in tier_map:
                found = tier_map[key]
            elif tiers is None or key in tiers:
                found = key
            elif tier_of_priority_class(key) in tiers:
                found = tier_of_priority_class(key)
            elif ANY in tier_map:
                found = tier_map[ANY]
            else:
                found = default_tier(tiers)
                guessed_tiers.add(key)
            tier_of[key] = found
        return tier_of[key]

    out = []
    for j in jobs:
        t, r = team(j), tier(j)
        out.append(j if (t, r) == (j.team, j.tier) else replace(j, team=t, tier=r))
    unnamed = sum(1 for j in jobs if not j.team)
    if unnamed:
        team_of[""] = f"{unnamed} job{'s' if unnamed != 1 else ''} spread over {len(teams)} teams"
    return Mapped(sorted(out, key=lambda j: (j.submit, j.name)), team_of, tier_of, frozenset(guessed_teams),
                  frozenset(guessed_tiers))


def check_products(jobs: Sequence[Job], models: set[str], path) -> None:
    """A job accepting only GPU models the node list lacks would wait forever: most likely the two
    files name the models differently, so say so instead of replaying it."""
    for j in jobs:
        wanted = j.worker.gpu_products
        if wanted and not set(wanted) & models:
            raise TraceError(f"{path}: job {j.name}: column products names {'|'.join(wanted)}, no model of the node "
                             f"list ({', '.join(sorted(models))}); use the node list's model names or leave it empty")


def team_shares(quota_gpus: Mapping[str, float], cluster_gpus: float) -> dict[str, float]:
    """Each quota file team's guaranteed share of every product's GPUs: its whole-GPU quota (summed
    over products) / max(the cluster's GPUs, the sum of all teams' quotas). The file's guarantees as
    written when the cluster is at least as large as they add up to (the rest is idle quota anyone
    may borrow), scaled down in proportion when it is smaller. A file without quotas: equal shares."""
    total = sum(quota_gpus.values())
    if total <= 0:
        return {t: 1.0 / len(quota_gpus) for t in quota_gpus}
    return {t: q / max(cluster_gpus, total) for t, q in quota_gpus.items()}


# --- the openb pod list: the other adapter ------------------------------------------------------

QOS_TIER = {"LS": TIER_PRODUCTION_TRAINING, "Guaranteed": TIER_PRODUCTION_TRAINING,
            "BE": TIER_BEST_EFFORT_TRAINING, "Burstable": TIER_BEST_EFFORT_TRAINING}
OPENB_TEAMS = ("team-a", "team-b", "team-c", "team-d")


def openb_jobs(pods: list[TracePod], seed: int, checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
               skipped: Counter | None = None, node_gpus: Mapping[str, int] | None = None) -> list[Job]:
    """Trace pods -> jobs. Rules: qos is the tier, mapped by QOS_TIER (LS/Guaranteed ->
    production-training, BE/Burstable -> best-effort-training; other qos left out); no team: spread
    over OPENB_TEAMS by `hashed` pod name; num_gpu = N > 1 -> one pod of N GPUs on one node, as the
    trace ran it, or, wider than every node it accepts (`node_gpus`), a gang of node-sized workers
    (worker_gpus; the pod's CPU and memory split evenly); gpu_milli < 1000 -> a share of one GPU;
    work = deletion - scheduled time (pods the trace never scheduled, or without GPUs, are left out);
    every job checkpoints every `checkpoint_interval` s. Submit = creation time. `node_gpus`: the
    node list's GPUs per node, most per GPU model (node_gpus_by_product; None: no pod is split).
    `skipped`: pods left out, by why."""
    skipped = Counter() if skipped is None else skipped
    jobs = []
    for p in pods:
        r = p.request
        if r.gpu_milli_total == 0:
            skipped["without a GPU"] += 1
        elif p.creation_time is None or p.deletion_time is None:
            skipped["without creation_time and deletion_time"] += 1
        elif p.qos not in QOS_TIER:
            skipped[f"of qos {p.qos or '(none)'} (not {', '.join(QOS_TIER)})"] += 1
        elif p.scheduled_time is None:
            skipped["the trace never scheduled (no scheduled_time)"] += 1
        else:
            jobs.append(_openb_job(p, checkpoint_interval, node_gpus))
    return map_jobs(jobs, OPENB_TEAMS, None, seed, tier_map=QOS_TIER).jobs


def node_gpus_by_product(nodes: Sequence[Node]) -> dict[str, int]:
    """GPU model -> the most GPUs one node of that model has (what openb_jobs splits wider pods by)."""
    out: dict[str, int] = {}
    for n in nodes:
        if n.gpu_count:
            out[n.gpu_product or ""] = max(out.get(n.gpu_product or "", 0), n.gpu_count)
    return out


def worker_gpus(request: PodRequest, node_gpus: Mapping[str, int] | None) -> int:
    """GPUs per worker of an openb pod of `request.gpus` whole GPUs: all of them (one pod on one node,
    as the trace ran it) when a node of a model it accepts has that many; else the largest divisor
    such a node holds (128 on 8-GPU nodes: 16 workers of 8; 12: 2 of 6; a prime wider than the
    node: one-GPU workers). Without nodes of a model it accepts, unsplit (the replay leaves it out
    as a job that never fits)."""
    gpus = request.gpus
    if node_gpus is None:
        return gpus
    accepted = [c for product, c in node_gpus.items() if not request.gpu_products or product in request.gpu_products]
    widest = max(accepted, default=gpus)
    return max(d for d in range(1, min(gpus, widest) + 1) if gpus % d == 0)


def _openb_job(p: TracePod, checkpoint_interval: float, node_gpus: Mapping[str, int] | None) -> Job:
    r = p.request
    work = max(1.0, float(p.deletion_time - p.scheduled_time))
    workers = r.gpus // worker_gpus(r, node_gpus) if r.gpus > 1 else 1
    worker = r if workers == 1 else replace(r, gpus=r.gpus // workers, cpu_milli=r.cpu_milli // workers,
                                            memory_mib=r.memory_mib // workers)
    return Job(r.name, "", p.qos, worker, workers, float(p.creation_time), work,
               checkpointable=True, checkpoint_interval=checkpoint_interval)
